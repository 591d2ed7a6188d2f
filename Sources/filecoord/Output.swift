import CFilecoordCommand
import FileCoordination
import AsyncFileIO
import Foundation

/// Everything the tool prints.
///
/// A path in a line of text is ``displayed(_:)``: escaped where its bytes would break the
/// line (a newline) or are not UTF-8. In JSON, ``JSONLines/text(_:)`` adds the exact bytes in
/// base64 when the name is not UTF-8.
enum Output {
    static let standardErrorIsTerminal = isatty(2) != 0
    static let standardOutputIsTerminal = isatty(1) != 0

    /// `filecoord: <message>` on stderr, one line: a control character in the message (a
    /// newline in a name it quotes, say) is escaped as in ``displayed(_:)``.
    static func error(_ message: String) {
        line("filecoord: ", message)
    }

    /// `prefix` and `message` on stderr, one line: a control character in the message is
    /// escaped as in ``displayed(_:)``.
    static func line(_ prefix: String, _ message: String) {
        writeStandardError(Array((prefix + oneLine(message) + "\n").utf8))
    }

    /// `message` with its control characters escaped as in ``displayed(_:)``.
    static func oneLine(_ message: String) -> String {
        var line = ""
        for scalar in message.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7f { line += escaped(UInt8(scalar.value)) } else { line.unicodeScalars.append(scalar) }
        }
        return line
    }

    /// `filecoord: <path>: <what failed>: <cause> (<ERRNO>)` on stderr: the library's
    /// steps in words (``words(_:)``), a timeout as ETIMEDOUT, and the path once.
    static func report(_ failure: FileCoordinationError) {
        writeStandardError(reportLine(failure))
    }

    /// ``report(_:)``'s line.
    static func reportLine(_ failure: FileCoordinationError) -> [UInt8] {
        var line = Array("filecoord: ".utf8)
        var message = words(failure.message)
        if let path = failure.path {
            line += Array("\(displayed(path)): ".utf8)
            // A presenter in another process names its item, which the line names already.
            message = message.replacingOccurrences(of: "the presenter of \(path) in process", with: "the presenter in process")
        }
        line += Array("\(words(failure.operation)) failed: \(oneLine(message))".utf8)
        if let errno = failure.errno {
            line += Array(" (\(errno.symbolicName))".utf8)
        } else if failure.code == .timedOut {
            line += Array(" (ETIMEDOUT)".utf8)
        }
        line.append(UInt8(ascii: "\n"))
        return line
    }

    /// The library names its steps as Swift does (`coordinate`, a presenter callback's
    /// `relinquishPresentedItem(toWriter:)`); a script's reader gets words.
    static func words(_ text: String) -> String {
        var text = text
        for (swift, words) in stepWords where text.contains(swift) {
            text = text.replacingOccurrences(of: swift, with: words)
        }
        return text == "coordinate" ? "claim" : text
    }

    private static let stepWords: [(String, String)] = [
        ("relinquishPresentedItem(toWriter:)", "relinquish to a writer"),
        ("relinquishPresentedItem(toReader:)", "relinquish to a reader"),
        ("savePresentedItemChanges()", "save"),
        ("accommodatePresentedItemDeletion()", "accommodate the deletion"),
        ("accommodatePresentedSubitemDeletion(at:)", "accommodate a deletion inside"),
        ("presentedItemDidChange()", "didChange"),
        ("presentedItemDidMove(to:)", "didMove"),
        ("presentedItemDidLoseEvents()", "resync"),
        ("presentedSubitemDidAppear(at:)", "subitemDidAppear"),
        ("presentedSubitemDidChange(at:)", "subitemDidChange"),
        ("presentedSubitem(at:didMoveTo:)", "subitemDidMove"),
        ("presentedItemIsPartlyUnwatched(_:)", "unwatched"),
    ]

    /// `path` for a line of text: its characters as they are, except a backslash, a
    /// control character (a newline, a tab) and each byte that is not part of valid UTF-8,
    /// which are written as `\\`, `\n`, `\t`, `\r` or `\ooo` (octal), as `ls
    /// --quoting-style=escape` writes them. A line stays one line, the text stays UTF-8,
    /// and the exact name can be recovered from it.
    static func displayed(_ path: FilePath) -> String {
        let bytes = path.platformBytes
        var text = ""
        text.reserveCapacity(bytes.count)
        func escape(_ byte: UInt8) { text += escaped(byte) }
        var index = 0
        while index < bytes.count {
            let length = validSequenceLength(bytes, at: index)
            guard length > 0 else {
                escape(bytes[index]) // not part of valid UTF-8
                index += 1
                continue
            }
            let sequence = bytes[index ..< index + length]
            let scalar = String(decoding: sequence, as: UTF8.self).unicodeScalars.first!
            if scalar.value < 0x20 || scalar.value == 0x7f || scalar == "\\" {
                escape(bytes[index])
            } else {
                text.unicodeScalars.append(scalar)
            }
            index += length
        }
        return text
    }

    /// One byte as an escape: `\\`, `\n`, `\t`, `\r`, or `\ooo` (octal).
    private static func escaped(_ byte: UInt8) -> String {
        switch byte {
        case UInt8(ascii: "\\"): return "\\\\"
        case UInt8(ascii: "\n"): return "\\n"
        case UInt8(ascii: "\t"): return "\\t"
        case UInt8(ascii: "\r"): return "\\r"
        default:
            let octal = String(byte, radix: 8)
            return "\\" + String(repeating: "0", count: 3 - octal.count) + octal
        }
    }

    /// The length of the well-formed UTF-8 sequence at `index` (1-4), or 0 when the bytes
    /// there are not one (a stray continuation byte, an overlong form, a surrogate, a
    /// value past U+10FFFF, a sequence cut short).
    private static func validSequenceLength(_ bytes: [UInt8], at index: Int) -> Int {
        let lead = bytes[index]
        let length: Int, second: ClosedRange<UInt8>
        switch lead {
        case 0x00 ... 0x7f: return 1
        case 0xc2 ... 0xdf: (length, second) = (2, 0x80 ... 0xbf)
        case 0xe0: (length, second) = (3, 0xa0 ... 0xbf)
        case 0xed: (length, second) = (3, 0x80 ... 0x9f)
        case 0xe1 ... 0xef: (length, second) = (3, 0x80 ... 0xbf)
        case 0xf0: (length, second) = (4, 0x90 ... 0xbf)
        case 0xf4: (length, second) = (4, 0x80 ... 0x8f)
        case 0xf1 ... 0xf3: (length, second) = (4, 0x80 ... 0xbf)
        default: return 0
        }
        guard index + length <= bytes.count, second.contains(bytes[index + 1]) else { return 0 }
        for offset in 2 ..< length where !(0x80 ... 0xbf).contains(bytes[index + offset]) { return 0 }
        return length
    }

    static func writeStandardError(_ bytes: [UInt8]) {
        _ = write(bytes, to: 2)
    }

    /// Writes to stdout on the calling thread (the demo's narration, `status`, `present`'s
    /// lines: a blocking write is what a reader that stops reading should cause). False
    /// when the write failed: the first failure is kept (``standardOutputFailure``), and
    /// the command then ends with status 1 and says so, where it would have said 0.
    @discardableResult
    static func writeStandardOutput(_ bytes: [UInt8]) -> Bool {
        let closed = fc_standard_descriptor_was_closed(1) != 0
        guard let failure = closed ? Errno.badFileDescriptor : write(bytes, to: 1) else { return true }
        outputFailure.withLock { $0 = $0 ?? failure }
        return false
    }

    /// Why a write to stdout failed first (`/dev/full`: ENOSPC), if one did.
    static var standardOutputFailure: FileCoordinationError? {
        outputFailure.withLock { $0 }.map { DescriptorWriter.failure(.write, $0, fd: 1, name: "stdout") }
    }
    private static let outputFailure = Locked<Errno?>(nil)

    /// nil once every byte is written; else the error that stopped the write.
    private static func write(_ bytes: [UInt8], to fd: Int32) -> Errno? {
        bytes.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = Foundation.write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return Errno(rawValue: n < 0 ? errno : EIO) }
                offset += n
            }
            return nil
        }
    }
}

