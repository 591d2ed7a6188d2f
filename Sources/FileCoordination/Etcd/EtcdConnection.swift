import CFileCoordinationShims
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One etcd member's address, as `HOST:PORT` (an IPv6 host in brackets).
struct EtcdEndpoint: Sendable, Hashable, CustomStringConvertible {
    var host: String
    var port: UInt16

    /// Parses `HOST:PORT`, `[V6]:PORT`, or `HOST` (port 2379, etcd's client port).
    init?(_ text: Substring) {
        var hostPart = text
        var portPart: Substring?
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            hostPart = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            if !rest.isEmpty {
                guard rest.hasPrefix(":") else { return nil }
                portPart = rest.dropFirst()
            }
        } else if let colon = text.lastIndex(of: ":") {
            hostPart = text[..<colon]
            portPart = text[text.index(after: colon)...]
        }
        guard !hostPart.isEmpty else { return nil }
        host = String(hostPart)
        if let portPart {
            guard let port = UInt16(portPart), port > 0 else { return nil }
            self.port = port
        } else {
            port = 2379
        }
    }

    var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Why a call to etcd failed: the connection (try another member), or etcd's answer.
enum EtcdFailure: Error, Sendable, CustomStringConvertible {
    /// No connection, or it broke: the member may be down; another may answer.
    case connection(EtcdEndpoint, String)
    /// etcd answered with an error (HTTP status, its message).
    case answer(Int, String)

    var description: String {
        switch self {
        case .connection(let endpoint, let why): "\(endpoint): \(why)"
        case .answer(let status, let message): "etcd answered \(status): \(message)"
        }
    }
}

/// One HTTP/1.1 connection to an etcd member's JSON gateway (`/v3/...`). Blocking: it
/// runs on a thread of the etcd client's own, never on the cooperative pool. Kept open
/// between calls (one TCP handshake per member, not per call).
///
/// Used by one thread, except ``shutdown()``, which another thread may call to end a
/// watch (`shutdown(2)` on a descriptor kept open by the caller's reference).
final class EtcdConnection: @unchecked Sendable {
    let endpoint: EtcdEndpoint
    private let fd: Int32
    /// The TLS session over `fd`, when the space uses TLS.
    private var session: UnsafeMutableRawPointer?
    private var buffer: [UInt8] = []
    private var start = 0

    /// Connects within `timeout` (and, with `tls`, does the handshake); reads then wait
    /// at most `readTimeout` (nil: for ever, for a watch, which ``shutdown()`` ends).
    init(_ endpoint: EtcdEndpoint, timeout: Duration, readTimeout: Duration?, tls: EtcdTLS? = nil) throws(EtcdFailure) {
        self.endpoint = endpoint
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let resolved = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &list)
        guard resolved == 0, let first = list else {
            throw .connection(endpoint, "cannot resolve the host: \(String(cString: gai_strerror(resolved)))")
        }
        defer { freeaddrinfo(list) }
        var lastError = "no address"
        var address: UnsafeMutablePointer<addrinfo>? = first
        while let candidate = address {
            address = candidate.pointee.ai_next
            let socket = Glibc.socket(candidate.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard socket >= 0 else { lastError = String(cString: strerror(errno)); continue }
            if let why = Self.connect(socket, candidate.pointee.ai_addr, candidate.pointee.ai_addrlen, timeout: timeout) {
                lastError = why
                close(socket)
                continue
            }
            var one: Int32 = 1
            setsockopt(socket, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if let readTimeout {
                var limit = Self.timeval(readTimeout)
                setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
                setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
            }
            if let tls {
                // The handshake within the connect timeout too.
                var limit = Self.timeval(timeout)
                setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
                var error = [CChar](repeating: 0, count: 256)
                guard let session = fc_tls_connect(tls.context, socket, endpoint.host, &error, error.count) else {
                    close(socket)
                    throw .connection(endpoint, Self.text(error))
                }
                self.session = session
                if readTimeout == nil {
                    var none = Glibc.timeval()
                    setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
                }
            }
            fd = socket
            return
        }
        throw .connection(endpoint, lastError)
    }

    deinit {
        fc_tls_free(session)
        close(fd)
    }

    /// Ends any read in progress on another thread (a watch's).
    func shutdown() { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) }

    /// One request and its whole answer; etcd's errors are thrown as ``EtcdFailure/answer(_:_:)``.
    func post(_ path: String, _ body: [UInt8], token: String?) throws(EtcdFailure) -> [UInt8] {
        try send(path, body, token: token)
        let head = try readHead()
        let answer: [UInt8]
        if head.chunked {
            var whole: [UInt8] = []
            while let chunk = try readChunk() { whole += chunk }
            answer = whole
        } else {
            answer = try read(count: head.length ?? 0)
        }
        guard head.status == 200 else { throw .answer(head.status, Self.message(answer)) }
        return answer
    }

    /// Starts a streamed call (a watch): the chunks follow through ``nextChunk()``.
    func startStream(_ path: String, _ body: [UInt8], token: String?) throws(EtcdFailure) {
        try send(path, body, token: token)
        let head = try readHead()
        guard head.status == 200 else {
            let answer = head.chunked ? ((try? readChunk()) ?? nil) ?? [] : ((try? read(count: head.length ?? 0)) ?? [])
            throw .answer(head.status, Self.message(answer))
        }
        guard head.chunked else { throw .connection(endpoint, "the gateway did not stream its answer") }
    }

