import AsyncFileIO
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemCalls
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
/// `readlink(2)` made inline (it answers `EINVAL` at once for a file that is not a link).
/// The same item coordinated again reuses its last resolution after that one `readlink`,
/// which, once the resolution has been reused 16 times, is a `readlinkat(2)` in the
/// directory as resolved (one component to walk instead of the whole path).
/// A link or directory changed less than ``lifetime`` ago may still be seen as it was by
/// a process that resolved it just before; the last component is checked every time, in
/// the directory as resolved.
package enum CanonicalPaths {
    /// How long a directory's resolution is trusted.
    static let lifetime: Duration = .seconds(1)
    /// At most this many directories are remembered; past it the cache starts again.
    static let limit = 4096
    /// Links followed before giving up (as the kernel's `ELOOP`): the path is then left
    /// as it is, and the access itself reports the loop.
    static let maximumLinks = 40

    struct Entry {
        var resolved: [UInt8]
        var made: ContinuousClock.Instant
    }

    /// Keyed by ``PathKey``, hashed once outside the lock with `combine(bytes:)` (an array
    /// key would hash byte by byte).
    static let cache = Locked<[PathKey: Entry]>([:])

    /// Directories being resolved on an I/O thread, with the tasks that wait for the same
    /// resolution: many coordinations starting at once on a directory not known yet make
    /// one job, not one each (a hundred would each take an I/O thread, and the pool would
    /// start threads for them).
    static let resolving = SingleFlight<PathKey, Entry?>()

    /// The last item resolved whose last component was no link, with its key and until
    /// when its directory's resolution is trusted: a coordination of the same item again
    /// (the usual loop) makes one `readlink(2)` (or `readlinkat(2)`, ``LinkProbe``) and no
    /// array, hash or `FilePath`.
    struct Resolved: Sendable {
        var lexical: FilePath
        var followingLast: Bool
        var canonical: FilePath
        var key: PathKey
        var trustedUntil: ContinuousClock.Instant
        /// Which resolution this is: a probe opened outside the lock is kept only by the
        /// resolution it was opened for.
        var serial: UInt64
        /// Reuses so far; at ``probeAfter``, one ``LinkProbe`` is tried (and not again).
        var uses = 0
        var probeTried = false
        var probe: LinkProbe?
    }

    static let last = Locked<Resolved?>(nil)
    static let serials = Atomic<UInt64>(0)
    /// Reuses of one resolution before its directory is opened: an `open`, a `close` and
    /// a timer cost about what 16 shorter path walks save.
    static let probeAfter = 16

    /// A resolved item's directory, opened with `O_PATH`, and the item's name in it:
    /// whether the name is a link is then a `readlinkat(2)` that walks one component
    /// (0.7 against 0.9 us for a path of five components, measured in C here). One
    /// descriptor per process, for the item coordinated over and over, closed when its
    /// directory's resolution stops being trusted.
    final class LinkProbe: Sendable {
        let directory: Int32
        let name: [CChar]

        /// nil when `canonical` has no name or its directory cannot be opened (the
        /// descriptor limit, among others): the path is then checked whole, as before.
        init?(_ canonical: FilePath) {
            guard let (directory, name) = CanonicalPaths.split(canonical.platformBytes), !name.isEmpty else { return nil }
            let path = (directory.isEmpty ? [UInt8(ascii: "/")] : directory).map { CChar(bitPattern: $0) } + [0]
            guard case .success(let opened) = Syscall.open(path, fc_O_PATH | O_DIRECTORY) else { return nil }
            self.directory = opened
            self.name = name.map { CChar(bitPattern: $0) } + [0]
        }

        deinit { _ = Syscall.close(directory) }

        /// Whether the name is a link; nil when the answer is neither yes nor "no link"
        /// (`EINVAL`), as when the directory was removed since: then ask the path.
        var isLink: Bool? {
            var byte: UInt8 = 0
            switch withUnsafeMutableBytes(of: &byte, { Syscall.readlinkat(directory, name, into: $0) }) {
            case .success: return true
            case .failure(.invalidArgument): return false
            case .failure: return nil
            }
        }
    }

    /// The canonical form of `path` (absolute and normalized), resolving what
    /// the cache does not know on an I/O thread. In the caller's isolation: a cached
    /// directory costs no executor hop (a caller on the main actor would pay two).
    static func canonical(_ path: FilePath, followingLast: Bool,
                          isolation: isolated (any Actor)? = #isolation) async -> FilePath {
        await canonicalKeyed(path, followingLast: followingLast).path
    }

    /// ``canonical(_:followingLast:)`` with the key that claims and presenters meet on.
    static func canonicalKeyed(_ path: FilePath, followingLast: Bool,
                               isolation: isolated (any Actor)? = #isolation) async -> (path: FilePath, key: PathKey) {
        if let reused = reused(path, followingLast: followingLast) { return reused }
        return await resolveKeyed(path, followingLast: followingLast)
    }

    /// ``canonicalKeyed(_:followingLast:)`` without asking ``reused(_:followingLast:)``
    /// first: for a caller that just did.
    static func resolveKeyed(_ path: FilePath, followingLast: Bool,
                             isolation: isolated (any Actor)? = #isolation) async -> (path: FilePath, key: PathKey) {
        let (bytes, trustedUntil) = await resolve(path.platformBytes, followingLast: followingLast)
        let canonical = FilePath(platformBytes: bytes)
        let key = PathKey(bytes)
        if let trustedUntil {
            let resolved = Resolved(lexical: path, followingLast: followingLast, canonical: canonical, key: key,
                                    trustedUntil: trustedUntil, serial: serials.add(1, ordering: .relaxed).newValue)
            // The one replaced is released after the lock: its probe's `close`.
            let replaced = last.withLock { last in
                defer { last = resolved }
                return last
            }
            _ = replaced
        }
        return (canonical, key)
    }

    /// ``canonicalKeyed(_:followingLast:)`` when the last resolution can be reused, with
    /// no suspension point (a coordination's fast path calls no async function for it);
    /// nil when the path has to be resolved.
    static func reused(_ path: FilePath, followingLast: Bool) -> (path: FilePath, key: PathKey)? {
        let now = ContinuousClock.now
        // `expired`: a resolution no longer trusted, taken out to be released after the lock.
        let (known, openProbe, expired) = path.withPlatformString { given in
            last.withLock { last -> (Resolved?, Bool, Resolved?) in
                guard let known = last else { return (nil, false, nil) }
                guard now < known.trustedUntil else {
                    last = nil
                    return (nil, false, known)
                }
                guard known.followingLast == followingLast,
                      known.lexical.withPlatformString({ strcmp($0, given) == 0 }) else { return (nil, false, nil) }
                guard followingLast, !known.probeTried else { return (known, false, nil) }
                last?.uses += 1
                guard known.uses + 1 >= probeAfter else { return (known, false, nil) }
                last?.probeTried = true
                return (known, true, nil)
            }
        }
        _ = expired
        guard let known else { return nil }
        guard followingLast else { return (known.canonical, known.key) }
        switch known.probe?.isLink {
        case true?:
            return nil
        case false?:
            break
        case nil:
            if known.probe != nil { dropProbe(of: known.serial) }
            if isLink(known.canonical) { return nil }
            if openProbe, let probe = LinkProbe(known.canonical) { install(probe, in: known) }
        }
        return (known.canonical, known.key)
    }

    /// Keeps `probe` for the resolution `known` while it is the last one, and until its
    /// trust ends: an idle process keeps no directory open (a mount it holds is busy).
    static func install(_ probe: LinkProbe, in known: Resolved) {
        let installed = last.withLock { last -> Bool in
            guard last?.serial == known.serial, last?.probe == nil else { return false }
            last?.probe = probe
            return true
        }
        guard installed else { return }
        let (serial, until) = (known.serial, known.trustedUntil)
        Task.detached {
            try? await Task.sleep(until: until, clock: .continuous) // ok: the resolution's trust ends then
            dropProbe(of: serial)
        }
    }

    /// Closes the probe of resolution `serial`, if it is still the last one (after the lock).
    static func dropProbe(of serial: UInt64) {
        let dropped = last.withLock { last -> LinkProbe? in
            guard last?.serial == serial else { return nil }
            defer { last?.probe = nil }
            return last?.probe
        }
        _ = dropped
    }

    /// Whether the last resolution is that of `path` and checks its name in its directory
    /// (for tests).
    static func isProbing(_ path: FilePath) -> Bool {
        last.withLock { $0?.lexical == path && $0?.probe != nil }
    }

    /// `directory` resolved on an I/O thread, by this task or by one that asked first
    /// (its result shared). The resolution runs to its end even if the task that started
    /// it is cancelled: the tasks waiting for it were not, and a path used as given would
    /// claim, and look up presenters, under another name than the item's.
    private static func resolveOnce(_ directory: [UInt8], isolation: isolated (any Actor)? = #isolation) async -> Entry? {
        await resolving.value(for: PathKey(directory), late: { cached(directory) }) {
            let made = ContinuousClock.now
            return await runOnIOThreadToCompletion { Entry(resolved: resolveDirectory(directory), made: made) }
        }
    }

    /// The canonical bytes, and until when they may be reused without resolving again:
    /// nil when a link was followed, the directory could not be resolved, or `path` is `/`.
    static func resolve(_ path: [UInt8], followingLast: Bool,
                                isolation: isolated (any Actor)? = #isolation) async -> ([UInt8], ContinuousClock.Instant?) {
        var bytes = path
        for hop in 0 ... maximumLinks {
            guard let (directory, name) = split(bytes) else { return (path, nil) }
            // A path ending in `..` names a directory (never a link): resolved whole.
            let whole = isParentStep(name)
            let wanted = whole ? bytes : directory
            // nil when it could not be resolved (no I/O thread): used as given, not reused.
            let resolved: Entry? = if let known = cached(wanted) { known } else { await resolveOnce(wanted) }
            if whole {
                return (resolved.map { rooted($0.resolved) } ?? bytes, hop == 0 ? resolved.map { $0.made + lifetime } : nil)
            }
            let joined = join(resolved?.resolved ?? directory, name)
            guard followingLast, let next = followOnce(joined) else {
                return (joined, hop == 0 ? resolved.map { $0.made + lifetime } : nil)
            }
            bytes = next
        }
        return (path, nil)
    }

    /// Whether `path` is a symbolic link (`readlink(2)` into one byte: it answers
    /// `EINVAL` at once for anything else).
    static func isLink(_ path: FilePath) -> Bool {
        path.withPlatformString { string in
            var byte: UInt8 = 0
            return if case .success = withUnsafeMutableBytes(of: &byte, { Syscall.readlink(path: string, into: $0) }) { true } else { false }
        }
    }
}
