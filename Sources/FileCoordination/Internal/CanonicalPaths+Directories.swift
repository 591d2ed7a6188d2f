import AsyncFileIO
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Resolution on the calling thread, and the cache of directories' resolutions.
extension CanonicalPaths {
    /// ``canonical(_:followingLast:)`` that makes its system calls on the calling thread:
    /// for the blocking API and for the library's own threads.
    package static func canonicalNow(_ path: FilePath, followingLast: Bool) -> FilePath {
        FilePath(platformBytes: canonicalNow(path.platformBytes, followingLast: followingLast))
    }

    /// ``canonicalNow(_:followingLast:)`` on a path's bytes (absolute, normalized).
    static func canonicalNow(_ path: [UInt8], followingLast: Bool) -> [UInt8] {
        var bytes = path
        for _ in 0 ... maximumLinks {
            guard let (directory, name) = split(bytes) else { return path }
            if isParentStep(name) { return rooted(directoryNow(bytes)) }
            let joined = join(directoryNow(directory), name)
            guard followingLast, let next = followOnce(joined) else { return joined }
            bytes = next
        }
        return path
    }

    /// The directory that ``canonicalNameNow(_:memo:)`` looked up last, for the files of
    /// one group claimed together (a batch's), which mostly share it.
    struct DirectoryMemo {
        fileprivate var directory: [UInt8]?
        fileprivate var resolved: [UInt8] = []
        init() {}
    }

    /// ``canonicalNow(_:followingLast:)`` of a name itself (`followingLast: false`): a file
    /// in the directory `memo` looked up last makes no lookup, lock or clock reading.
    /// Keep a memo for one group only: it does not check the cache's trust again.
    static func canonicalNameNow(_ path: [UInt8], memo: inout DirectoryMemo) -> [UInt8] {
        canonicalName(path, memo: &memo, resolving: directoryNow) ?? path
    }

    /// ``canonicalNameNow(_:memo:)`` from what is remembered alone, with no system call:
    /// nil when the directory's resolution is not known (a thread that must not block
    /// leaves such a file to one that may).
    static func canonicalNameIfKnown(_ path: [UInt8], memo: inout DirectoryMemo) -> [UInt8]? {
        canonicalName(path, memo: &memo) { cached($0)?.resolved }
    }

    static func canonicalName(_ path: [UInt8], memo: inout DirectoryMemo,
                                      resolving: ([UInt8]) -> [UInt8]?) -> [UInt8]? {
        guard path.count > 1, let slash = path.lastIndex(of: UInt8(ascii: "/")) else { return path }
        let name = path[(slash + 1)...]
        if isParentStep(name) { return resolving(path).map(rooted) }
        // `slash == 0`: both directories are `/` (empty), whose buffers may have no address.
        if let known = memo.directory, known.count == slash, slash == 0
            || known.withUnsafeBytes({ known in path.withUnsafeBytes { memcmp(known.baseAddress!, $0.baseAddress!, slash) == 0 } }) {
            return join(memo.resolved, name)
        }
        let directory = Array(path[..<slash])
        guard let resolved = resolving(directory) else { return nil }
        memo.directory = directory
        memo.resolved = resolved
        return join(resolved, name)
    }

    /// The directory part (empty for an item in `/`) and the name; nil for `/` itself.
    static func split(_ bytes: [UInt8]) -> ([UInt8], ArraySlice<UInt8>)? {
        guard bytes.count > 1, let slash = bytes.lastIndex(of: UInt8(ascii: "/")) else { return nil }
        return (Array(bytes[..<slash]), bytes[(slash + 1)...])
    }

    /// Whether a name is `..`: the path then names the directory it leads to, which only
    /// the file system knows (after a link, the parent of the link's target).
    static func isParentStep(_ name: ArraySlice<UInt8>) -> Bool {
        name.count == 2 && name.first == UInt8(ascii: ".") && name.last == UInt8(ascii: ".")
    }

    /// A directory's resolution as a path: `/` for the root (which resolutions keep empty).
    static func rooted(_ directory: [UInt8]) -> [UInt8] {
        directory.isEmpty ? [UInt8(ascii: "/")] : directory
    }

    static func join(_ directory: [UInt8], _ name: ArraySlice<UInt8>) -> [UInt8] {
        var result = directory
        result.append(UInt8(ascii: "/"))
        result += name
        return result
    }

    /// The directory's remembered resolution, while it is trusted; `/` (empty) is always known.
    static func cached(_ directory: [UInt8]) -> Entry? {
        let now = ContinuousClock.now
        if directory.isEmpty { return Entry(resolved: directory, made: now) }
        let key = PathKey(directory)
        return cache.withLock { cache in
            guard let entry = cache[key], now - entry.made < lifetime else { return nil }
            return entry
        }
    }

