import Foundation

/// An endpoint on loopback that plays etcd's JSON gateway as a test scripts it: each
/// request read off a real socket goes to `handler` on the connection's own thread, which
/// writes what it likes (a broken answer, a trickle, an endless stream) through ``Peer``.
/// ``FakeEtcd`` answers the calls of a normal run, for the tests that break only one part.
final class HostileEndpoint: @unchecked Sendable {
    /// One request: its path, its headers (names in lower case) and its body.
    struct Request: Sendable {
        var path: String
        var headers: [String: String]
        var body: [UInt8]
        /// The body as JSON (a dictionary), when it is one.
        var json: [String: Any]? { (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] }
    }

    /// The client's side of one connection, for the handler to write to.
    final class Peer: @unchecked Sendable {
        let fd: Int32
        /// The connection's number (0 for the first accepted).
        let number: Int
        init(fd: Int32, number: Int) { (self.fd, self.number) = (fd, number) }

        /// Writes all of `bytes`; false once the client has gone.
        @discardableResult
        func write(_ bytes: [UInt8]) -> Bool {
            var sent = 0
            while sent < bytes.count {
                let count = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { return false }
                sent += count
            }
            return true
        }

        @discardableResult
        func write(_ text: String) -> Bool { write(Array(text.utf8)) }

        /// A chunk of a chunked body (its size line, the bytes, CRLF).
        @discardableResult
        func chunk(_ bytes: [UInt8]) -> Bool { write(Array(String(bytes.count, radix: 16).utf8) + [13, 10] + bytes + [13, 10]) }

        /// Waits until the client closes the connection (or `seconds` pass).
        func waitForClose(seconds: Double) {
            var target = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let end = Date(timeIntervalSinceNow: seconds)
            var scratch = [UInt8](repeating: 0, count: 4096)
            while end.timeIntervalSinceNow > 0 {
                guard poll(&target, 1, Int32(max(1, end.timeIntervalSinceNow * 1000))) > 0 else { continue }
                if recv(fd, &scratch, scratch.count, 0) <= 0 { return }
            }
        }
    }

    private let listener: Int32
    let port: Int
    var endpoint: String { "127.0.0.1:\(port)" }
    private let lock = NSLock()
    private var peers: [Int32] = []
    private var accepted = 0
    private var requestLog: [String] = []
    private var stopped = false

