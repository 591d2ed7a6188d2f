import AsyncFileIO
import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The paths coordinations start from: a URL's absolute, normalized path (made canonical
/// by ``CanonicalPaths`` afterwards), with the one-entry cache of the last URL converted.
extension FileCoordinator {
    /// ``normalizedPath(_:)`` with its bytes, from the one-entry cache when `url` is the
    /// last one converted. Only absolute URLs are kept: a relative one depends on the
    /// current directory at the time.
    func itemPath(_ url: URL) throws(FileCoordinationError) -> (path: FilePath, key: PathKey) {
        if let last = lastItem.withLock({ $0 }), last.url == url { return (last.path, last.key) }
        let given = try FilePath(fileURL: url)
        let path = Self.normalized(given)
        let key = PathKey(path.platformBytes)
        if !given.isRelative { lastItem.withLock { $0 = (url, path, key) } }
        return (path, key)
    }

    /// The path that claims and presenters of the item at `path` meet on, as `status`
    /// names them (``CanonicalPaths``): for `filecoord`'s diagnostics. Blocking (it may
    /// resolve links): on an I/O thread.
        package static func claimPath(of path: FilePath, followingLast: Bool) -> FilePath {
        CanonicalPaths.canonicalNow(normalized(path), followingLast: followingLast)
    }

    /// The absolute, normalized path of a `file:` URL (see ``normalized(_:)``).
    static func normalizedPath(_ url: URL) throws(FileCoordinationError) -> FilePath {
        normalized(try FilePath(fileURL: url))
    }

    /// `path` made absolute (against the current directory), without `.` components or
    /// doubled separators; its `..` components are left for ``CanonicalPaths`` to resolve
    /// as the kernel does (`normalizedKeepingParents()`).
    static func normalized(_ path: FilePath) -> FilePath {
        let absolute = path.isRelative ? FilePath.currentDirectory.pushing(path) : path
        return needsNormalizing(absolute) ? absolute.normalizedKeepingParents() : absolute
    }

    /// Whether a path has `.` or `..` components or doubled separators (normalizing
    /// costs more than this scan, and almost no path needs it).
    private static func needsNormalizing(_ path: FilePath) -> Bool {
        path.withPlatformString { needsNormalizing($0) }
    }

    /// ``needsNormalizing(_:)-(FilePath)`` for a NUL-terminated path; a trailing separator
    /// (which a `FilePath` never has) needs it too.
    private static func needsNormalizing(_ pointer: UnsafePointer<CChar>) -> Bool {
        var previous: CChar = 0
        var index = 0
        while pointer[index] != 0 {
            let char = pointer[index]
            if char == 0x2F /* / */ && previous == 0x2F { return true }
            if char == 0x2E /* . */ && (previous == 0x2F || previous == 0x2E) {
                let next = pointer[index + 1]
                if next == 0 || next == 0x2F || (previous == 0x2E && index >= 2 && pointer[index - 2] == 0x2F) { return true }
                if next == 0x2E && (pointer[index + 2] == 0 || pointer[index + 2] == 0x2F) { return true }
            }
            previous = char
            index += 1
        }
        return previous == 0x2F && index > 1
    }

    /// The bytes of `path` made absolute and normalized: its own bytes when they already
    /// are (no `FilePath` is made then), else through ``normalized(_:)``.
    static func normalizedBytes(_ path: PlatformPath) -> [UInt8] {
        let own: [UInt8]? = path.withCString { pointer in
            guard pointer[0] == 0x2F, !needsNormalizing(pointer) else { return nil }
            return Array(UnsafeRawBufferPointer(start: pointer, count: strlen(pointer)))
        }
        return own ?? normalized(path.filePath).platformBytes
    }
}
