/// An error answer of etcd's gateway: the HTTP status, and the body's `code` (the gRPC
/// status code etcd gave) and `message`. What a call does next is decided by the code;
/// the message is only shown.
struct EtcdAnswer: Sendable, Equatable, CustomStringConvertible {
    var status: Int
    var code: Int?
    var message: String
    /// Whether it answers `/v3/auth/authenticate`: the credentials were refused.
    var refusesCredentials = false

    /// gRPC status codes etcd uses.
    enum Code {
        static let invalidArgument = 3
        static let deadlineExceeded = 4
        static let permissionDenied = 7
        static let unavailable = 14
        static let unauthenticated = 16
    }

    /// The error in `body` (`{"error":..., "message":..., "code":N}`), or the body as text.
    /// A pure function.
    static func parse(status: Int, body: [UInt8]) -> EtcdAnswer {
        struct Body: Decodable { var message: String?; var error: String?; var code: Int? }
        if let parsed = try? EtcdJSON.decode(Body.self, body), let text = parsed.message ?? parsed.error {
            return EtcdAnswer(status: status, code: parsed.code, message: text)
        }
        return EtcdAnswer(status: status, code: nil, message: String(decoding: body.prefix(200), as: UTF8.self))
    }

    /// The member cannot serve the call now (no leader, an election, a timeout inside
    /// etcd): another member may.
    var isUnavailable: Bool {
        if let code { return code == Code.unavailable || code == Code.deadlineExceeded }
        return status >= 500
    }

    /// The token is not (or no longer) valid: a new one may be asked for.
    var isUnauthenticated: Bool { code == Code.unauthenticated && !refusesCredentials }

    /// The credentials, or the user's permissions, do not allow the call.
    var isRefusal: Bool { refusesCredentials || code == Code.permissionDenied || code == Code.unauthenticated }

    /// etcd's authentication is on and the call named no user. The gateway gives no code
    /// finer than InvalidArgument for it: etcd's fixed text for that error tells it apart.
    var isUserMissing: Bool { code == Code.invalidArgument && message == "etcdserver: user name is empty" }

    var description: String { "etcd answered \(status)\(code.map { " (code \($0))" } ?? ""): \(message)" }
}