    /// Listens on a port of the kernel's choice; `handler` answers each request and says
    /// whether to read another request on that connection.
    init(_ handler: @escaping @Sendable (Request, Peer) -> Bool) throws {
        let listener = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 && listen(listener, 64) == 0
            }
        }
        guard bound else {
            close(listener)
            throw POSIXError(.EADDRINUSE)
        }
        self.listener = listener
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread.detachNewThread { [self] in acceptLoop(handler) }
    }

    /// The paths requested so far, in order.
    var requests: [String] { lock.withLock { requestLog } }
    /// How many connections were accepted.
    var connections: Int { lock.withLock { accepted } }

    /// Stops listening and ends every connection.
    func stop() {
        let open = lock.withLock { () -> [Int32] in
            stopped = true
            return peers
        }
        Glibc.shutdown(listener, Int32(SHUT_RDWR))
        for fd in open { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
    }

    deinit {
        stop()
        close(listener)
    }

    private func acceptLoop(_ handler: @escaping @Sendable (Request, Peer) -> Bool) {
        while true {
            // (accept4 is not in Swift's Glibc: close-on-exec is set at once after.)
            let fd = accept(listener, nil, nil)
            if fd >= 0 { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
            if fd < 0 {
                if errno == EINTR { continue }
                return
            }
            let number = lock.withLock { () -> Int? in
                guard !stopped else { return nil }
                peers.append(fd)
                defer { accepted += 1 }
                return accepted
            }
            guard let number else {
                close(fd)
                return
            }
            Thread.detachNewThread { [self] in
                let peer = Peer(fd: fd, number: number)
                var pending: [UInt8] = []
                while let request = Self.readRequest(fd, &pending) {
                    lock.withLock { requestLog.append(request.path) }
                    if !handler(request, peer) { break }
                }
                lock.withLock { peers.removeAll { $0 == fd } }
                close(fd)
            }
        }
    }

    /// One request (Content-Length framing, as the client sends); nil at the end.
    private static func readRequest(_ fd: Int32, _ pending: inout [UInt8]) -> Request? {
        func fill() -> Bool {
            var buffer = [UInt8](repeating: 0, count: 65_536)
            let count = recv(fd, &buffer, buffer.count, 0)
            guard count > 0 else { return false }
            pending += buffer[..<count]
            return true
        }
        let blank: [UInt8] = [13, 10, 13, 10]
        var end: Int?
        while true {
            if pending.count >= 4, let found = (0...(pending.count - 4)).first(where: { Array(pending[$0..<$0 + 4]) == blank }) {
                end = found
                break
            }
            guard fill() else { return nil }
        }
        let head = String(decoding: pending[..<end!], as: UTF8.self).components(separatedBy: "\r\n")
        pending.removeFirst(end! + 4)
        let parts = head[0].split(separator: " ")
        guard parts.count >= 2 else { return nil }
        var headers: [String: String] = [:]
        for line in head.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while pending.count < length { guard fill() else { return nil } }
        let body = Array(pending[..<length])
        pending.removeFirst(length)
        return Request(path: String(parts[1]), headers: headers, body: body)
    }
}

/// What etcd's gateway answers to the calls of a normal run (a lease, a member key, a
/// claim's transaction, a release, keep-alives), for a ``HostileEndpoint`` that breaks
/// only the part a test is about. One lease; revisions count up from 2.
final class FakeEtcd: @unchecked Sendable {
    private let lock = NSLock()
    private var revision: Int64 = 1
    /// A claim of another process, earlier than every claim made here, on the same items
    /// as the first claim made here: that claim then waits for it (for a watch).
    let blockFirstClaim: Bool
    /// The blocking claim's key, base64 (set once a claim was made).
    private(set) var blockerKey: String?

    private let blocked = DispatchSemaphore(value: 0)

    init(blockFirstClaim: Bool = false) { self.blockFirstClaim = blockFirstClaim }

    /// Waits (up to 30 s) until the first claim was answered with the blocking claim
    /// before it: a release sent after that comes after the claim's transaction.
    func waitForBlockedClaim() {
        if blocked.wait(timeout: .now() + 30) == .success { blocked.signal() }
    }

    private func next() -> Int64 {
        lock.withLock {
            revision += 1
            return revision
        }
    }

    /// The JSON body of the answer to `request`; nil for a path it does not know.
    func answer(_ request: HostileEndpoint.Request) -> String? {
        switch request.path {
        case "/v3/lease/grant":
            return #"{"header":{"revision":"\#(next())"},"ID":"7","TTL":"5"}"#
        case "/v3/lease/keepalive":
            return #"{"result":{"header":{"revision":"1"},"ID":"7","TTL":"5"}}"# + "\n"
        case "/v3/kv/range":
            return #"{"header":{"revision":"\#(next())"},"kvs":[]}"#
        case "/v3/kv/put", "/v3/kv/deleterange", "/v3/lease/revoke":
            return #"{"header":{"revision":"\#(next())"}}"#
        case "/v3/kv/txn":
            guard let success = request.json?["success"] as? [[String: Any]],
                  let put = success.first?["request_put"] as? [String: Any],
                  let key = put["key"] as? String, let value = put["value"] as? String else { return nil }
            let mine = next()
            var kvs = [#"{"key":"\#(key)","value":"\#(value)","create_revision":"\#(mine)","mod_revision":"\#(mine)"}"#]
            if blockFirstClaim, lock.withLock({ blockerKey == nil }) {
                // The same items, under the claims folder of a member "00000000000000ff".
                let prefix = String(decoding: Data(base64Encoded: key) ?? Data(), as: UTF8.self)
                let folder = prefix.components(separatedBy: "/claims/")[0] + "/claims/"
                let blocker = Data((folder + "00000000000000ff/0000000000000001").utf8).base64EncodedString()
                lock.withLock { blockerKey = blocker }
                blocked.signal()
                kvs.insert(#"{"key":"\#(blocker)","value":"\#(value)","create_revision":"1","mod_revision":"1"}"#, at: 0)
            }
            return #"{"header":{"revision":"\#(mine)"},"succeeded":true,"responses":[{"response_put":{}},{"response_range":{"kvs":[\#(kvs.joined(separator: ","))]}}]}"#
        default:
            return nil
        }
    }

    /// A watch's first message.
    func created() -> String { #"{"result":{"header":{"revision":"\#(currentRevision)"},"created":true}}"# }

    /// The current revision.
    var currentRevision: Int64 { lock.withLock { revision } }

    /// The watch's message that says the blocking claim was deleted.
    func blockerDeleted() -> String {
        let at = next()
        return #"{"result":{"header":{"revision":"\#(at)"},"events":[{"type":"DELETE","kv":{"key":"\#(blockerKey ?? "")","mod_revision":"\#(at)"}}]}}"#
    }

    /// A whole answer with a Content-Length.
    static func http(_ body: String, status: String = "200 OK") -> String {
        "HTTP/1.1 \(status)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
    }

    /// The head of a streamed (chunked) answer.
    static let streamHead = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"

    /// Answers `request` as etcd would; false (the connection closed) for a path it does not know.
    func serve(_ request: HostileEndpoint.Request, _ peer: HostileEndpoint.Peer) -> Bool {
        guard let body = answer(request) else { return false }
        return peer.write(Self.http(body))
    }
}
