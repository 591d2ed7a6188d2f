import FileCoordination
import Foundation
import Synchronization

/// The etcd space's own client, with no coordination around it: the peer that `make bench`
/// measures the etcd space against (a bare transaction, a bare watch round trip), with the
/// same connection, thread and JSON as the space's calls.
@_spi(Benchmarks)
public final class EtcdBareClient: Sendable {
    let client: EtcdClient

    /// A client of the members at `endpoints` (`HOST:PORT`).
    public init(endpoints: [String]) {
        client = EtcdClient(endpoints: endpoints.compactMap { EtcdEndpoint(Substring($0)) }, connectTimeout: .seconds(5),
                            retryLimit: .seconds(5))
    }

    deinit { client.close() }

    /// One transaction that puts `key`; the revision it made.
    @discardableResult
    public func put(_ key: String, _ value: String) async throws -> Int64 {
        var transaction = EtcdJSON.TxnRequest()
        transaction.success = [.init(request_put: EtcdJSON.PutRequest(key: Array(key.utf8), value: Array(value.utf8), lease: nil))]
        let answer = try await client.call("/v3/kv/txn", transaction, as: EtcdJSON.TxnResponse.self)
        return EtcdJSON.revision(answer.header?.revision) ?? 0
    }

    /// Deletes `key`.
    public func delete(_ key: String) async throws {
        _ = try await client.call("/v3/kv/deleterange", EtcdJSON.DeleteRangeRequest(key: Array(key.utf8)), as: EtcdJSON.Empty.self)
    }

    /// A watch on the keys under `prefix` put from `revision` on: `handle` gets each key
    /// and value, on the watch's thread. Cancel the returned watch to end it.
    public func watchPuts(_ prefix: String, from revision: Int64,
                          _ handle: @escaping @Sendable (_ key: String, _ value: String) -> Void) -> Watch {
        Watch(EtcdWatch(client: client, prefix: Array(prefix.utf8), from: revision, events: .puts) { events in
            for event in events {
                guard let kv = event.kv else { continue }
                handle(String(decoding: kv.keyBytes, as: UTF8.self), String(decoding: kv.valueBytes, as: UTF8.self))
            }
        } failed: { _ in })
    }

    /// A running watch.
    public struct Watch: Sendable {
        let watch: EtcdWatch
        init(_ watch: EtcdWatch) { self.watch = watch }
        /// Ends it.
        public func cancel() { watch.cancel() }
    }
}
