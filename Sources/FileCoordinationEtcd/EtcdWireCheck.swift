/// What the etcd client's parsers must do whatever the bytes: the property that
/// `make fuzz` (`Fuzz/EtcdParsersFuzzer.swift`, which compiles this file with the parsers)
/// checks on generated inputs, and a test checks on the kept corpus and on every input that
/// once crashed. The first byte of an input chooses the size of the pieces it is cut into;
/// the rest goes through every parser with small bounds, so that they are reached.
enum EtcdWireCheck {
    static let limits = EtcdLimits(headBytes: 512, answerBytes: 4096, lineBytes: 64)

    /// What went wrong with `input`, if anything: each parser must end (throwing, or with
    /// a result within its bounds), and give the same result however the bytes are cut.
    static func violations(_ input: [UInt8]) -> [String] {
        guard let first = input.first else { return [] }
        let piece = 1 + Int(first % 64)
        let bytes = Array(input.dropFirst())
        var found: [String] = []
        found += head(bytes)
        found += chunked(bytes, piece: piece)
        found += messages(bytes, piece: piece)
        let answer = EtcdAnswer.parse(status: 400, body: bytes)
        if answer.code == nil, answer.message.utf8.count > 200 * 4 { found.append("a text answer's message is not cut at 200 bytes") }
        return found
    }

    /// The head: found where it ends, the same in a longer input, absent from a shorter one.
    static func head(_ bytes: [UInt8]) -> [String] {
        guard let (head, size) = try? EtcdHTTPHead.parse(bytes[...], limits: limits) else { return [] }
        var found: [String] = []
        if size <= 0 || size > bytes.count || size > limits.headBytes { found.append("a head of \(size) bytes in \(bytes.count)") }
        if case .length(let length) = head.framing, length < 0 || length > limits.answerBytes {
            found.append("a body length of \(length) accepted")
        }
        if !(100...599).contains(head.status) { found.append("the status \(head.status) accepted") }
        if size > 0, size <= bytes.count {
            let alone = try? EtcdHTTPHead.parse(bytes[..<size], limits: limits)
            if alone?.head != head || alone?.size != size { found.append("the head parsed differently without what follows it") }
            if (try? EtcdHTTPHead.parse(bytes[..<(size - 1)], limits: limits)) != nil {
                found.append("a head found one byte before its end")
            }
        }
        return found
    }

    /// A chunked body: decoded alike in one piece and in pieces, within its bound.
    static func chunked(_ bytes: [UInt8], piece: Int) -> [String] {
        let whole = decode(bytes, piece: bytes.count + 1)
        let cut = decode(bytes, piece: piece)
        var found: [String] = []
        if whole != cut { found.append("a chunked body decoded differently in pieces of \(piece): \(whole) against \(cut)") }
        if whole.body.count > limits.answerBytes { found.append("a chunked body of \(whole.body.count) bytes accepted") }
        return found
    }

    struct Decoded: Equatable, CustomStringConvertible {
        var body: [UInt8] = []
        /// Bytes used, when no error.
        var used = 0
        var done = false
        var error: EtcdWireError?
        var description: String { "(\(body.count) bytes, \(used) used, done: \(done), \(error.map { "\($0)" } ?? "no error"))" }
    }

    /// `bytes` through a chunk decoder in pieces of `piece`, the unused rest kept for the
    /// next piece as the connection does.
    static func decode(_ bytes: [UInt8], piece: Int) -> Decoded {
        var decoder = EtcdChunkDecoder(limits: limits, bodyLimit: limits.answerBytes)
        var result = Decoded()
        var pending: [UInt8] = []
        var offset = 0
        while !decoder.isDone, offset < bytes.count {
            pending += bytes[offset..<min(bytes.count, offset + piece)]
            offset += piece
            do {
                let used = try decoder.decode(pending[...], into: &result.body)
                guard used >= 0, used <= pending.count else { return Decoded(error: .malformed("\(used) bytes used of \(pending.count)")) }
                result.used += used
                pending.removeFirst(used)
            } catch {
                // What a call that throws had used is not said: only the body and the error count.
                result.error = error
                result.used = 0
                return result
            }
        }
        result.done = decoder.isDone
        return result
    }

    /// A stream's messages: the same however the bytes are cut, each within the bound, and
    /// each decoded (or refused) as a watch message without a crash.
    static func messages(_ bytes: [UInt8], piece: Int) -> [String] {
        func split(_ size: Int) -> Result<[[UInt8]], EtcdWireError> {
            var splitter = EtcdMessageSplitter(limit: limits.answerBytes)
            var all: [[UInt8]] = []
            var offset = 0
            do {
                while offset < bytes.count {
                    all += try splitter.messages(bytes[offset..<min(bytes.count, offset + size)])
                    offset += size
                }
            } catch {
                return .failure(error)
            }
            if let last = splitter.finish() { all.append(last) }
            return .success(all)
        }
        let whole = split(bytes.count + 1), cut = split(piece)
        var found: [String] = []
        switch (whole, cut) {
        case (.success(let a), .success(let b)) where a != b: found.append("messages split differently in pieces of \(piece)")
        case (.success, .failure), (.failure, .success): found.append("messages refused in one cut and not in another")
        default: break
        }
        for message in (try? whole.get()) ?? [] {
            if message.count > limits.answerBytes { found.append("a message of \(message.count) bytes accepted") }
            if case .events(let events, let last)? = try? EtcdWatchMessage.decode(message) {
                let revisions = events.compactMap { EtcdJSON.revision($0.kv?.mod_revision) }
                if last != revisions.max() { found.append("events whose last revision is \(String(describing: last)), not \(String(describing: revisions.max()))") }
            }
        }
        return found
    }
}
