import FileCoordination
import CFileCoordinationTLS
import Foundation
import SystemCalls
import SystemPackage
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
    /// No connection, or it broke, or no whole answer came in time: the member may be
    /// down; another may answer.
    case connection(EtcdEndpoint, String)
    /// The member's answer was not one the client accepts (malformed, or past a bound of
    /// ``EtcdLimits``): another member may answer, this one is not asked again.
    case invalid(EtcdEndpoint, String)
    /// etcd answered with an error.
    case answer(EtcdAnswer)

    var description: String {
        switch self {
        case .connection(let endpoint, let why), .invalid(let endpoint, let why): "\(endpoint): \(why)"
        case .answer(let answer): answer.description
        }
    }
}

/// When a call must be done by, and the time it was given (for the message when it is not).
struct EtcdDeadline: Sendable {
    let end: ContinuousClock.Instant
    let allowed: Duration

    init(_ allowed: Duration) {
        self.allowed = allowed
        end = .now + allowed
    }

    /// What is left, in milliseconds for poll(2) (at least 0).
    var milliseconds: Int32 {
        let left = end - .now
        guard left > .zero else { return 0 }
        let (seconds, attoseconds) = left.components
        return Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
    }
}

/// One HTTP/1.1 connection to an etcd member's JSON gateway (`/v3/...`). Blocking: it
/// runs on a thread of the etcd client's own, never on the cooperative pool. Kept open
/// between calls (one TCP handshake per member, not per call) while its answers leave
/// it clean. The socket is non-blocking: every wait is a poll(2) bounded by the call's
/// deadline, so no trickle of bytes makes a call outlast it. Bytes are parsed by the pure
/// parsers of `EtcdWire.swift`, within ``EtcdLimits``.
///
/// Used by one thread, except ``shutdown()``, which another thread may call to end a
/// watch (`shutdown(2)` on a descriptor kept open by the caller's reference).
final class EtcdConnection: @unchecked Sendable {
    let endpoint: EtcdEndpoint
    let limits: EtcdLimits
    private let fd: Int32
    /// The TLS session over `fd`, when the space uses TLS.
    private var session: UnsafeMutableRawPointer?
    /// Received and not yet used: `inbox[inboxStart...]`.
    private var inbox: [UInt8] = []
    private var inboxStart = 0
    private var receiveBuffer = [UInt8](repeating: 0, count: 16_384)
    /// Whether the last answer left the connection fit for another call.
    private var clean = true
    /// A stream's decoding, once ``startStream(_:_:token:deadline:)`` succeeded.
    private var stream: (decoder: EtcdChunkDecoder, splitter: EtcdMessageSplitter)?

    /// Connects (and, with `tls`, makes the handshake) by `deadline`.
    init(_ endpoint: EtcdEndpoint, deadline: EtcdDeadline, tls: EtcdTLS? = nil, limits: EtcdLimits) throws(EtcdFailure) {
        self.endpoint = endpoint
        self.limits = limits
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
            let socket: Int32
            switch Syscall.socket(candidate.pointee.ai_family,
                                  Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0) {
            case .success(let opened): socket = opened
            case .failure(let errno): lastError = Self.text(errno); continue
            }
            if let why = Self.connect(socket, candidate.pointee.ai_addr, candidate.pointee.ai_addrlen, deadline: deadline) {
                lastError = why
                _ = Syscall.close(socket)
                continue
            }
            _ = Syscall.setsockopt(socket, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
            Self.keepAlive(socket)
            fd = socket
            if let tls {
                var error = [CChar](repeating: 0, count: 256)
                // From here on a failure closes the socket through deinit.
                guard let session = fc_tls_session(tls.context, socket, endpoint.host, &error, error.count) else {
                    throw .connection(endpoint, Self.text(error))
                }
                self.session = session
                while true {
                    let step = fc_tls_handshake(session, &error, error.count)
                    if step == 1 { break }
                    // A certificate refused is the member's, not the network's: not asked again.
                    if step == FC_TLS_REFUSED { throw .invalid(endpoint, Self.text(error)) }
                    guard step == FC_TLS_WANT_READ || step == FC_TLS_WANT_WRITE else {
                        throw .connection(endpoint, Self.text(error))
                    }
                    try wait(step == FC_TLS_WANT_READ ? POLLIN : POLLOUT, until: deadline, doing: "the TLS handshake")
                }
            }
            return
        }
        throw .connection(endpoint, lastError)
    }

