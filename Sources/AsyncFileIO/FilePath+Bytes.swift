import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

extension FilePath {
    /// The path's bytes, exactly as the kernel sees them (no terminating NUL).
        package var platformBytes: [UInt8] {
        withPlatformString { Array(UnsafeRawBufferPointer(start: $0, count: strlen($0))) }
    }

    /// A path from its bytes (which must not contain NUL), names that are not UTF-8 included.
        package init(platformBytes bytes: some Collection<UInt8>) {
        if let path = bytes.withContiguousStorageIfAvailable({ FilePath(platformBuffer: UnsafeRawBufferPointer($0)) }) {
            self = path
        } else {
            self = Array(bytes).withUnsafeBytes { FilePath(platformBuffer: $0) }
        }
    }

    /// A path from the bytes in `buffer` (which must not contain NUL), copied once.
        package init(platformBuffer buffer: UnsafeRawBufferPointer) {
        self = withUnsafeTemporaryAllocation(of: CChar.self, capacity: buffer.count + 1) { chars in
            if let base = buffer.baseAddress { memcpy(chars.baseAddress!, base, buffer.count) }
            chars[buffer.count] = 0
            return FilePath(platformString: chars.baseAddress!)
        }
    }

    /// Whether the normalized absolute path `inner` is `outer` or inside it: a byte prefix
    /// that ends at a separator. (`FilePath.starts(with:)` gives the same answer at many
    /// times the cost, and the coordination rules ask for every pair of claims.)
        package static func isAtOrInside(_ inner: [UInt8], _ outer: [UInt8]) -> Bool {
        guard inner.count >= outer.count else { return false }
        guard !outer.isEmpty else { return true }
        let prefix = inner.withUnsafeBytes { i in outer.withUnsafeBytes { o in memcmp(i.baseAddress!, o.baseAddress!, o.count) == 0 } }
        guard prefix else { return false }
        return inner.count == outer.count || outer.last == UInt8(ascii: "/") || inner[outer.count] == UInt8(ascii: "/")
    }
}
