@_spi(FileCoordinationInternal) import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// One identity per item for claims and presenters: the item's *canonical path*, with
/// every symbolic link in its containing directories resolved, and the last component
/// resolved too when the coordination acts on what a link points to (a read, a write of
/// content). A delete, move or replace acts on the name itself and claims the link.
///
/// Otherwise `LINK` and its target, or `dirlink/f` and `dir/f`, would be different items,
/// and two writers of one file through two names would not exclude each other.
///
/// Cost, on the path of every coordination: the directory's resolution comes from a
/// cache (one lookup; `realpath(3)`, on an I/O thread, when a directory is new or its
/// entry is older than ``lifetime``), and following the last component is one
/// `readlink(2)` made inline (about 0.4 us here; it answers `EINVAL` at once for a file
/// that is not a link). A link changed less than ``lifetime`` ago may still be seen
/// through its old target by a process that resolved it just before.
enum CanonicalPaths {
    /// How long a directory's resolution is trusted.
    static let lifetime: Duration = .seconds(1)
    /// At most this many directories are remembered; past it the cache starts again.
    static let limit = 4096
    /// Links followed before giving up (as the kernel's `ELOOP`): the path is then left
    /// as it is, and the access itself reports the loop.
    static let maximumLinks = 40

    private struct Entry {
        var resolved: [UInt8]
        var made: ContinuousClock.Instant
    }

    private static let cache = Locked<[[UInt8]: Entry]>([:])

    /// The canonical form of `path` (absolute and lexically normalized), resolving what
    /// the cache does not know on an I/O thread. In the caller's isolation: a cached
    /// directory costs no executor hop (a caller on the main actor would pay two).
    static func canonical(_ path: FilePath, followingLast: Bool,
                          isolation: isolated (any Actor)? = #isolation) async -> FilePath {
        var bytes = path.platformBytes
        for _ in 0 ... maximumLinks {
            guard let (directory, name) = split(bytes) else { return path }
            let resolved: [UInt8]
            if let known = cached(directory) {
                resolved = known
            } else {
                let pending = directory
                resolved = (try? await runOnIOThread { resolveDirectory(pending) }) ?? directory
            }
            let joined = join(resolved, name)
            guard followingLast, let next = followOnce(joined) else { return FilePath(platformBytes: joined) }
            bytes = next
        }
        return path
    }

    /// ``canonical(_:followingLast:)`` that makes its system calls on the calling thread:
    /// for the blocking API and for the library's own threads.
    static func canonicalNow(_ path: FilePath, followingLast: Bool) -> FilePath {
        FilePath(platformBytes: canonicalNow(path.platformBytes, followingLast: followingLast))
    }

    /// ``canonicalNow(_:followingLast:)`` on a path's bytes (absolute, normalized).
    static func canonicalNow(_ path: [UInt8], followingLast: Bool) -> [UInt8] {
        var bytes = path
        for _ in 0 ... maximumLinks {
            guard let (directory, name) = split(bytes) else { return path }
            let joined = join(cached(directory) ?? resolveDirectory(directory), name)
            guard followingLast, let next = followOnce(joined) else { return joined }
            bytes = next
        }
        return path
    }

    /// The directory part (empty for an item in `/`) and the name; nil for `/` itself.
    private static func split(_ bytes: [UInt8]) -> ([UInt8], ArraySlice<UInt8>)? {
        guard bytes.count > 1, let slash = bytes.lastIndex(of: UInt8(ascii: "/")) else { return nil }
        return (Array(bytes[..<slash]), bytes[(slash + 1)...])
    }

    private static func join(_ directory: [UInt8], _ name: ArraySlice<UInt8>) -> [UInt8] {
        var result = directory
        result.append(UInt8(ascii: "/"))
        result += name
        return result
    }

    private static func cached(_ directory: [UInt8]) -> [UInt8]? {
        if directory.isEmpty { return directory }
        let now = ContinuousClock.now
        return cache.withLock { cache in
            guard let entry = cache[directory], now - entry.made < lifetime else { return nil }
            return entry.resolved
        }
    }

    /// `realpath(3)` of the directory, or, where it does not exist (yet), of the nearest
    /// directory above it that does, with the rest appended. Remembered.
    private static func resolveDirectory(_ directory: [UInt8]) -> [UInt8] {
        if directory.isEmpty { return directory }
        var resolved: [UInt8]
        if let real = realPath(directory) {
            resolved = real == [UInt8(ascii: "/")] ? [] : real
        } else if let (parent, name) = split(directory) {
            resolved = join(cached(parent) ?? resolveDirectory(parent), name)
        } else {
            resolved = directory
        }
        let entry = Entry(resolved: resolved, made: .now)
        cache.withLock { cache in
            if cache.count >= limit { cache.removeAll(keepingCapacity: true) }
            cache[directory] = entry
        }
        return resolved
    }

    private static func realPath(_ bytes: [UInt8]) -> [UInt8]? {
        let string = bytes.map { CChar(bitPattern: $0) } + [0]
        guard let result = realpath(string, nil) else { return nil }
        defer { free(result) }
        return Array(UnsafeRawBufferPointer(start: result, count: strlen(result)))
    }

    /// The path a link at `bytes` points to, made absolute and normalized; nil when it is
    /// not a link (or cannot be read).
    private static func followOnce(_ bytes: [UInt8]) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let string = bytes.map { CChar(bitPattern: $0) } + [0]
        let count = buffer.withUnsafeMutableBufferPointer { readlink(string, $0.baseAddress!, $0.count) }
        guard count > 0 else { return nil }
        let target = Array(buffer[..<count])
        var full: FilePath
        if target.first == UInt8(ascii: "/") {
            full = FilePath(platformBytes: target)
        } else {
            let directory = split(bytes).map { $0.0 } ?? []
            full = FilePath(platformBytes: join(directory, target[...]))
        }
        full = full.lexicallyNormalized()
        return full.platformBytes
    }
}
