import Foundation
import Testing
import TestSupport

/// TLS to etcd refuses a member whose certificate is not for the name or address asked
/// for, or has expired; a client key that does not go with its certificate is a clear
/// error when the space is joined, before any connection.
@Suite("etcd space: TLS checks")
struct EtcdTLSTests {
    /// `exec` in `space` with `options`: its status and stderr.
    func exec(_ space: String, _ options: [String]) async throws -> ProcessResult {
        let item = Scratch().write("item", "x")
        return try await run(filecoordBinary, ["exec", "--space", space] + options + ["--write", item, "--", "true"])
    }

    @Test("a member whose certificate is for another name: refused, by its address and by a name, one line, exit 1",
          .timeLimit(.minutes(1)))
    func certificateForAnotherName() async throws {
        let certificates = try await TestCertificates(serverNames: "DNS:etcd.example,IP:10.9.9.9")
        let server = try await EtcdServer(tls: certificates)
        let tls = ["--etcd-cacert", certificates.ca, "--etcd-cert", certificates.clientCertificate, "--etcd-key", certificates.clientKey]
        for host in ["127.0.0.1", "localhost"] {
            let refused = try await exec("etcds://\(host):\(server.clientPort)/tls", tls)
            #expect(refused.status == 1, "\(host): \(refused.errorText)")
            #expect(refused.errorText.split(separator: "\n").count == 1 && refused.errorText.contains("mismatch"), "\(host): \(refused.errorText)")
        }
        await server.stop()
    }

    @Test("a member whose certificate has expired: refused, one line, exit 1", .timeLimit(.minutes(1)))
    func expiredCertificate() async throws {
        let certificates = try await TestCertificates(expired: true)
        let server = try await EtcdServer(tls: certificates)
        let refused = try await exec("etcds://\(server.endpoint)/tls", ["--etcd-cacert", certificates.ca, "--etcd-cert",
                                                                         certificates.clientCertificate, "--etcd-key", certificates.clientKey])
        #expect(refused.status == 1)
        #expect(refused.errorText.split(separator: "\n").count == 1 && refused.errorText.contains("expired"), "\(refused.errorText)")
        await server.stop()
    }

    @Test("a client key that does not go with the certificate (another key type), or a certificate without its key: a clear error at join, exit 1",
          .timeLimit(.minutes(1)))
    func keyThatDoesNotMatch() async throws {
        let certificates = try await TestCertificates()
        // Nothing listens: the error must come before any connection.
        let space = "etcds://127.0.0.1:\(try freePort())/tls"
        let mismatched = try await exec(space, ["--etcd-cacert", certificates.ca, "--etcd-cert", certificates.clientCertificate,
                                                "--etcd-key", certificates.unrelatedKey])
        #expect(mismatched.status == 1)
        #expect(mismatched.errorText.split(separator: "\n").count == 1 && mismatched.errorText.contains(certificates.unrelatedKey)
                    && mismatched.errorText.contains("does not match"), "\(mismatched.errorText)")
        let keyless = try await exec(space, ["--etcd-cacert", certificates.ca, "--etcd-cert", certificates.clientCertificate])
        #expect(keyless.status == 1)
        #expect(keyless.errorText.split(separator: "\n").count == 1 && keyless.errorText.contains("key"), "\(keyless.errorText)")
        #expect(!keyless.errorText.contains("no etcd member answered"), "\(keyless.errorText)")
    }
}
