import Foundation
import SystemPackage
import Testing
@testable import FileCoordination

/// The rules, with no I/O: submit, release, withdraw, move; check who is granted.
@Suite("Coordination rules (state machine)")
struct CoordinationRulesTests {
    typealias Rules = CoordinationRules
    typealias Claim = Rules.Claim

    static func read(_ path: FilePath) -> Claim { Claim(path: path, access: .reading) }
    static func write(_ path: FilePath, subtree: Bool = false) -> Claim {
        Claim(path: path, access: .writing, scope: subtree ? .subtree : .item)
    }

    /// Submits with a fresh number; returns (id, granted).
    static func submit(_ rules: inout Rules, _ claims: [Claim], purpose: String = UUID().uuidString) -> (Rules.RequestID, Bool) {
        let id = rules.reserveID()
        return (id, rules.submit(id, purpose: purpose, claims: claims))
    }

    @Test("readers share an item; a writer waits for them and excludes the next reader")
    func readersAndWriters() {
        var rules = Rules()
        let (r1, g1) = Self.submit(&rules, [Self.read("/a")])
        let (r2, g2) = Self.submit(&rules, [Self.read("/a")])
        #expect(g1 && g2)
        let (w, gw) = Self.submit(&rules, [Self.write("/a")])
        #expect(!gw)
        #expect(rules.release(r1) == [])
        #expect(rules.release(r2) == [w])
        let (_, gr) = Self.submit(&rules, [Self.read("/a")])
        #expect(!gr, "a writer excludes readers")
    }

    @Test("first come, first served: a reader arriving behind a waiting writer waits (no writer starvation)")
    func fairness() {
        var rules = Rules()
        let (r1, _) = Self.submit(&rules, [Self.read("/f")])
        let (w, gw) = Self.submit(&rules, [Self.write("/f")])
        let (r2, gr2) = Self.submit(&rules, [Self.read("/f")])
        #expect(!gw && !gr2)
        #expect(rules.release(r1) == [w])
        #expect(rules.release(w) == [r2])
    }

    @Test("different items never conflict; a plain access inside a directory does not block the directory")
    func independentItems() {
        var rules = Rules()
        #expect(Self.submit(&rules, [Self.write("/d/x")]).1)
        #expect(Self.submit(&rules, [Self.write("/d/y")]).1)
        #expect(Self.submit(&rules, [Self.write("/d")]).1, "a plain write of the directory item is not blocked by writes inside it")
        var readers = Rules()
        #expect(Self.submit(&readers, [Self.write("/e/inner")]).1)
        #expect(Self.submit(&readers, [Self.read("/e")]).1, "nor is reading the directory")
    }

    @Test("deleting, moving or replacing a directory waits for everything inside and blocks new access there")
    func subtreeClaims() {
        var rules = Rules()
        let (inside, _) = Self.submit(&rules, [Self.read("/d/sub/file")])
        let (delete, granted) = Self.submit(&rules, [Self.write("/d", subtree: true)])
        #expect(!granted)
        let (late, lateGranted) = Self.submit(&rules, [Self.read("/d/other")])
        #expect(!lateGranted, "new access inside waits for the directory's claim")
        #expect(Self.submit(&rules, [Self.read("/elsewhere")]).1)
        #expect(Self.submit(&rules, [Self.read("/dx")]).1, "/dx is not inside /d")
        #expect(rules.release(inside) == [delete])
        #expect(rules.release(delete) == [late])
    }

    @Test("a multi-item request is granted whole or not at all; opposite orders cannot deadlock")
    func multiItem() {
        var rules = Rules()
        let (holder, _) = Self.submit(&rules, [Self.write("/b")])
        let (ab, gab) = Self.submit(&rules, [Self.write("/a"), Self.write("/b")])
        #expect(!gab)
        // Nothing of `ab` is held while it waits: /a is free for others...
        let (ba, gba) = Self.submit(&rules, [Self.write("/b"), Self.write("/a")])
        #expect(!gba, "...but fairness queues the later request behind the earlier one")
        #expect(rules.release(holder) == [ab])
        #expect(rules.release(ab) == [ba])
    }

    @Test("requests with the same purpose never block each other")
    func purposes() {
        var rules = Rules()
        #expect(Self.submit(&rules, [Self.write("/p")], purpose: "editor").1)
        #expect(Self.submit(&rules, [Self.write("/p")], purpose: "editor").1)
        #expect(Self.submit(&rules, [Self.read("/p")], purpose: "editor").1)
        #expect(!Self.submit(&rules, [Self.read("/p")], purpose: "indexer").1)
    }

    @Test("a request nested in a granted one of its purpose on the same item is not queued behind another purpose's waiting writer (which waits for the outer one)")
    func nestedPassesWaiting() {
        var rules = Rules()
        let (outer, granted) = Self.submit(&rules, [Self.read("/p")], purpose: "editor")
        #expect(granted)
        let (_, writerGranted) = Self.submit(&rules, [Self.write("/p")], purpose: "indexer")
        #expect(!writerGranted)
        #expect(Self.submit(&rules, [Self.write("/p")], purpose: "editor").1, "the nested write waits for a writer that waits for its outer read")
        // Not nested (nothing of its purpose granted on the item): it queues as usual.
        #expect(!Self.submit(&rules, [Self.read("/p")], purpose: "viewer").1)
        _ = rules.release(outer)
    }