    deinit {
        fc_tls_free(session)
        _ = Syscall.close(fd)
    }

    /// Ends any read in progress on another thread (a watch's).
    func shutdown() { _ = Syscall.shutdown(fd, Int32(SHUT_RDWR)) }

    /// Whether another call may be made on this connection: its last answer was whole,
    /// nothing came after it, the server did not close it, and nothing arrived since.
    var isReusable: Bool {
        guard clean, stream == nil, inboxStart == inbox.count else { return false }
        // Non-blocking: a connection with nothing to read says so at once.
        var byte: UInt8 = 0
        if let session { return fc_tls_read(session, &byte, 1) == Int(FC_TLS_WANT_READ) }
        return Syscall.recv(fd, &byte, 1, Int32(MSG_PEEK)) == .failure(.wouldBlock)
    }

    /// One request and its whole answer by `deadline`; etcd's errors are thrown as
    /// ``EtcdFailure/answer(_:)``.
    func post(_ path: String, _ body: [UInt8], token: String?, deadline: EtcdDeadline) throws(EtcdFailure) -> [UInt8] {
        try send(path, body, token: token, deadline: deadline)
        let head = try readHead(deadline: deadline)
        let answer = try readBody(head, deadline: deadline)
        guard head.status == 200 else { throw .answer(EtcdAnswer.parse(status: head.status, body: answer)) }
        return answer
    }

    /// Starts a streamed call (a watch): its head by `deadline`, then its messages
    /// through ``nextMessages(by:)``.
    func startStream(_ path: String, _ body: [UInt8], token: String?, deadline: EtcdDeadline) throws(EtcdFailure) {
        try send(path, body, token: token, deadline: deadline)
        let head = try readHead(deadline: deadline)
        guard head.status == 200 else {
            let answer = (try? readBody(head, deadline: deadline)) ?? []
            throw .answer(EtcdAnswer.parse(status: head.status, body: answer))
        }
        guard head.framing == .chunked else { throw .invalid(endpoint, "the gateway did not stream its answer") }
        clean = false
        stream = (EtcdChunkDecoder(limits: limits, bodyLimit: nil), EtcdMessageSplitter(limit: limits.answerBytes))
    }

    /// The next messages of the stream (one or more); nil when the stream ended. Throws
    /// when none is whole by `deadline`.
    func nextMessages(by deadline: EtcdDeadline) throws(EtcdFailure) -> [[UInt8]]? {
        guard var (decoder, splitter) = stream else { return nil }
        defer { stream = (decoder, splitter) }
        var decoded: [UInt8] = []
        while true {
            do {
                decoded.removeAll(keepingCapacity: true)
                let used = try decoder.decode(inbox[inboxStart...], into: &decoded)
                inboxStart += used
                let messages = try splitter.messages(decoded[...])
                if !messages.isEmpty { return messages }
                if decoder.isDone { return splitter.finish().map { [$0] } }
            } catch {
                throw .invalid(endpoint, error.description)
            }
            try receive(until: deadline, doing: "a watch message")
        }
    }

    // MARK: The wire