/// Writes to a pipe, terminal or file descriptor the tool did not open (stdout) from a
/// thread of its own, so the blocking write never holds a cooperative-pool thread.
final class DescriptorWriter: Sendable {
    private let fd: Int32
    private let queue: DispatchQueue

    init(fd: Int32, label: String) {
        self.fd = fd
        queue = DispatchQueue(label: label)
    }

    func write(_ data: Data) async throws {
        let fd = self.fd
        if fc_standard_descriptor_was_closed(fd) != 0 { throw Self.failure(.write, .badFileDescriptor, fd: fd, name: "stdout") }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                let result: Result<Void, any Error> = data.withUnsafeBytes { raw in
                    var offset = 0
                    while offset < raw.count {
                        let n = Foundation.write(fd, raw.baseAddress! + offset, raw.count - offset)
                        if n < 0 {
                            if errno == EINTR { continue }
                            return .failure(Self.failure(.write, Errno(rawValue: errno), fd: fd, name: "/dev/fd/\(fd)"))
                        }
                        offset += n
                    }
                    return .success(())
                }
                continuation.resume(with: result)
            }
        }
    }

    /// Reads at most `count` bytes, on the writer's thread: empty only at the end. Waits
    /// for input on a descriptor inherited non-blocking; fails, naming `name`, when a read
    /// fails (what was read so far must not pass for the whole input).
    func readChunk(upToCount count: Int, name: String = "stdin") async throws(FileCoordinationError) -> Data {
        let fd = self.fd
        if fc_standard_descriptor_was_closed(fd) != 0 { throw Self.failure(.read, .badFileDescriptor, fd: fd, name: name) }
        let result: Result<Data, FileCoordinationError> = await withCheckedContinuation { continuation in
            queue.async {
                var buffer = Data(count: count)
                while true {
                    let n = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, count) }
                    if n < 0 && errno == EINTR { continue }
                    if n < 0 && errno == EAGAIN {
                        var wanted = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                        _ = poll(&wanted, 1, -1)
                        continue
                    }
                    if n < 0 {
                        continuation.resume(returning: .failure(FileCoordinationError(.read, errno: Errno(rawValue: errno), path: FilePath(name))))
                        return
                    }
                    buffer.count = n
                    continuation.resume(returning: .success(buffer))
                    return
                }
            }
        }
        return try result.get()
    }

    /// A failed `operation` on `fd`, named `name`; a standard descriptor closed when the
    /// tool started says so rather than what /dev/null in its place did.
    static func failure(_ operation: FileCoordinationError.Operation, _ errno: Errno, fd: Int32, name: String) -> FileCoordinationError {
        guard fc_standard_descriptor_was_closed(fd) != 0 else { return FileCoordinationError(operation, errno: errno, path: FilePath(name)) }
        return FileCoordinationError(operation, code: .closed, path: FilePath(name), errno: .badFileDescriptor,
                                     message: "it was closed when filecoord started")
    }

    /// Reads the descriptor to its end (standard input, a list), on the writer's thread.
    /// Fails, naming `name`, when a read fails (standard input closed, or a directory):
    /// what was read so far must not pass for the whole input.
    func readToEnd(name: String = "stdin") async throws(FileCoordinationError) -> Data {
        var data = Data()
        while true {
            let chunk = try await readChunk(upToCount: 1 << 16, name: name)
            if chunk.isEmpty { return data }
            data += chunk
        }
    }
}

