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
        guard url.isFileURL else {
            throw FileCoordinationError(code: .notFileURL, path: nil, operation: "open",
                                        message: "\(url.absoluteString) is not a file URL")
        }
        let encoded = url.baseURL == nil ? url.path(percentEncoded: true) : url.absoluteURL.path(percentEncoded: true)
        // The common case, nothing escaped: the string is the path.
        var escaped = true
        var encodedCopy = encoded
        encodedCopy.withUTF8 { bytes in
            escaped = bytes.isEmpty || memchr(bytes.baseAddress!, Int32(UInt8(ascii: "%")), bytes.count) != nil
        }
        if !escaped {
            var path = FilePath(encoded)
            if encoded.utf8.last == UInt8(ascii: "/"), encoded.utf8.count > 1 { path = FilePath(String(encoded.dropLast())) }
            self = path
            return
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(encoded.utf8.count)
        var iterator = encoded.utf8.makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%"), let high = iterator.next().flatMap(Self.hexValue),
               let low = iterator.next().flatMap(Self.hexValue)
            {
                bytes.append(high << 4 | low)
            } else {
                bytes.append(byte)
            }
        }
        guard !bytes.isEmpty, !bytes.contains(0) else {
            throw FileCoordinationError(code: .notFileURL, path: nil, operation: "open",
                                        message: "\(url.absoluteString) has no usable file-system path")
        }
        // Foundation keeps a trailing slash for directory URLs; a path does not need it.
        if bytes.count > 1, bytes.last == UInt8(ascii: "/") { bytes.removeLast() }
        self = FilePath(platformBytes: bytes)
    }

    /// A `file:` URL for this path. Every byte outside the unreserved set is
    /// percent-escaped, so any name a Linux file can have round-trips exactly through
    /// ``init(fileURL:)``.
    public var fileURL: URL {
        // Bytes first, one string at the end: appending to a `String` per byte cost more
        // than the URL parse itself.
        var bytes: [UInt8] = []
        withPlatformString { pointer in
            let count = strlen(pointer)
            bytes.reserveCapacity(7 + count)
            bytes.append(contentsOf: "file://".utf8)
            for index in 0 ..< count {
                let byte = UInt8(bitPattern: pointer[index])
                if Self.isUnreserved(byte) {
                    bytes.append(byte)
                } else {
                    bytes.appendPercentEscape(byte)
                }
            }
        }
        return URL(string: String(decoding: bytes, as: UTF8.self))!
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

    private static func hexValue(_ byte: UInt8) -> UInt8? {
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
    @_spi(FileCoordinationInternal)
    public mutating func appendPercentEscape(_ byte: UInt8) {
        func digit(_ nibble: UInt8) -> UInt8 { nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "A") + nibble - 10 }
        append(UInt8(ascii: "%"))
        append(digit(byte >> 4))
        append(digit(byte & 0xF))
    }
}