    /// The next message of a stream; nil when the stream ended.
    func nextChunk() throws(EtcdFailure) -> [UInt8]? { try readChunk() }

    // MARK: The wire

    private func send(_ path: String, _ body: [UInt8], token: String?) throws(EtcdFailure) {
        var request = "POST \(path) HTTP/1.1\r\nHost: \(endpoint)\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n"
        if let token { request += "Authorization: \(token)\r\n" }
        request += "\r\n"
        let bytes = Array(request.utf8) + body
        var sent = 0
        while sent < bytes.count {
            let count = bytes.withUnsafeBytes { raw in
                session.map { fc_tls_write($0, raw.baseAddress! + sent, raw.count - sent) }
                    ?? Glibc.send(fd, raw.baseAddress! + sent, raw.count - sent, Int32(MSG_NOSIGNAL))
            }
            if count < 0 {
                if errno == EINTR { continue }
                throw .connection(endpoint, "send failed: \(String(cString: strerror(errno)))")
            }
            sent += count
        }
    }

    private struct Head { var status: Int; var length: Int?; var chunked: Bool }

    private func readHead() throws(EtcdFailure) -> Head {
        let lines = try readLinesUntilBlank()
        guard let statusLine = lines.first, statusLine.hasPrefix("HTTP/1."),
              let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "")
        else { throw .connection(endpoint, "not an HTTP answer: \(lines.first ?? "")") }
        var head = Head(status: status, length: nil, chunked: false)
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].lowercased()
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            if name == "content-length" { head.length = Int(value) }
            if name == "transfer-encoding", value.lowercased().contains("chunked") { head.chunked = true }
        }
        return head
    }

    private func readLinesUntilBlank() throws(EtcdFailure) -> [String] {
        var lines: [String] = []
        while true {
            let line = try readLine()
            if line.isEmpty { return lines }
            lines.append(line)
        }
    }

    private func readLine() throws(EtcdFailure) -> String {
        while true {
            if let newline = buffer[start...].firstIndex(of: UInt8(ascii: "\n")) {
                var end = newline
                if end > start, buffer[end - 1] == UInt8(ascii: "\r") { end -= 1 }
                let line = String(decoding: buffer[start..<end], as: UTF8.self)
                start = newline + 1
                return line
            }
            try fill()
        }
    }

    private func readChunk() throws(EtcdFailure) -> [UInt8]? {
        let sizeLine = try readLine()
        guard let size = Int(sizeLine.split(separator: ";").first ?? "", radix: 16) else {
            throw .connection(endpoint, "a malformed chunk size: \(sizeLine)")
        }
        if size == 0 {
            _ = try readLinesUntilBlank()
            return nil
        }
        let chunk = try read(count: size)
        _ = try readLine()
        return chunk
    }

    private func read(count: Int) throws(EtcdFailure) -> [UInt8] {
        while buffer.count - start < count { try fill() }
        let bytes = Array(buffer[start..<start + count])
        start += count
        return bytes
    }

    private func fill() throws(EtcdFailure) {
        if start > 0 {
            buffer.removeFirst(start)
            start = 0
        }
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = chunk.withUnsafeMutableBytes { raw in
                session.map { fc_tls_read($0, raw.baseAddress, raw.count) } ?? recv(fd, raw.baseAddress, raw.count, 0)
            }
            if count > 0 {
                buffer += chunk[..<count]
                return
            }
            if count == 0 { throw .connection(endpoint, "the connection was closed") }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { throw .connection(endpoint, "no answer in time") }
            if session != nil, errno == EPROTO {
                // With TLS 1.3 a server that refuses the client learns it only now.
                throw .connection(endpoint, "the server ended the TLS session (does it require a client certificate?)")
            }
            throw .connection(endpoint, "receive failed: \(String(cString: strerror(errno)))")
        }
    }

    // MARK: Helpers

    /// A C string written into `buffer`.
    static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// etcd's `{"error": ..., "message": ...}`, or the body as text.
    private static func message(_ body: [UInt8]) -> String {
        struct Answer: Decodable { var message: String?; var error: String? }
        if let answer = try? EtcdJSON.decode(Answer.self, body), let text = answer.message ?? answer.error { return text }
        return String(decoding: body.prefix(200), as: UTF8.self)
    }

    private static func timeval(_ duration: Duration) -> Glibc.timeval {
        let (seconds, attoseconds) = duration.components
        return Glibc.timeval(tv_sec: Int(seconds), tv_usec: Int(attoseconds / 1_000_000_000_000))
    }

    /// A non-blocking connect bounded by `timeout`; the reason on failure.
    private static func connect(_ socket: Int32, _ address: UnsafeMutablePointer<sockaddr>?, _ length: socklen_t,
                                timeout: Duration) -> String? {
        let flags = fcntl(socket, F_GETFL)
        _ = fcntl(socket, F_SETFL, flags | O_NONBLOCK)
        defer { _ = fcntl(socket, F_SETFL, flags) }
        if Glibc.connect(socket, address, length) == 0 { return nil }
        guard errno == EINPROGRESS else { return String(cString: strerror(errno)) }
        var target = pollfd(fd: socket, events: Int16(POLLOUT), revents: 0)
        let milliseconds = Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        var ready: Int32
        repeat { ready = poll(&target, 1, milliseconds) } while ready < 0 && errno == EINTR
        if ready == 0 { return "no connection within \(timeout)" }
        var failure: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(socket, SOL_SOCKET, SO_ERROR, &failure, &size)
        return failure == 0 ? nil : String(cString: strerror(failure))
    }
}

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
