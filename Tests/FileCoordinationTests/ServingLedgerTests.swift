import Testing
@testable import FileCoordination

/// What a process owes other processes' coordinators (``ServingLedger``), step by step.
@Suite("Serving ledger")
struct ServingLedgerTests {
    typealias Ledger = ServingLedger<String>
    let writer = Ledger.Key(process: "10-a", request: 1)

    @Test("a relinquish is served once, and its reacquire gives back what it kept")
    func servedThenReacquired() {
        var ledger = Ledger()
        ledger.relinquishArrived(writer)
        let started = ledger.startRelinquish(writer)
        #expect(started)
        let again = ledger.startRelinquish(writer)
        #expect(!again, "served once")
        let orphan = ledger.relinquished(writer, keeping: "reacquirer")
        #expect(orphan == nil)
        let given = ledger.reacquire(writer)
        #expect(given == "reacquirer")
        let twice = ledger.reacquire(writer)
        #expect(twice == nil)
        #expect(!ledger.owes("10-a"))
    }

    @Test("a reacquire that arrives before its relinquish started drops it")
    func gaveUpBeforeStart() {
        var ledger = Ledger()
        ledger.relinquishArrived(writer)
        ledger.reacquireArrived(writer)
        let served = ledger.startRelinquish(writer)
        #expect(!served)
    }

    @Test("a dead asker: its queued requests are dropped, and what it kept is given back in serving order")
    func askerDied() {
        var ledger = Ledger()
        let queued = Ledger.Key(process: "10-a", request: 2)
        let other = Ledger.Key(process: "11-b", request: 1)
        ledger.relinquishArrived(writer)
        let first = ledger.startRelinquish(writer)
        #expect(first)
        _ = ledger.relinquished(writer, keeping: "first")
        ledger.relinquishArrived(queued)
        ledger.relinquishArrived(other)
        let second = ledger.startRelinquish(other)
        #expect(second)
        _ = ledger.relinquished(other, keeping: "other")
        let notice = ledger.senderDied("10-a")
        #expect(notice, "something kept: a notice is queued")
        let late = ledger.startRelinquish(queued)
        #expect(!late, "never served")
        let undone = ledger.senderGoneServed("10-a")
        #expect(undone == ["first"])
        #expect(ledger.owes("11-b") && !ledger.owes("10-a"))
        let none = ledger.senderDied("12-c")
        #expect(!none, "owed nothing: no notice")
    }

    @Test("what is kept can change in place (the echo suppression ended on arrival)")
    func update() {
        var ledger = Ledger()
        ledger.update(writer) { $0 = "never kept" }
        #expect(ledger.keptCount == 0)
        ledger.relinquishArrived(writer)
        _ = ledger.startRelinquish(writer)
        _ = ledger.relinquished(writer, keeping: "a")
        ledger.update(writer) { $0 += "b" }
        let changed = ledger.reacquire(writer)
        #expect(changed == "ab")
    }

    @Test("an asker that dies while the presenter is relinquishing: what the presenter gives up is handed back at once")
    func askerDiedWhileRelinquishing() {
        var ledger = Ledger()
        ledger.relinquishArrived(writer)
        let started = ledger.startRelinquish(writer)
        #expect(started)
        #expect(ledger.owes("10-a"), "a running relinquish is owed")
        let notice = ledger.senderDied("10-a")
        #expect(!notice, "nothing kept yet: no notice")
        let orphan = ledger.relinquished(writer, keeping: "reacquirer")
        #expect(orphan == "reacquirer")
        #expect(ledger.keptCount == 0 && !ledger.owes("10-a"))
    }

    @Test("a refused relinquish owes nothing")
    func refused() {
        var ledger = Ledger()
        ledger.relinquishArrived(writer)
        _ = ledger.startRelinquish(writer)
        ledger.relinquishFailed(writer)
        #expect(!ledger.owes("10-a"))
    }
}
