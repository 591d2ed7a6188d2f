import AsyncFileIO
import Synchronization

/// Takes each file's read claim on the batch's worker when it is free at once, and notes
/// the files it had to skip.
final class ClaimGate: InPlaceGate {
    let center: CoordinationCenter
    let purpose: String
    /// Whether the workers open the claim shards they need (not all may stay open).
    let openingShards: Bool
    /// Whether the sequence's consumer may claim too: every shard is open (a claim needs
    /// no `openat`), and the transport takes claims without a server's round trip.
    let admitsWithoutBlocking: Bool
    private let skippedIndices = Locked<[Int]>([])

    init(center: CoordinationCenter, purpose: String, openingShards: Bool, admitsWithoutBlocking: Bool) {
        self.center = center
        self.purpose = purpose
        self.openingShards = openingShards
        self.admitsWithoutBlocking = admitsWithoutBlocking
    }

    var skipped: [Int] { skippedIndices.withLock { $0 } }

    /// The files skipped after `index` so far, in order, up to `limit` (they are then no
    /// longer noted).
    func takeSkipped(after index: Int, limit: Int) -> [Int] {
        skippedIndices.withLock { skipped in
            let taken = Array(skipped.filter { $0 > index }.sorted().prefix(limit))
            let set = Set(taken)
            skipped.removeAll { set.contains($0) }
            return taken
        }
    }

    /// Whether the file at `index` was skipped (it is then no longer noted).
    func takeSkipped(_ index: Int) -> Bool {
        skippedIndices.withLock { skipped in
            guard let position = skipped.firstIndex(of: index) else { return false }
            skipped.remove(at: position)
            return true
        }
    }

    func enter(_ files: [(index: Int, path: PlatformPath)]) -> UInt64? {
        var claims: [CoordinationRules.Claim] = []
        claims.reserveCapacity(files.count)
        var directory = CanonicalPaths.DirectoryMemo()
        for (_, given) in files {
            // The claim names the path with its directories resolved and its last component
            // as it is: the workers open it without following a link there (no `readlink`
            // per file) and leave a link to the full coordination, which claims its
            // target. A file a presenter is concerned by is left to the full coordination.
            let key = PathKey(CanonicalPaths.canonicalNameNow(FileCoordinator.normalizedBytes(given), memo: &directory))
            guard !center.hasPresenters(concerning: key) else { break }
            claims.append(CoordinationRules.Claim(key: key, access: .reading))
        }
        if claims.count == files.count, let id = center.tryAcquireNow(claims, purpose: purpose, openingShards: openingShards) {
            return id.raw
        }
        if files.count == 1 { skippedIndices.withLock { $0.append(files[0].index) } }
        return nil
    }

    /// ``enter(_:)`` from what is known already: each directory's resolution remembered
    /// (no `realpath`), and the claims taken with the kernel's non-blocking lock calls
    /// alone (as an uncontended coordination takes them on its caller's thread).
    func enterWithoutBlocking(_ files: [(index: Int, path: PlatformPath)]) -> GateAdmission {
        guard admitsWithoutBlocking else { return .refused }
        var claims: [CoordinationRules.Claim] = []
        claims.reserveCapacity(files.count)
        var directory = CanonicalPaths.DirectoryMemo()
        for (_, given) in files {
            guard let name = CanonicalPaths.canonicalNameIfKnown(FileCoordinator.normalizedBytes(given), memo: &directory)
            else { return .notKnownYet }
            let key = PathKey(name)
            guard !center.hasPresenters(concerning: key) else { return .refused }
            claims.append(CoordinationRules.Claim(key: key, access: .reading))
        }
        guard let id = center.tryAcquireNow(claims, purpose: purpose) else { return .refused }
        return .admitted(id.raw)
    }

    func leave(_ token: UInt64) {
        center.release(CoordinationRules.RequestID(raw: token))
    }

    func skip(_ index: Int) {
        skippedIndices.withLock { $0.append(index) }
    }
}
