import SystemPackage
import Testing
@testable import FileCoordination

/// A claim's tries across processes (``SpaceLocks/attempt(_:queued:calls:)``), over a
/// table of byte locks in memory that behaves as the kernel's OFD locks do (one owner per
/// process; shared locks share, an exclusive one excludes every other owner's).
@Suite("Claim attempts")
struct ClaimAttemptTests {
    typealias Claim = CoordinationRules.Claim

    @Test("a writer queued behind a reader keeps its queue byte; a later reader waits behind it, and goes after it")
    func writerQueued() throws {
        let kernel = MemoryLocks()
        let reader = kernel.process(1), writer = kernel.process(2), late = kernel.process(3)
        let read = SpaceLocks.plan(for: [Claim(path: "/f", access: .reading)])
        let write = SpaceLocks.plan(for: [Claim(path: "/f", access: .writing)])
        var (readerQueue, writerQueue, lateQueue): ([SpaceLocks.Byte], [SpaceLocks.Byte], [SpaceLocks.Byte]) = ([], [], [])
        let first = try SpaceLocks.attempt(read, queued: &readerQueue, calls: reader)
        guard case .held(let readerHeld) = first else { Issue.record("the first reader waits"); return }
        let blocked = try SpaceLocks.attempt(write, queued: &writerQueue, calls: writer)
        #expect(blocked.isConflict && writerQueue.count == 1, "the writer waits, queued")
        let behind = try SpaceLocks.attempt(read, queued: &lateQueue, calls: late)
        #expect(behind.isConflict, "a reader arriving later waits behind the queued writer")
        reader.release(readerHeld)
        let granted = try SpaceLocks.attempt(write, queued: &writerQueue, calls: writer)
        guard case .held(let writerHeld) = granted else { Issue.record("the writer still waits"); return }
        writer.release(writerHeld)
        let after = try SpaceLocks.attempt(read, queued: &lateQueue, calls: late)
        #expect(!after.isConflict)
        #expect(kernel.holders.keys.sorted() == read.bytes.map(\.offset).sorted(), "only the late reader's bytes are left")
    }

    @Test("randomized: processes never hold conflicting claims together, and once no new claim comes every waiting one gets through",
          arguments: 0 ..< 40)
    func randomized(seed: Int) throws {
        var generator = SeededGenerator(seed: UInt64(seed) &+ 7000)
        let kernel = MemoryLocks()
        let paths: [FilePath] = ["/d", "/d/a", "/d/b", "/d/a/x", "/e"]
        struct Process {
            var claims: [Claim] = []
            var queued: [SpaceLocks.Byte] = []
            var held: SpaceLocks.Held?
            var holdFor = 0
        }
        var processes = Array(repeating: Process(), count: 3)
        func newClaims() -> [Claim] {
            // A subtree claim is a write only (a directory deleted, moved or replaced).
            (0 ..< Int.random(in: 1 ... 3, using: &generator)).map { _ in
                let writing = Bool.random(using: &generator)
                return Claim(path: paths.randomElement(using: &generator)!, access: writing ? .writing : .reading,
                             scope: writing && Int.random(in: 0 ..< 3, using: &generator) == 0 ? .subtree : .item)
            }
        }
        /// One step of process `index`: a new claim, a try, or a release.
        func step(_ index: Int, newWork: Bool) throws {
            var process = processes[index]
            defer { processes[index] = process }
            if let held = process.held {
                if process.holdFor > 0 && newWork { process.holdFor -= 1; return }
                kernel.process(index).release(held)
                process = Process()
                return
            }
            if process.claims.isEmpty {
                guard newWork else { return }
                process.claims = newClaims()
            }
            let plan = SpaceLocks.plan(for: process.claims)
            if case .held(let held) = try SpaceLocks.attempt(plan, queued: &process.queued, calls: kernel.process(index)) {
                process.held = held
                process.holdFor = Int.random(in: 0 ... 3, using: &generator)
            }
        }
        func checkExclusion() {
            let holding = processes.filter { $0.held != nil }
            for i in holding.indices {
                for j in holding.indices where j > i {
                    let clash = holding[i].claims.contains { a in holding[j].claims.contains { CoordinationRules.conflict(a, $0) } }
                    #expect(!clash, "seed \(seed): two processes hold \(Self.describe(holding[i].claims)) and \(Self.describe(holding[j].claims))")
                }
            }
        }
        for _ in 0 ..< 400 {
            try step(Int.random(in: 0 ..< processes.count, using: &generator), newWork: true)
            checkExclusion()
        }
        // No new claims: every try goes round; a cycle of waits would never end.
        var rounds = 0
        while processes.contains(where: { !$0.claims.isEmpty }), rounds < 50 {
            for index in processes.indices { try step(index, newWork: false) }
            checkExclusion()
            rounds += 1
        }
        #expect(rounds < 50, "seed \(seed): waits that never end: \(processes.map { Self.describe($0.claims) })")
        #expect(kernel.holders.isEmpty, "seed \(seed): bytes left held")
    }
}

