import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

extension FilePath {
    /// The path of a `file:` URL, with the exact bytes of its name: percent-escapes are
    /// decoded byte by byte, so names that are not valid UTF-8 survive the round trip
    /// through ``fileURL`` (Foundation's own file-system representation on Linux does
    /// not keep them).
    ///
    /// - Throws: ``FileCoordinationError`` with code ``FileCoordinationError/Code/notFileURL``
    ///   for any other URL.
    public init(fileURL url: URL) throws(FileCoordinationError) {
        self = try PlatformPath(fileURL: url).filePath
    }

    /// A `file:` URL for this path. Every byte outside the unreserved set is
    /// percent-escaped, so any absolute path a Linux file can have round-trips exactly
    /// through ``init(fileURL:)``.
    ///
    /// A relative path is taken from the current directory now, as
    /// `URL(fileURLWithPath:)` does: `FilePath("notes/a.txt").fileURL` names
    /// `<current directory>/notes/a.txt`. (When the current directory has been deleted,
    /// the URL goes through `/proc/self/cwd`, which is only meaningful in this process.)
    public var fileURL: URL {
        // Bytes first, one string at the end: appending to a `String` per byte cost more
        // than the URL parse itself.
        var bytes: [UInt8] = []
        withPlatformString { pointer in
            let count = strlen(pointer)
            bytes.reserveCapacity(7 + count)
            bytes.append(contentsOf: "file://".utf8)
            if pointer[0] != CChar(bitPattern: UInt8(ascii: "/")) {
                // Without this, "file://" + "notes/a.txt" would make `notes` the URL's
                // host and `/a.txt` its path.
                Self.appendCurrentDirectory(to: &bytes)
            }
            Self.appendEscaped(UnsafeRawBufferPointer(start: pointer, count: count), to: &bytes)
        }
        return URL(string: String(decoding: bytes, as: UTF8.self))!
    }

    private static func appendEscaped(_ raw: UnsafeRawBufferPointer, to bytes: inout [UInt8]) {
        for byte in raw {
            if isUnreserved(byte) {
                bytes.append(byte)
            } else {
                bytes.appendPercentEscape(byte)
            }
        }
    }

    /// Appends the current directory, escaped, and a separator.
    private static func appendCurrentDirectory(to bytes: inout [UInt8]) {
        if let directory = getcwd(nil, 0) {
            defer { free(directory) }
            appendEscaped(UnsafeRawBufferPointer(start: directory, count: strlen(directory)), to: &bytes)
        } else {
            bytes.append(contentsOf: "/proc/self/cwd".utf8)
        }
        if bytes.last != UInt8(ascii: "/") { bytes.append(UInt8(ascii: "/")) }
    }

    /// This path with the symbolic links of its last component followed, as a write
    /// follows them (for the claim of a write to name the file that changes). Blocks:
    /// call it on an I/O thread.
        package func resolvingSymbolicLinks() throws(FileCoordinationError) -> FilePath {
        try AtomicReplacement.resolvingLinks(self).get()
    }

    private static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a") ... UInt8(ascii: "z"), UInt8(ascii: "A") ... UInt8(ascii: "Z"),
             UInt8(ascii: "0") ... UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
             UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "/"):
            true
        default:
            false
        }
    }

    fileprivate static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0") ... UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a") ... UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A") ... UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

extension Array where Element == UInt8 {
    /// Appends `byte` as `%XY` (upper-case hex): the escape of file URLs, and of the
    /// coordination space's messages.
        package mutating func appendPercentEscape(_ byte: UInt8) {
        func digit(_ nibble: UInt8) -> UInt8 { nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "A") + nibble - 10 }
        append(UInt8(ascii: "%"))
        append(digit(byte >> 4))
        append(digit(byte & 0xF))
    }
}

/// A path as the kernel takes it: its bytes and a terminating NUL. The batch's workers
/// open files through one without making a `FilePath` (swift-system normalizes the
/// separators of every new one, byte by byte: a few percent of a batch of small files);
/// ``filePath`` makes one when it is asked for.
package struct PlatformPath: Sendable {
    private enum Storage: Sendable {
        case path(FilePath)
        /// NUL-terminated.
        case bytes([CChar])
    }

    private let storage: Storage

    public init(_ path: FilePath) {
        storage = .path(path)
    }

    /// The path of a `file:` URL, as ``FilePath/init(fileURL:)`` decodes it (the
    /// separators as the URL has them: the kernel takes `a//b` as `a/b`).
    public init(fileURL url: URL) throws(FileCoordinationError) {
        guard url.isFileURL else {
            throw FileCoordinationError(.open, code: .notFileURL, path: nil, message: "\(url.absoluteString) is not a file URL")
        }
        let encoded = url.baseURL == nil ? url.path(percentEncoded: true) : url.absoluteURL.path(percentEncoded: true)
        var chars: [CChar] = []
        chars.reserveCapacity(encoded.utf8.count + 1)
        var contiguous = encoded
        let copied = contiguous.withUTF8 { bytes in
            // The common case, nothing escaped: the bytes are the path's, copied at once.
            guard let base = bytes.baseAddress, memchr(base, Int32(UInt8(ascii: "%")), bytes.count) == nil else { return false }
            chars.append(contentsOf: UnsafeRawBufferPointer(bytes).bindMemory(to: CChar.self))
            return true
        }
        var iterator = encoded.utf8.makeIterator()
        while !copied, let byte = iterator.next() {
            if byte == UInt8(ascii: "%"), let highDigit = iterator.next(), let high = FilePath.hexValue(highDigit),
               let lowDigit = iterator.next(), let low = FilePath.hexValue(lowDigit)
            {
                // An escaped slash or NUL stays escaped, as Foundation keeps it in the path
                // it opens: no name holds either, so `a%2Fb` names the file `a%2Fb`.
                if high << 4 | low == UInt8(ascii: "/") || high << 4 | low == 0 {
                    chars += [byte, highDigit, lowDigit].map { CChar(bitPattern: $0) }
                } else {
                    chars.append(CChar(bitPattern: high << 4 | low))
                }
            } else {
                chars.append(CChar(bitPattern: byte))
            }
        }
        guard !chars.isEmpty, !chars.contains(0) else {
            throw FileCoordinationError(.open, code: .notFileURL, path: nil, message: "\(url.absoluteString) has no usable file-system path")
        }
        // Foundation keeps a trailing slash for directory URLs; a path does not need it.
        if chars.count > 1, chars.last == CChar(bitPattern: UInt8(ascii: "/")) { chars.removeLast() }
        chars.append(0)
        storage = .bytes(chars)
    }

    /// The path as a `FilePath` (made now when it was given as bytes).
    public var filePath: FilePath {
        switch storage {
        case .path(let path): path
        case .bytes(let chars): chars.withUnsafeBufferPointer { FilePath(platformString: $0.baseAddress!) }
        }
    }

    /// Calls `body` with the NUL-terminated path.
    public func withCString<Result>(_ body: (UnsafePointer<CChar>) throws -> Result) rethrows -> Result {
        switch storage {
        case .path(let path): try path.withPlatformString(body)
        case .bytes(let chars): try chars.withUnsafeBufferPointer { try body($0.baseAddress!) }
        }
    }
}
