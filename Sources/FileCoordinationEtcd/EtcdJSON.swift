import Foundation

/// The gateway's JSON: base64 bytes, 64-bit numbers as strings, zero values left out.
enum EtcdJSON {
    static func encode(_ value: some Encodable) throws -> [UInt8] {
        Array(try JSONEncoder().encode(value))
    }

    static func decode<T: Decodable>(_ type: T.Type, _ bytes: [UInt8]) throws -> T {
        try JSONDecoder().decode(type, from: Data(bytes))
    }

    static func base64(_ bytes: some Collection<UInt8>) -> String { Data(bytes).base64EncodedString() }
    static func bytes(_ base64: String?) -> [UInt8] { base64.flatMap { Data(base64Encoded: $0) }.map { Array($0) } ?? [] }

    /// The key just past every key that starts with `prefix` (etcd's `range_end` for a prefix).
    static func prefixEnd(_ prefix: [UInt8]) -> [UInt8] {
        var end = prefix
        while let last = end.last {
            if last < 0xff {
                end[end.count - 1] = last + 1
                return end
            }
            end.removeLast()
        }
        return [0]
    }

    // MARK: Messages (the fields the space uses)

    struct Header: Decodable, Sendable { var revision: String? }

    /// A revision in etcd's JSON: a decimal count from 0, below `Int64.max` so that the
    /// revision after it is one too (a watch resumes from it). Nil for anything else: a
    /// member, or what stands between, may send any bytes, and `Int64.max + 1` traps.
    static func revision(_ text: String?) -> Int64? {
        guard let text, let value = Int64(text), value >= 0, value < .max else { return nil }
        return value
    }

    struct KeyValue: Decodable, Sendable {
        var key: String?
        var value: String?
        var create_revision: String?
        var mod_revision: String?
        var lease: String?
        var keyBytes: [UInt8] { EtcdJSON.bytes(key) }
        var valueBytes: [UInt8] { EtcdJSON.bytes(value) }
        var createRevision: Int64 { Int64(create_revision ?? "") ?? 0 }
    }

    struct RangeRequest: Encodable, Sendable {
        var key: String
        var range_end: String?
        var max_create_revision: String?
        var revision: String?
        init(key: [UInt8], prefix: Bool = false) {
            self.key = EtcdJSON.base64(key)
            range_end = prefix ? EtcdJSON.base64(EtcdJSON.prefixEnd(key)) : nil
        }
    }

    struct RangeResponse: Decodable, Sendable {
        var header: Header?
        var kvs: [KeyValue]?
    }

    struct PutRequest: Encodable, Sendable {
        var key: String
        var value: String
        var lease: String?
        init(key: [UInt8], value: [UInt8], lease: Int64?) {
            self.key = EtcdJSON.base64(key)
            self.value = EtcdJSON.base64(value)
            self.lease = lease.map(String.init)
        }
    }

    struct DeleteRangeRequest: Encodable, Sendable {
        var key: String
        var range_end: String?
        init(key: [UInt8], prefix: Bool = false) {
            self.key = EtcdJSON.base64(key)
            range_end = prefix ? EtcdJSON.base64(EtcdJSON.prefixEnd(key)) : nil
        }
    }

    struct RequestOp: Encodable, Sendable {
        var request_range: RangeRequest?
        var request_put: PutRequest?
        var request_delete_range: DeleteRangeRequest?
    }

    struct ResponseOp: Decodable, Sendable {
        var response_range: RangeResponse?
    }

    struct Compare: Encodable, Sendable {
        var result: String
        var target: String
        var key: String
        var create_revision: String?
        var version: String?
    }

    struct TxnRequest: Encodable, Sendable {
        var compare: [Compare] = []
        var success: [RequestOp] = []
        var failure: [RequestOp] = []
    }

    struct TxnResponse: Decodable, Sendable {
        var header: Header?
        var succeeded: Bool?
        var responses: [ResponseOp]?
    }

    struct LeaseGrantRequest: Encodable, Sendable { var TTL: String }
    struct LeaseGrantResponse: Decodable, Sendable { var header: Header?; var ID: String?; var TTL: String?; var error: String? }
    struct LeaseRequest: Encodable, Sendable { var ID: String }
    struct LeaseKeepAliveResponse: Decodable, Sendable {
        struct Result: Decodable, Sendable { var ID: String?; var TTL: String? }
        struct Failure: Decodable, Sendable { var grpc_code: Int?; var message: String? }
        var result: Result?
        var error: Failure?
    }
    struct Empty: Decodable, Sendable {}

    struct WatchCreate: Encodable, Sendable {
        struct Create: Encodable, Sendable {
            var key: String
            var range_end: String?
            var start_revision: String?
            var filters: [String]?
            /// etcd then says, every so often on a quiet watch, the revision it has sent
            /// every event up to (`--experimental-watch-progress-notify-interval`, 10 min by
            /// default in etcd 3.4).
            var progress_notify: Bool?
        }
        var create_request: Create
    }

    struct WatchResponse: Decodable, Sendable {
        struct Result: Decodable, Sendable {
            var header: Header?
            var created: Bool?
            var canceled: Bool?
            var compact_revision: String?
            var cancel_reason: String?
            var events: [Event]?
        }
        struct Event: Decodable, Sendable {
            var type: String?
            var kv: KeyValue?
        }
        /// How the gateway ends a stream that failed (`{"error":{"grpc_code":14,...}}`).
        struct StreamError: Decodable, Sendable {
            var grpc_code: Int?
            var http_code: Int?
            var message: String?
        }
        var result: Result?
        var error: StreamError?
    }
}