extension ClaimAttemptTests {
    static func describe(_ claims: [Claim]) -> String {
        claims.map { "\($0.access == .reading ? "read" : "write")\($0.scope == .subtree ? " subtree" : "") \($0.path)" }
            .joined(separator: ", ")
    }
}

extension SpaceLocks.Attempt {
    var isConflict: Bool { if case .conflict = self { true } else { false } }
}

/// Byte locks in memory with OFD semantics, one owner per process: an owner's lock on a
/// byte is shared or exclusive; another owner's exclusive lock excludes every lock, a
/// shared one excludes exclusive locks. Each owner counts its takes (as a process counts
/// its tasks' in ``ByteCounts``): its lock goes with the last give.
final class MemoryLocks {
    /// Offset -> owner -> (shared takes, exclusive takes).
    private(set) var holders: [Int64: [Int: (shared: Int, exclusive: Int)]] = [:]

    func process(_ owner: Int) -> Process { Process(kernel: self, owner: owner) }

    /// The owner died: the kernel drops its locks.
    func dropAll(of owner: Int) {
        for offset in holders.keys {
            holders[offset]?[owner] = nil
            if holders[offset]?.isEmpty == true { holders[offset] = nil }
        }
    }

    struct Process: ClaimLockCalls {
        let kernel: MemoryLocks
        let owner: Int

        private func othersExclusive(_ offset: Int64) -> Bool {
            (kernel.holders[offset] ?? [:]).contains { $0.key != owner && $0.value.exclusive > 0 }
        }

        func take(_ byte: SpaceLocks.Byte) throws -> SpaceLocks.Take {
            let others = (kernel.holders[byte.offset] ?? [:]).filter { $0.key != owner }
            if byte.exclusive ? !others.isEmpty : othersExclusive(byte.offset) { return .conflict }
            var mine = kernel.holders[byte.offset]?[owner] ?? (0, 0)
            if byte.exclusive { mine.exclusive += 1 } else { mine.shared += 1 }
            kernel.holders[byte.offset, default: [:]][owner] = mine
            return .taken
        }

        func check(_ offset: Int64, writerWaits: inout Bool?) throws -> SpaceLocks.Take {
            if writerWaits == nil {
                // As the waiting flag, once per try: another process's writer holds a queue
                // byte (slot + 2; slots are multiples of 4). A flag raised by waiting writers
                // only would be set less often; this one still lets the try skip its checks
                // when no other writer is queued anywhere.
                writerWaits = kernel.holders.contains { offset, owners in
                    offset % 4 == 2 && owners.contains { $0.key != owner && $0.value.exclusive > 0 }
                }
            }
            guard writerWaits == true else { return .taken }
            return othersExclusive(offset) ? .conflict : .taken
        }

        @discardableResult
        func give(_ byte: SpaceLocks.Byte) -> Bool {
            guard var mine = kernel.holders[byte.offset]?[owner] else { return false }
            if byte.exclusive { mine.exclusive -= 1 } else { mine.shared -= 1 }
            kernel.holders[byte.offset]?[owner] = mine.shared + mine.exclusive > 0 ? mine : nil
            if kernel.holders[byte.offset]?.isEmpty == true { kernel.holders[byte.offset] = nil }
            return true
        }

        func release(_ held: SpaceLocks.Held) {
            for byte in held.bytes.reversed() { give(byte) }
        }
    }
}