    @Test("a granted request asking presenters stands aside for their coordinators' purposes, and only while it asks")
    func yieldWhileAsking() {
        var rules = Rules()
        let (reader, _) = Self.submit(&rules, [Self.read("/doc")], purpose: "reader")
        let (early, earlyGranted) = Self.submit(&rules, [Self.write("/doc")], purpose: "presenter")
        #expect(!earlyGranted)
        #expect(rules.yield(reader, to: ["presenter"]) == [early], "a waiting request of that purpose goes in")
        _ = rules.release(early)
        #expect(Self.submit(&rules, [Self.write("/doc")], purpose: "presenter").1)
        #expect(!Self.submit(&rules, [Self.write("/doc")], purpose: "another").1, "only for the presenters asked")
        _ = rules.yield(reader, to: [])
        #expect(!Self.submit(&rules, [Self.write("/doc")], purpose: "presenter").1, "not once the asking is over")
    }

    @Test("withdrawing a waiting request lets those queued behind it through")
    func withdraw() {
        var rules = Rules()
        let (r, _) = Self.submit(&rules, [Self.read("/x")])
        let (w, _) = Self.submit(&rules, [Self.write("/x")])
        let (r2, g2) = Self.submit(&rules, [Self.read("/x")])
        #expect(!g2)
        #expect(rules.withdraw(w) == [r2])
        #expect(rules.waitingCount == 0)
        _ = rules.release(r)
        _ = rules.release(r2)
        #expect(rules.grantedCount == 0)
    }

    @Test("a move rewrites the claims of waiting requests on the item and inside it")
    func move() {
        var rules = Rules()
        let (mover, _) = Self.submit(&rules, [Self.write("/old", subtree: true)])
        let (item, _) = Self.submit(&rules, [Self.read("/old")])
        let (inner, _) = Self.submit(&rules, [Self.write("/old/x/y")])
        let (other, _) = Self.submit(&rules, [Self.read("/older")])
        #expect(Set(rules.move(from: "/old", to: "/new")) == [item, inner])
        // The new place comes first; the old one stays claimed until the mover is done.
        #expect(rules.claims(of: item).map(\.path) == ["/new", "/old"])
        #expect(rules.claims(of: inner).map(\.path) == ["/new/x/y", "/old/x/y"])
        #expect(rules.claims(of: other).map(\.path) == ["/older"])
        #expect(Set(rules.release(mover)) == [item, inner])
    }

    @Test("randomized: no two granted requests ever conflict, and releasing everything grants everything", arguments: 0 ..< 12)
    func randomized(seed: Int) {
        var generator = SeededGenerator(seed: UInt64(seed))
        var rules = Rules()
        let paths: [FilePath] = ["/r", "/r/a", "/r/a/b", "/r/c", "/s"]
        var granted: Set<Rules.RequestID> = []
        var waiting: Set<Rules.RequestID> = []
        var purposes: [Rules.RequestID: String] = [:]
        var claims: [Rules.RequestID: [Claim]] = [:]
        for _ in 0 ..< 250 {
            switch Int.random(in: 0 ..< 10, using: &generator) {
            case 0 ..< 5:
                let count = Int.random(in: 1 ... 3, using: &generator)
                let request = (0 ..< count).map { _ in
                    Claim(path: paths.randomElement(using: &generator)!,
                          access: Bool.random(using: &generator) ? .reading : .writing,
                          scope: Int.random(in: 0 ..< 6, using: &generator) == 0 ? .subtree : .item)
                }
                let purpose = ["p", "q", "u\(Int.random(in: 0 ..< 1000, using: &generator))"].randomElement(using: &generator)!
                let (id, isGranted) = Self.submit(&rules, request, purpose: purpose)
                purposes[id] = purpose
                claims[id] = request
                if isGranted { granted.insert(id) } else { waiting.insert(id) }
            case 5 ..< 8:
                guard let id = granted.randomElement(using: &generator) else { continue }
                granted.remove(id)
                for newly in rules.release(id) { #expect(waiting.remove(newly) != nil); granted.insert(newly) }
            default:
                guard let id = waiting.randomElement(using: &generator) else { continue }
                waiting.remove(id)
                for newly in rules.withdraw(id) { #expect(waiting.remove(newly) != nil); granted.insert(newly) }
            }
            // Invariant: granted requests with different purposes never conflict.
            let list = Array(granted)
            var violation: (Rules.RequestID, Rules.RequestID)?
            for i in list.indices where violation == nil {
                for j in list.indices where j > i && purposes[list[i]] != purposes[list[j]] {
                    if claims[list[i]]!.contains(where: { a in claims[list[j]]!.contains { Rules.conflict(a, $0) } }) {
                        violation = (list[i], list[j])
                    }
                }
            }
            #expect(violation == nil, "conflicting requests granted together: \(String(describing: violation))")
        }
        // Drain: releasing every granted request eventually grants every waiting one.
        while let id = granted.first {
            granted.remove(id)
            for newly in rules.release(id) { waiting.remove(newly); granted.insert(newly) }
        }
        #expect(waiting.isEmpty)
        #expect(rules.grantedCount == 0 && rules.waitingCount == 0)
    }
}

/// A small deterministic generator (xorshift) for reproducible randomized tests.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed &* 0x9E37_79B9_7F4A_7C15 | 1 }
    mutating func next() -> UInt64 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return state
    }
}
