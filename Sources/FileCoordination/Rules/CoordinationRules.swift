import AsyncFileIO
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Who waits for whom: the coordination rules as a pure state machine.
///
/// No I/O, no locks, no clocks: callers submit requests, release and withdraw them, and
/// get back which requests became granted. ``CoordinationCenter`` holds one instance
/// under a lock and carries out the results (resuming waiting tasks).
///
/// The rules, Apple's:
/// - Readers share; a writer excludes readers and writers of the same item.
/// - A *subtree* claim (writing a directory with `forDeleting`, `forMoving` or
///   `forReplacing`) also covers everything inside the directory: it waits for all
///   access inside and blocks new access there until it is released.
/// - A plain access to an item inside a directory does not touch the directory itself:
///   reading `/a/b` never blocks a reader (or writer) of `/a`.
/// - Requests with the same purpose identifier never block each other.
///
/// And two of this implementation's own:
/// - A request's claims are granted together or not at all, so a coordination over
///   several items can never hold one while waiting for another (no deadlock, whatever
///   the order of the items).
/// - Grants are first come, first served: a request waits while an *earlier* waiting
///   request conflicts with it. A stream of readers therefore cannot starve a writer.
package struct CoordinationRules: Sendable {
    package enum Access: Sendable, Hashable { case reading, writing }
    package enum Scope: Sendable, Hashable { case item, subtree }

    /// One item a request needs.
    package struct Claim: Sendable, Hashable {
        /// The claimed path (made from its bytes when asked: moves and `status` ask).
        package var path: FilePath {
            get { FilePath(platformBytes: key.bytes) }
            set { key = PathKey(newValue.platformBytes) }
        }
        package var access: Access
        package var scope: Scope
        /// The path's bytes: conflicts and the index compare these.
        package private(set) var key: PathKey

        package init(path: FilePath, access: Access, scope: Scope = .item) {
            self.init(key: PathKey(path.platformBytes), access: access, scope: scope)
        }

        /// A claim on the normalized, absolute path with these bytes.
        package init(key: PathKey, access: Access, scope: Scope = .item) {
            self.key = key
            self.access = access
            self.scope = scope
        }
    }

    /// Requests are numbered in submission order; the number decides fairness.
    struct RequestID: Sendable, Hashable, Comparable, CustomStringConvertible {
        let raw: UInt64
        static func < (a: RequestID, b: RequestID) -> Bool { a.raw < b.raw }
        var description: String { "#\(raw)" }
    }

    private struct Request: Sendable {
        let id: RequestID
        let purpose: String
        var claims: [Claim]
        var granted: Bool
        /// Purposes it stands aside for while it asks their presenters (``yield(_:to:)``).
        var yieldsTo: Set<String> = []
    }

    private var requests: [RequestID: Request] = [:]
    /// Waiting requests in submission order.
    private var waiting: [RequestID] = []
    /// Requests with a claim on each path.
    private var itemIndex: [PathKey: [RequestID]] = [:]
    /// Requests with a subtree claim (rare: directory delete, move, replace).
    private var subtreeHolders: Set<RequestID> = []
    private var nextID: UInt64 = 1

    /// Number of granted requests.
    var grantedCount: Int { requests.count - waiting.count }
    /// Number of waiting requests.
    var waitingCount: Int { waiting.count }
    /// Whether `id` is currently granted.
    func isGranted(_ id: RequestID) -> Bool { requests[id]?.granted == true }
    /// Whether `id` is known (granted or waiting).
    func contains(_ id: RequestID) -> Bool { requests[id] != nil }
    /// The claims of `id` as they stand (waiting claims follow moves).
    func claims(of id: RequestID) -> [Claim] { requests[id]?.claims ?? [] }

    /// The purpose of request `id` (nil once it is released).
    func purpose(of id: RequestID) -> String? { requests[id]?.purpose }
    /// Every claim of every waiting request.
    var waitingClaims: [Claim] { requests.values.filter { !$0.granted }.flatMap(\.claims) }
    /// The requests granted now.
    var grantedIDs: [RequestID] { requests.values.filter(\.granted).map(\.id) }

    /// Reserves the number of a request about to be submitted.
    mutating func reserveID() -> RequestID {
        defer { nextID += 1 }
        return RequestID(raw: nextID)
    }

    /// Submits a request under a number from ``reserveID()``. Returns whether it was
    /// granted at once; otherwise it waits until a ``release(_:)`` or ``withdraw(_:)``
    /// grants it.
    mutating func submit(_ id: RequestID, purpose: String, claims: [Claim]) -> Bool {
        var request = Request(id: id, purpose: purpose, claims: claims, granted: false)
        // Decided before it is indexed (a request never blocks itself), then indexed once.
        request.granted = canGrant(request)
        index(request)
        if request.granted { return true }
        // Keep the queue in number order even if numbers were reserved out of order.
        let position = waiting.firstIndex { $0 > id } ?? waiting.endIndex
        waiting.insert(id, at: position)
        return false
    }

    /// Ends a granted request; returns the requests that became granted, in order.
    mutating func release(_ id: RequestID) -> [RequestID] {
        guard let request = requests.removeValue(forKey: id) else { return [] }
        precondition(request.granted, "release of waiting request \(id); withdraw it instead")
        unindex(request)
        return waiting.isEmpty ? [] : grantWaiting()
    }

    /// Gives up a waiting request (cancelled); returns requests that became granted
    /// because they no longer queue behind it.
    mutating func withdraw(_ id: RequestID) -> [RequestID] {
        guard let request = requests[id], !request.granted else { return [] }
        requests[id] = nil
        unindex(request)
        waiting.removeAll { $0 == id }
        return grantWaiting()
    }

    /// While a granted request asks presenters, it stands aside for the coordinators made
    /// for them (`purposes`): a presenter saving through its own coordinator writes while
    /// the asker waits for that save (Apple's rule), instead of waiting for the asker.
    /// Empty `purposes` end it. Returns the requests that became granted.
    mutating func yield(_ id: RequestID, to purposes: Set<String>) -> [RequestID] {
        guard requests[id]?.granted == true else { return [] }
        requests[id]?.yieldsTo = purposes
        return purposes.isEmpty || waiting.isEmpty ? [] : grantWaiting()
    }

    /// An item moved from `source` to `destination`: waiting claims on it, or inside it,
    /// now name the new place (so the accessor gets the URL the item has when it runs).
    /// Returns the waiting requests whose claims changed.
    mutating func move(from source: FilePath, to destination: FilePath) -> [RequestID] {
        var changed: [RequestID] = []
        let sourceBytes = source.platformBytes
        for id in waiting {
            guard var request = requests[id] else { continue }
            var touched = false
            var keep: [Claim] = []
            for index in request.claims.indices {
                let path = request.claims[index].path
                guard FilePath.isAtOrInside(path.platformBytes, sourceBytes) else { continue }
                var moved = destination
                for component in path.components.dropFirst(source.components.count) { moved.append(component) }
                // The old place stays claimed too, so the request still waits for the
                // mover (whose claims name the old place) to finish.
                keep.append(request.claims[index])
                request.claims[index].path = moved
                touched = true
            }
            request.claims += keep
            guard touched else { continue }
            unindex(requests[id]!)
            index(request)
            changed.append(id)
        }
        // Moving cannot make a waiting request grantable on its own account in a way
        // that skips the queue: grants are re-evaluated on the next release as usual.
        return changed
    }

    // MARK: Conflicts

    /// Whether two claims of requests with different purposes exclude each other.
    package static func conflict(_ a: Claim, _ b: Claim) -> Bool {
        guard a.access == .writing || b.access == .writing else { return false }
        let (x, y) = (a.key.bytes, b.key.bytes)
        if x == y { return true }
        if a.scope == .subtree && FilePath.isAtOrInside(y, x) { return true }
        if b.scope == .subtree && FilePath.isAtOrInside(x, y) { return true }
        return false
    }

    /// Whether `rival` stands in `request`'s way: granted, or waiting since before it
    /// (unless `request` is nested, which is asked only then), with a different purpose
    /// and a conflicting claim.
    private func blocks(_ rivalID: RequestID, _ request: Request, nested: inout Bool?) -> Bool {
        guard rivalID != request.id, let rival = requests[rivalID], rival.purpose != request.purpose,
              !rival.yieldsTo.contains(request.purpose)
        else { return false }
        if !rival.granted {
            guard rival.id < request.id else { return false }
            if nested == nil { nested = isNested(request) }
            if nested == true { return false }
        }
        for x in request.claims {
            for y in rival.claims where Self.conflict(x, y) { return true }
        }
        return false
    }

    /// Grantable: no conflict with a granted request, nor with an earlier waiting one.
    /// Looks only at requests that share a path with it (plus the rare subtree claims),
    /// so its cost does not grow with unrelated claims.
    ///
    /// A request nested in a granted one of its purpose (a coordination made inside
    /// another's accessor, on one of its items) waits only for granted rivals: one waiting
    /// since before it waits for the outer request, which waits for it. (Coordinators
    /// never block themselves, nor those of their purpose.)
    private func canGrant(_ request: Request) -> Bool {
        var nested: Bool?
        for holder in subtreeHolders where blocks(holder, request, nested: &nested) { return false }
        for claim in request.claims {
            for other in itemIndex[claim.key] ?? [] where blocks(other, request, nested: &nested) { return false }
            if claim.scope == .subtree {
                let outer = claim.key.bytes
                for (otherPath, holders) in itemIndex where FilePath.isAtOrInside(otherPath.bytes, outer) {
                    for other in holders where blocks(other, request, nested: &nested) { return false }
                }
            }
        }
        return true
    }

    /// Whether a granted request of `request`'s purpose holds one of its items (or a
    /// subtree around one).
    private func isNested(_ request: Request) -> Bool {
        func holdsHere(_ id: RequestID) -> Bool {
            guard id != request.id, let other = requests[id], other.granted, other.purpose == request.purpose else { return false }
            return request.claims.contains { mine in
                other.claims.contains { theirs in
                    theirs.key == mine.key || (theirs.scope == .subtree && FilePath.isAtOrInside(mine.key.bytes, theirs.key.bytes))
                }
            }
        }
        return subtreeHolders.contains(where: holdsHere) || request.claims.contains { (itemIndex[$0.key] ?? []).contains(where: holdsHere) }
    }

    private mutating func grantWaiting() -> [RequestID] {
        var granted: [RequestID] = []
        var stillWaiting: [RequestID] = []
        for id in waiting {
            guard let request = requests[id] else { continue }
            if canGrant(request) {
                requests[id]!.granted = true
                granted.append(id)
            } else {
                stillWaiting.append(id)
            }
        }
        waiting = stillWaiting
        return granted
    }

    // MARK: Index

    /// Records the request and indexes it by path.
    private mutating func index(_ request: Request) {
        requests[request.id] = request
        for claim in request.claims {
            if claim.scope == .subtree { subtreeHolders.insert(request.id) }
            itemIndex[claim.key, default: []].append(request.id)
        }
    }

    /// Takes the request out of the path index (the caller removes or replaces its record).
    private mutating func unindex(_ request: Request) {
        if !subtreeHolders.isEmpty { subtreeHolders.remove(request.id) }
        for claim in request.claims {
            guard var holders = itemIndex.removeValue(forKey: claim.key) else { continue }
            holders.removeAll { $0 == request.id }
            if !holders.isEmpty { itemIndex[claim.key] = holders }
        }
    }
}

/// A path's bytes as a dictionary key, hashed in one call (`FilePath` hashes byte by
/// byte, which showed up as the largest cost of an uncontended coordination).
///
/// The hash is computed once, with the process's seeded `Hasher` (so crafted paths cannot
/// collide on purpose): a claim's key is looked up, indexed and unindexed, each a hash of
/// the whole path before.
package struct PathKey: Hashable, Sendable {
    package let bytes: [UInt8]
    private let hash: Int

    package init(_ bytes: [UInt8]) {
        self.bytes = bytes
        var hasher = Hasher()
        bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
        hash = hasher.finalize()
    }

    package static func == (a: PathKey, b: PathKey) -> Bool { a.hash == b.hash && a.bytes == b.bytes }

    package func hash(into hasher: inout Hasher) { hasher.combine(hash) }
}