    private func send(_ path: String, _ body: [UInt8], token: String?, deadline: EtcdDeadline) throws(EtcdFailure) {
        // `hasleader`: a member that has lost its leader refuses the call at once, and ends
        // a watch, rather than hold it (etcd's gRPC metadata, through the gateway).
        var request = "POST \(path) HTTP/1.1\r\nHost: \(endpoint)\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n"
        request += "Grpc-Metadata-Hasleader: true\r\n"
        if let token { request += "Authorization: \(token)\r\n" }
        request += "\r\n"
        let bytes = Array(request.utf8) + body
        var sent = 0
        while sent < bytes.count {
            guard let session else {
                switch bytes.withUnsafeBytes({ Syscall.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }) {
                case .success(let count): sent += count
                case .failure(.wouldBlock): try wait(POLLOUT, until: deadline, doing: "sending the request")
                case .failure(let errno): throw .connection(endpoint, "send failed: \(Self.text(errno))")
                }
                continue
            }
            let count = bytes.withUnsafeBytes { fc_tls_write(session, $0.baseAddress! + sent, $0.count - sent) }
            if count > 0 {
                sent += count
                continue
            }
            if count == Int(FC_TLS_WANT_READ) || count == Int(FC_TLS_WANT_WRITE) {
                try wait(count == Int(FC_TLS_WANT_READ) ? POLLIN : POLLOUT, until: deadline, doing: "sending the request")
                continue
            }
            if count < 0, errno == EINTR { continue }
            throw .connection(endpoint, "send failed: \(String(cString: strerror(errno)))")
        }
    }

    /// The answer's head (after any 1xx interim answers).
    private func readHead(deadline: EtcdDeadline) throws(EtcdFailure) -> EtcdHTTPHead {
        // Interim answers count against the head limit: the client never asks for one.
        var interim = 0
        while true {
            let parsed: (head: EtcdHTTPHead, size: Int)?
            do {
                parsed = try EtcdHTTPHead.parse(inbox[inboxStart...], limits: limits)
            } catch {
                throw .invalid(endpoint, error.description)
            }
            if let parsed {
                inboxStart += parsed.size
                if parsed.head.status >= 200 { return parsed.head }
                interim += parsed.size
                guard interim <= limits.headBytes else {
                    throw .invalid(endpoint, EtcdWireError.tooLarge("the interim (1xx) answers", limit: limits.headBytes).description)
                }
                continue
            }
            try receive(until: deadline, doing: "the answer's head")
        }
    }

    /// The body `head` announces, whole, within the answer limit.
    private func readBody(_ head: EtcdHTTPHead, deadline: EtcdDeadline) throws(EtcdFailure) -> [UInt8] {
        clean = false
        var body: [UInt8] = []
        switch head.framing {
        case .length(let count):
            while inbox.count - inboxStart < count { try receive(until: deadline, doing: "the answer") }
            body = Array(inbox[inboxStart..<inboxStart + count])
            inboxStart += count
        case .chunked:
            var decoder = EtcdChunkDecoder(limits: limits, bodyLimit: limits.answerBytes)
            while true {
                do {
                    inboxStart += try decoder.decode(inbox[inboxStart...], into: &body)
                } catch {
                    throw .invalid(endpoint, error.description)
                }
                if decoder.isDone { break }
                try receive(until: deadline, doing: "the answer")
            }
        case .untilClose:
            while true {
                do {
                    try receive(until: deadline, doing: "the answer")
                } catch .connection(_, let why) where why == Self.closed {
                    break
                }
                guard inbox.count - inboxStart <= limits.answerBytes else {
                    throw .invalid(endpoint, EtcdWireError.tooLarge("the answer", limit: limits.answerBytes).description)
                }
            }
            body = Array(inbox[inboxStart...])
            inboxStart = inbox.count
            return body
        }
        // Bytes past the answer were not asked for: the connection is not used again.
        clean = head.keepsConnection && inboxStart == inbox.count
        return body
    }

    private static let closed = "the connection was closed"