/// Recovers the exact bytes of command-line arguments. Swift decodes `argv` into
/// `String`s, replacing bytes that are not UTF-8 (so two different names can decode
/// alike); a path must keep them. The parser is given ``parserArguments``: each argument
/// that is not UTF-8 is made unique there (its text, a private-use character and its
/// position), and ``bytes(_:)`` maps that text back to the argument's bytes.
enum RawArguments {
    private struct Decoded {
        var arguments: [String] = []
        var bytes: [String: [UInt8]] = [:]
    }

    private static let decoded: Decoded = {
        var decoded = Decoded()
        for index in 1 ..< Int(CommandLine.argc) {
            guard let pointer = CommandLine.unsafeArgv[index] else { continue }
            if let text = String(validatingCString: pointer) {
                decoded.arguments.append(text)
                continue
            }
            let bytes = Array(UnsafeBufferPointer(start: pointer, count: strlen(pointer))).map { UInt8(bitPattern: $0) }
            // `--option=VALUE`: only the value is a name.
            var prefix: [UInt8] = []
            var value = bytes[...]
            if bytes.starts(with: Array("--".utf8)), let equals = bytes.firstIndex(of: UInt8(ascii: "=")) {
                prefix = Array(bytes[...equals])
                value = bytes[(equals + 1)...]
            }
            let unique = String(decoding: value, as: UTF8.self) + "\u{F8FF}\(index)"
            let whole = String(decoding: prefix, as: UTF8.self) + unique
            decoded.bytes[unique] = Array(value)
            // The whole argument too: after `--` (exec's command) it is not an option.
            decoded.bytes[whole] = bytes
            decoded.arguments.append(whole)
        }
        return decoded
    }()

    /// The arguments (without the program's name) to parse.
    static var parserArguments: [String] { decoded.arguments }

    /// The path as it was typed, bytes and all.
    static func path(_ argument: String) -> FilePath {
        path(bytes: bytes(argument))
    }

    /// A name's bytes as a path. A trailing slash says the name is a directory (`cat f/`
    /// is ENOTDIR for a file); `FilePath` drops it, so it is kept as `/.`, which the kernel
    /// reads the same way and every claim normalizes away.
    static func path(bytes: [UInt8]) -> FilePath {
        let slash = UInt8(ascii: "/")
        guard bytes.count > 1, bytes.last == slash else { return FilePath(platformBytes: bytes) }
        return FilePath(platformBytes: bytes + [UInt8(ascii: ".")])
    }

    /// The argument's bytes as typed.
    static func bytes(_ argument: String) -> [UInt8] {
        decoded.bytes[argument] ?? Array(argument.utf8)
    }
}
