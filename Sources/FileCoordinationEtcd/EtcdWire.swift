/// What the etcd client accepts from the network, at most. An answer or a watch message
/// past its bound ends the call with an error; nothing from the network makes the client
/// hold more than these (and a receive buffer) per connection.
struct EtcdLimits: Sendable, Equatable {
    /// The status line and headers of one answer.
    var headBytes = 64 * 1024
    /// One answer's body, and one message of a watch's stream.
    var answerBytes = 16 * 1024 * 1024
    /// One line of a chunked body's framing (a chunk's size and extensions, a trailer).
    var lineBytes = 4 * 1024
}

/// Why bytes from the network are not an answer the client accepts.
enum EtcdWireError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not HTTP/1.1 as the gateway speaks it.
    case malformed(String)
    /// Larger than a bound of ``EtcdLimits``: what, and the bound.
    case tooLarge(String, limit: Int)

    var description: String {
        switch self {
        case .malformed(let why): "a malformed answer: \(why)"
        case .tooLarge(let what, let limit): "\(what) is larger than the limit of \(limit) bytes"
        }
    }
}

/// The head of an HTTP/1.1 answer, as the client uses it.
struct EtcdHTTPHead: Sendable, Equatable {
    /// How the body's end is known.
    enum Framing: Sendable, Equatable {
        /// `Content-Length` bytes.
        case length(Int)
        /// `Transfer-Encoding: chunked`.
        case chunked
        /// Neither: the body ends when the connection closes.
        case untilClose
    }

    var status: Int
    var framing: Framing
    /// Whether the connection may carry another call after this answer.
    var keepsConnection: Bool

    /// The head at the start of `bytes`, and how many bytes it took; nil while it is
    /// incomplete. A pure function: the client and the fuzzer call it on what was received.
    ///
    /// - Throws: ``EtcdWireError`` for a head that is not HTTP/1.x, a size that is not a
    ///   decimal number within `limits.answerBytes`, an unknown transfer coding, or a head
    ///   longer than `limits.headBytes`.
    static func parse(_ bytes: ArraySlice<UInt8>, limits: EtcdLimits) throws(EtcdWireError) -> (head: EtcdHTTPHead, size: Int)? {
        guard let end = EtcdLines.blankLine(in: bytes, within: limits.headBytes) else {
            if bytes.count > limits.headBytes { throw .tooLarge("the answer's head", limit: limits.headBytes) }
            return nil
        }
        var lines = EtcdLines.split(bytes[bytes.startIndex..<end.lineStart])
        guard !lines.isEmpty else { throw .malformed("no status line") }
        let status = try statusLine(lines.removeFirst())
        var head = EtcdHTTPHead(status: status.code, framing: .untilClose, keepsConnection: status.minor >= 1)
        var length: Int?
        var chunked = false
        for line in lines {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { throw .malformed("a header without a colon") }
            let name = EtcdLines.lowercased(line[line.startIndex..<colon])
            let value = EtcdLines.trimmed(line[(colon + 1)...])
            switch name {
            case "content-length":
                guard let parsed = EtcdLines.decimal(value) else { throw .malformed("Content-Length is not a decimal number") }
                if let length, length != parsed { throw .malformed("two different Content-Length headers") }
                length = parsed
            case "transfer-encoding":
                // The gateway uses chunked alone; any other coding is not understood.
                guard EtcdLines.lowercased(value) == "chunked", !chunked else {
                    throw .malformed("the transfer coding '\(String(decoding: value.prefix(40), as: UTF8.self))' is not chunked")
                }
                chunked = true
            case "connection":
                if value.split(separator: UInt8(ascii: ",")).contains(where: { EtcdLines.lowercased(EtcdLines.trimmed($0)) == "close" }) {
                    head.keepsConnection = false
                }
            default:
                break
            }
        }
        if chunked, length != nil { throw .malformed("both Content-Length and Transfer-Encoding") }
        if let length {
            guard length <= limits.answerBytes else { throw .tooLarge("an answer of \(length) bytes", limit: limits.answerBytes) }
            head.framing = .length(length)
        } else if chunked {
            head.framing = .chunked
        } else if status.code == 204 || status.code == 304 || status.code < 200 {
            head.framing = .length(0)
        } else {
            head.keepsConnection = false
        }
        return (head, end.after - bytes.startIndex)
    }