    /// Receives what has arrived (waiting for it until `deadline`) into the inbox.
    private func receive(until deadline: EtcdDeadline, doing what: String) throws(EtcdFailure) {
        // Checked here too, not only while waiting: a peer that always has bytes ready
        // (sent as fast as they are read) would never make this wait.
        guard deadline.milliseconds > 0 else { throw .connection(endpoint, "\(what) did not come within \(deadline.allowed)") }
        if inboxStart > 0, inboxStart == inbox.count || inboxStart > 65_536 {
            inbox.removeFirst(inboxStart)
            inboxStart = 0
        }
        while true {
            guard let session else {
                switch receiveBuffer.withUnsafeMutableBytes({ Syscall.recv(fd, $0.baseAddress!, $0.count, 0) }) {
                case .success(0): throw .connection(endpoint, Self.closed)
                case .success(let count):
                    inbox += receiveBuffer[..<count]
                    return
                case .failure(.wouldBlock): try wait(POLLIN, until: deadline, doing: what)
                case .failure(let errno): throw .connection(endpoint, "receive failed: \(Self.text(errno))")
                }
                continue
            }
            let count = receiveBuffer.withUnsafeMutableBytes { fc_tls_read(session, $0.baseAddress, $0.count) }
            if count > 0 {
                inbox += receiveBuffer[..<count]
                return
            }
            if count == 0 { throw .connection(endpoint, Self.closed) }
            if count == Int(FC_TLS_WANT_READ) || count == Int(FC_TLS_WANT_WRITE) {
                try wait(count == Int(FC_TLS_WANT_READ) ? POLLIN : POLLOUT, until: deadline, doing: what)
                continue
            }
            if errno == EINTR { continue }
            if errno == EPROTO {
                // With TLS 1.3 a server that refuses the client learns it only now.
                throw .connection(endpoint, "the server ended the TLS session (does it require a client certificate?)")
            }
            throw .connection(endpoint, "receive failed: \(String(cString: strerror(errno)))")
        }
    }

    /// Waits until the socket is ready for `events`, or throws when `deadline` passes.
    private func wait(_ events: Int32, until deadline: EtcdDeadline, doing what: String) throws(EtcdFailure) {
        switch Syscall.poll(fd, Int16(events), milliseconds: { deadline.milliseconds }) {
        case .success(true): return
        case .success(false): throw .connection(endpoint, "\(what) did not come within \(deadline.allowed)")
        case .failure(let errno): throw .connection(endpoint, "poll failed: \(Self.text(errno))")
        }
    }

    // MARK: Helpers

    /// A C string written into `buffer`.
    static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `strerror`'s text for `errno` ("Connection refused").
    static func text(_ errno: Errno) -> String {
        String(cString: strerror(errno.rawValue))
    }

    /// TCP keep-alives on a quiet connection: the first probe after 5 s of silence, then
    /// every 2 s; after 3 unanswered the kernel ends the connection (a peer gone without a
    /// word, as behind a partition, is noticed within some 11 s).
    private static func keepAlive(_ socket: Int32) {
        for (level, option, value) in [(SOL_SOCKET, SO_KEEPALIVE, 1), (Int32(IPPROTO_TCP), TCP_KEEPIDLE, 5),
                                       (Int32(IPPROTO_TCP), TCP_KEEPINTVL, 2), (Int32(IPPROTO_TCP), TCP_KEEPCNT, 3)] {
            _ = Syscall.setsockopt(socket, level, option, Int32(value))
        }
    }

    /// A non-blocking connect bounded by `deadline`; the reason on failure.
    private static func connect(_ socket: Int32, _ address: UnsafeMutablePointer<sockaddr>?, _ length: socklen_t,
                                deadline: EtcdDeadline) -> String? {
        switch Syscall.connect(socket, address, length) {
        case .success: return nil
        case .failure(.nowInProgress): break
        case .failure(let errno): return text(errno)
        }
        if case .success(false) = Syscall.poll(socket, Int16(POLLOUT), milliseconds: { deadline.milliseconds }) {
            return "no connection within \(deadline.allowed)"
        }
        let failure = (try? Syscall.socketError(socket).get()) ?? 0
        return failure == 0 ? nil : String(cString: strerror(failure))
    }
}
