import AsyncFileIO
import SystemPackage

/// One file of the coordination space's protocol: a request, a reply, a presenter's
/// registration or a process's record. Specified in `docs/protocol.md`.
///
/// The format is text, one field per line, `key value`, between a version line
/// (`filecoord 1`) and an `end` line (so a truncated file is told from a whole one).
/// Values are percent-encoded bytes: everything outside `!`...`~`, and `%` itself, is
/// written `%XX`, so paths with spaces, newlines or bytes that are not UTF-8 survive.
package struct SpaceMessage: Sendable, Equatable {
    static let version = 1
    static let maximumSize = 64 * 1024

    var kind: String
    /// The fields, sorted by key, each key once: a message has a handful, so a sorted
    /// array is cheaper to build and search than a dictionary (whose hashing and growth
    /// were 3.6% of a writer's samples, making three messages per remote write).
    private(set) var fields: [Field] = []

    /// One `key value` line.
    struct Field: Sendable, Equatable {
        var key: String
        var value: [UInt8]
    }

    init(kind: String) {
        self.kind = kind
        fields.reserveCapacity(8)
    }

    /// A message with many fields at once (`fields` need not be sorted; keys unique).
    init(kind: String, fields: [Field]) {
        self.kind = kind
        self.fields = fields.sorted { $0.key < $1.key }
    }

    subscript(key: String) -> [UInt8]? {
        get { fields.first { $0.key == key }?.value }
        set {
            // Fields are usually set in order: the search starts from the end.
            var index = fields.endIndex
            while index > fields.startIndex, key < fields[index - 1].key { index -= 1 }
            if index > fields.startIndex, fields[index - 1].key == key {
                if let newValue { fields[index - 1].value = newValue } else { fields.remove(at: index - 1) }
            } else if let newValue {
                fields.insert(Field(key: key, value: newValue), at: index)
            }
        }
    }

    func string(_ key: String) -> String? { self[key].map { String(decoding: $0, as: UTF8.self) } }
    func path(_ key: String) -> FilePath? {
        guard let bytes = self[key], bytes.first == UInt8(ascii: "/"), !bytes.contains(0) else { return nil }
        return FilePath(platformBytes: bytes)
    }
    func number(_ key: String) -> UInt64? { string(key).flatMap { UInt64($0) } }

    mutating func set(_ key: String, _ value: String) { self[key] = Array(value.utf8) }
    mutating func set(_ key: String, _ value: FilePath) { self[key] = value.platformBytes }

    // MARK: Encoding

    package func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64 + fields.reduce(0) { $0 + $1.key.utf8.count + 2 + 3 * $1.value.count })
        out.append(contentsOf: "filecoord \(Self.version)\nkind ".utf8)
        out.append(contentsOf: kind.utf8)
        out.append(UInt8(ascii: "\n"))
        for field in fields {
            out.append(contentsOf: field.key.utf8)
            out.append(UInt8(ascii: " "))
            Self.percentEncode(field.value, into: &out)
            out.append(UInt8(ascii: "\n"))
        }
        out.append(contentsOf: "end\n".utf8)
        return out
    }

    /// Parses a whole message; nil for anything else (another version, a truncated or
    /// foreign file), with the reason. One pass over the bytes, no array of lines.
    package static func decode(_ bytes: some Collection<UInt8>) -> Result<SpaceMessage, MalformedReason> {
        guard bytes.count <= maximumSize else { return .failure(.tooLarge) }
        if let result = bytes.withContiguousStorageIfAvailable({ decode(buffer: $0) }) { return result }
        return Array(bytes).withUnsafeBufferPointer { decode(buffer: $0) }
    }

    private static let header = Array("filecoord \(version)".utf8)
    private static let headerPrefix = Array("filecoord ".utf8)
    private static let endLine = Array("end".utf8)

    private static func decode(buffer: UnsafeBufferPointer<UInt8>) -> Result<SpaceMessage, MalformedReason> {
        let newline = UInt8(ascii: "\n")
        // A whole message ends with its `end` line and that line's newline.
        guard buffer.last == newline else { return .failure(.truncated) }
        var message = SpaceMessage(kind: "")
        var start = 0, lineNumber = 0, ended = false, outOfOrder = false
        while start < buffer.count {
            var stop = start
            while buffer[stop] != newline { stop += 1 } // stops at the final newline at the latest
            let line = UnsafeBufferPointer(rebasing: buffer[start..<stop])
            defer { (start, lineNumber) = (stop + 1, lineNumber + 1) }
            if lineNumber == 0 {
                guard line.elementsEqual(header) else {
                    return .failure(line.starts(with: headerPrefix) ? .unsupportedVersion : .notAMessage)
                }
                continue
            }
            // Anything after the `end` line: not one whole message.
            guard !ended else { return .failure(.truncated) }
            if line.elementsEqual(endLine) {
                ended = true
                continue
            }
            guard let space = line.firstIndex(of: UInt8(ascii: " ")) else { return .failure(.badField) }
            let key = String(decoding: UnsafeBufferPointer(rebasing: line[..<space]), as: UTF8.self)
            guard let value = percentDecode(UnsafeBufferPointer(rebasing: line[(space + 1)...])) else { return .failure(.badField) }
            if key == "kind" {
                message.kind = String(decoding: value, as: UTF8.self)
            } else {
                if let last = message.fields.last, key <= last.key { outOfOrder = true }
                message.fields.append(Field(key: key, value: value))
            }
        }
        guard ended else { return .failure(.truncated) }
        if outOfOrder {
            // Not written by us (we write keys sorted): sorted once, the last of a
            // repeated key kept, as a file read line by line into a dictionary would.
            var sorted: [Field] = []
            for field in message.fields.enumerated().sorted(by: { ($0.element.key, $0.offset) < ($1.element.key, $1.offset) }).map(\.element) {
                if sorted.last?.key == field.key { sorted[sorted.count - 1] = field } else { sorted.append(field) }
            }
            message.fields = sorted
        }
        guard !message.kind.isEmpty else { return .failure(.badField) }
        return .success(message)
    }

    package enum MalformedReason: String, Error, Sendable {
        case tooLarge = "larger than 64 KiB"
        case truncated = "truncated (no end line)"
        case unsupportedVersion = "written for another protocol version"
        case notAMessage = "not a filecoord message"
        /// Its `fstat` or `read` failed: it may be whole, and is read again later.
        case unreadable = "could not be read"
        case badField = "a field is malformed"
        /// An empty message file: a slot already read, or a file an earlier sender made
        /// ahead and closed unused (removed without a warning).
        case empty = "empty"
    }

    static func percentEncode(_ bytes: [UInt8], into out: inout [UInt8]) {
        for byte in bytes {
            if byte > 0x20 && byte < 0x7F && byte != UInt8(ascii: "%") {
                out.append(byte)
            } else {
                out.appendPercentEscape(byte)
            }
        }
    }

    static func percentDecode(_ bytes: some Collection<UInt8>) -> [UInt8]? {
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var iterator = bytes.makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = iterator.next().flatMap(nibble), let low = iterator.next().flatMap(nibble) else { return nil }
                out.append(high << 4 | low)
            } else if byte > 0x20 && byte < 0x7F {
                out.append(byte)
            } else {
                return nil
            }
        }
        return out
    }
}