    /// The directory's resolution, remembered or made now (on the calling thread).
    static func directoryNow(_ directory: [UInt8]) -> [UInt8] {
        cached(directory)?.resolved ?? resolveDirectory(directory)
    }

    /// `realpath(3)` of the directory, or, where it does not exist (yet), where the kernel
    /// will find it once it is made (``resolveMissing(_:)``). Remembered.
    static func resolveDirectory(_ directory: [UInt8]) -> [UInt8] {
        if directory.isEmpty { return directory }
        if let resolved = realPath(directory) {
            remember(directory, as: resolved)
            return resolved
        }
        return resolveMissing(directory)
    }

    /// Where the kernel will find a directory that `realpath(3)` could not resolve (it
    /// does not exist, yet): the nearest directory above it that is known or resolves,
    /// then each name below it in turn, as the kernel walks a path: `..` takes the
    /// directory above, and a link there (one to a directory not made yet) is followed,
    /// ``maximumLinks`` links in all (a loop of links ends there). Each level of
    /// `directory` is remembered.
    ///
    /// A loop, not a recursion: the names to walk are a stack, so that no depth of the
    /// program's own stack depends on how many directories are missing (a path of 1,200
    /// missing components is 2.4 KB).
    static func resolveMissing(_ directory: [UInt8]) -> [UInt8] {
        enum Step {
            /// A name to walk, from `directory` or from a link's target.
            case name(ArraySlice<UInt8>)
            /// Every name of this level of `directory` (and what its links led to) has been
            /// walked: the walk so far is its resolution.
            case level([UInt8])
        }
        // Up to the nearest level that is known or resolves: the levels below it wait.
        var steps: [Step] = []
        var above = directory
        var current: [UInt8] = []
        while let (parent, name) = split(above) {
            steps.append(.level(above))
            steps.append(.name(name))
            above = parent
            if above.isEmpty { break }
            if let known = cached(above) {
                current = known.resolved
                break
            }
            if let resolved = realPath(above) {
                remember(above, as: resolved)
                current = resolved
                break
            }
        }
        var hops = maximumLinks
        while let step = steps.popLast() {
            switch step {
            case .level(let level):
                remember(level, as: current)
            case .name(let name):
                if name.isEmpty || (name.count == 1 && name.first == UInt8(ascii: ".")) { continue }
                if isParentStep(name) {
                    current = split(current)?.0 ?? []
                    continue
                }
                let joined = join(current, name)
                guard hops > 0, let target = linkTarget(joined) else {
                    current = joined
                    continue
                }
                hops -= 1
                // The target's names are walked next, from the root or from the link's
                // directory.
                if target.first == UInt8(ascii: "/") { current = [] }
                for component in target.split(separator: UInt8(ascii: "/")).reversed() { steps.append(.name(component)) }
            }
        }
        return current
    }

    /// Keeps a directory's resolution (`/` kept empty) for ``lifetime``.
    static func remember(_ directory: [UInt8], as resolved: [UInt8]) {
        let (key, entry) = (PathKey(directory), Entry(resolved: resolved, made: .now))
        cache.withLock { cache in
            if cache.count >= limit { cache.removeAll(keepingCapacity: true) }
            cache[key] = entry
        }
    }

    /// `realpath(3)`, with `/` as no bytes (as resolutions keep it).
    static func realPath(_ bytes: [UInt8]) -> [UInt8]? {
        let string = bytes.map { CChar(bitPattern: $0) } + [0]
        guard case .success(let resolved) = Syscall.realpath(string) else { return nil }
        return resolved == [UInt8(ascii: "/")] ? [] : resolved
    }

    /// What the link at `bytes` holds, as written; nil when it is not a link (or cannot
    /// be read).
    static func linkTarget(_ bytes: [UInt8]) -> [UInt8]? {
        var string = bytes
        string.append(0)
        return string.withUnsafeBufferPointer { string in
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: Int(PATH_MAX)) { buffer -> [UInt8]? in
                let read = string.withMemoryRebound(to: CChar.self) { Syscall.readlink(path: $0.baseAddress!, into: UnsafeMutableRawBufferPointer(buffer)) }
                guard case .success(let count) = read, count > 0 else { return nil }
                return Array(buffer[..<count])
            }
        }
    }

    /// The path a link at `bytes` points to, made absolute and normalized; nil when it is
    /// not a link (or cannot be read).
    static func followOnce(_ bytes: [UInt8]) -> [UInt8]? {
        guard let target = linkTarget(bytes) else { return nil }
        var full: FilePath
        if target.first == UInt8(ascii: "/") {
            full = FilePath(platformBytes: target)
        } else {
            let directory = split(bytes).map { $0.0 } ?? []
            full = FilePath(platformBytes: join(directory, target[...]))
        }
        full = full.normalizedKeepingParents()
        return full.platformBytes
    }
}