    /// `HTTP/1.x NNN reason`: the minor version and the code.
    private static func statusLine(_ line: ArraySlice<UInt8>) throws(EtcdWireError) -> (minor: Int, code: Int) {
        let text = Array(line)
        guard text.count >= 12, text.starts(with: Array("HTTP/1.".utf8)), let minor = EtcdLines.digit(text[7]), text[8] == UInt8(ascii: " "),
              let a = EtcdLines.digit(text[9]), let b = EtcdLines.digit(text[10]), let c = EtcdLines.digit(text[11]),
              text.count == 12 || text[12] == UInt8(ascii: " ")
        else { throw .malformed("not an HTTP/1 status line: \(String(decoding: text.prefix(60), as: UTF8.self))") }
        let code = a * 100 + b * 10 + c
        guard (100...599).contains(code) else { throw .malformed("the status \(code)") }
        return (minor, code)
    }
}

/// A chunked body decoded as its bytes arrive, in whatever pieces the network (or a
/// proxy) cut them: a pure state machine, the same for the client and the fuzzer.
struct EtcdChunkDecoder: Sendable {
    private enum State: Sendable, Equatable {
        case size
        case data(remaining: Int)
        case dataEnd
        case trailers
        case done
    }

    private var state = State.size
    private var decoded = 0
    /// The trailers' bytes so far: bounded as a head is.
    private var trailerBytes = 0
    /// The most body bytes accepted (nil: no bound, for a stream whose messages are
    /// bounded one by one).
    let bodyLimit: Int?
    let limits: EtcdLimits

    init(limits: EtcdLimits, bodyLimit: Int?) {
        self.limits = limits
        self.bodyLimit = bodyLimit
    }

    /// Whether the last chunk and the trailers have been read.
    var isDone: Bool { state == .done }

    /// Decodes what it can of `input`, appending the body's bytes to `body`; returns how
    /// many bytes of `input` it used. Bytes of a line not yet complete are left unused
    /// (give them again with more); nothing after the body's end is used.
    ///
    /// - Throws: ``EtcdWireError`` for a size that is not hexadecimal or too large, a
    ///   chunk not followed by CRLF, or a line or body past its bound.
    mutating func decode(_ input: ArraySlice<UInt8>, into body: inout [UInt8]) throws(EtcdWireError) -> Int {
        var index = input.startIndex
        while index < input.endIndex {
            switch state {
            case .size:
                guard let line = try nextLine(input[index...]) else { return index - input.startIndex }
                index = line.next
                let size = try chunkSize(line.text)
                if let bodyLimit, size > bodyLimit - decoded { throw .tooLarge("the answer", limit: bodyLimit) }
                state = size == 0 ? .trailers : .data(remaining: size)
            case .data(let remaining):
                let count = min(remaining, input.endIndex - index)
                body.append(contentsOf: input[index..<index + count])
                decoded += count
                index += count
                state = remaining == count ? .dataEnd : .data(remaining: remaining - count)
            case .dataEnd:
                guard let line = try nextLine(input[index...]) else { return index - input.startIndex }
                guard line.text.isEmpty else { throw .malformed("a chunk longer than its size") }
                index = line.next
                state = .size
            case .trailers:
                guard let line = try nextLine(input[index...]) else { return index - input.startIndex }
                trailerBytes += line.next - index
                if trailerBytes > limits.headBytes { throw .tooLarge("the trailers of the chunked body", limit: limits.headBytes) }
                index = line.next
                if line.text.isEmpty { state = .done }
            case .done:
                return index - input.startIndex
            }
        }
        return index - input.startIndex
    }

    /// The line at the start of `bytes` (without its CRLF or LF) and where the next starts.
    private func nextLine(_ bytes: ArraySlice<UInt8>) throws(EtcdWireError) -> (text: ArraySlice<UInt8>, next: Int)? {
        guard let newline = bytes.prefix(limits.lineBytes + 2).firstIndex(of: UInt8(ascii: "\n")) else {
            if bytes.count > limits.lineBytes + 1 { throw .tooLarge("a line of the chunked body", limit: limits.lineBytes) }
            return nil
        }
        var end = newline
        if end > bytes.startIndex, bytes[end - 1] == UInt8(ascii: "\r") { end -= 1 }
        return (bytes[bytes.startIndex..<end], newline + 1)
    }

