import FileCoordination
import CFileCoordinationTLS

/// A TLS context for the etcd space's connections: the CA to trust, and the client's
/// certificate and key when etcd asks for one. OpenSSL is loaded when the first is made.
final class EtcdTLS: @unchecked Sendable {
    /// The OpenSSL context; used from several threads, which OpenSSL allows once it is set up.
    let context: UnsafeMutableRawPointer

    /// Why TLS cannot be set up (OpenSSL missing, a file that is not what it should be).
    struct Failure: Error { let message: String }

    init(caFile: String?, certificateFile: String?, keyFile: String?) throws(Failure) {
        var error = [CChar](repeating: 0, count: 256)
        guard let context = fc_tls_context(caFile, certificateFile, keyFile, &error, error.count) else {
            throw Failure(message: EtcdConnection.text(error))
        }
        self.context = context
    }

    deinit { fc_tls_free_context(context) }
}