    /// A chunk's size: hexadecimal digits, then optional extensions after `;`.
    private func chunkSize(_ line: ArraySlice<UInt8>) throws(EtcdWireError) -> Int {
        let digits = EtcdLines.trimmed(line.prefix { $0 != UInt8(ascii: ";") })
        guard !digits.isEmpty else { throw .malformed("a chunk without a size") }
        var size = 0
        for byte in digits {
            guard let digit = EtcdLines.hexDigit(byte) else {
                throw .malformed("a chunk size that is not hexadecimal: \(String(decoding: digits.prefix(20), as: UTF8.self))")
            }
            // A size past 2^31 is no chunk the client would accept in any case.
            guard size <= Int(Int32.max) >> 4 else { throw .tooLarge("a chunk", limit: Int(Int32.max)) }
            size = size << 4 | digit
        }
        return size
    }
}

/// The messages of a watch's stream: JSON objects, each ended by a newline (the
/// gateway's delimiter), cut from the decoded body whatever its chunks were. A message
/// past the answer limit is an error, so one message never holds more.
struct EtcdMessageSplitter: Sendable {
    let limit: Int
    private var pending: [UInt8] = []

    init(limit: Int) { self.limit = limit }

    /// The messages that `bytes` completes, in order (blank lines skipped).
    mutating func messages(_ bytes: ArraySlice<UInt8>) throws(EtcdWireError) -> [[UInt8]] {
        var found: [[UInt8]] = []
        var start = bytes.startIndex
        while let newline = bytes[start...].firstIndex(of: UInt8(ascii: "\n")) {
            let piece = bytes[start..<newline]
            start = newline + 1
            guard pending.count + piece.count <= limit else { throw .tooLarge("a watch message", limit: limit) }
            pending += piece
            if !EtcdLines.trimmed(pending[...]).isEmpty { found.append(pending) }
            pending.removeAll(keepingCapacity: true)
        }
        let rest = bytes[start...]
        guard pending.count + rest.count <= limit else { throw .tooLarge("a watch message", limit: limit) }
        pending += rest
        return found
    }

    /// What is left at the stream's end: a last message without its newline, if any.
    mutating func finish() -> [UInt8]? {
        defer { pending.removeAll() }
        return EtcdLines.trimmed(pending[...]).isEmpty ? nil : pending
    }
}

/// Byte helpers for the parsers above.
enum EtcdLines {
    /// The first empty line (CRLF CRLF, or LF LF) within `limit` bytes: where it starts
    /// and the index after it.
    static func blankLine(in bytes: ArraySlice<UInt8>, within limit: Int) -> (lineStart: Int, after: Int)? {
        var index = bytes.startIndex
        let end = min(bytes.endIndex, bytes.startIndex + limit)
        var lineStart = index
        while index < end {
            if bytes[index] == UInt8(ascii: "\n") {
                let line = bytes[lineStart..<index]
                if line.isEmpty || line.elementsEqual([UInt8(ascii: "\r")]) { return (lineStart, index + 1) }
                lineStart = index + 1
            }
            index += 1
        }
        return nil
    }

    /// The lines of `bytes` (LF or CRLF endings), without their endings.
    static func split(_ bytes: ArraySlice<UInt8>) -> [ArraySlice<UInt8>] {
        bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).compactMap { line in
            let text = line.last == UInt8(ascii: "\r") ? line.dropLast() : line
            return text.isEmpty ? nil : text
        }
    }

    static func trimmed(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        func space(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || byte == 0x0d || byte == 0x0a }
        guard let first = bytes.firstIndex(where: { !space($0) }), let last = bytes.lastIndex(where: { !space($0) }) else {
            return bytes[bytes.endIndex...]
        }
        return bytes[first...last]
    }

    static func lowercased(_ bytes: ArraySlice<UInt8>) -> String {
        String(decoding: bytes.map { (0x41...0x5a).contains($0) ? $0 + 0x20 : $0 }, as: UTF8.self)
    }

    static func digit(_ byte: UInt8) -> Int? { (0x30...0x39).contains(byte) ? Int(byte - 0x30) : nil }

    static func hexDigit(_ byte: UInt8) -> Int? {
        switch byte {
        case 0x30...0x39: Int(byte - 0x30)
        case 0x41...0x46: Int(byte - 0x41 + 10)
        case 0x61...0x66: Int(byte - 0x61 + 10)
        default: nil
        }
    }

    /// Decimal digits only (no sign, no space inside), at most 18 of them (no overflow).
    static func decimal(_ bytes: ArraySlice<UInt8>) -> Int? {
        guard !bytes.isEmpty, bytes.count <= 18 else { return nil }
        var value = 0
        for byte in bytes {
            guard let digit = digit(byte) else { return nil }
            value = value * 10 + digit
        }
        return value
    }
}
