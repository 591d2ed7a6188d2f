import Testing
@testable import FileCoordination

/// How one request for a presenter is served (``ServingMachine``), action by action: each
/// test plays the driver, answering every action with the event its callback would give.
@Suite("Serving machine")
struct ServingMachineTests {
    typealias Machine = ServingMachine<String>
    let writer = ServingLedger<String>.Key(process: "10-a", request: 1)

    /// Serves `item`, answering each action from `answers` (by the action's name), and
    /// returns the actions in order.
    func serve(_ item: Machine.Item, hasPresenter: Bool = true, ledger: inout ServingLedger<String>,
               answers: [String: Machine.Event]) -> [String] {
        Machine.arrived(item, ledger: &ledger)
        var (machine, action) = Machine.start(item, hasPresenter: hasPresenter, ledger: &ledger)
        var actions: [String] = []
        while true {
            let event: Machine.Event
            switch action {
            case .relinquish: actions.append("relinquish"); event = answers["relinquish"]!
            case .followUps: actions.append("follow-ups"); event = answers["follow-ups"]!
            case .undo(let kept): actions.append("undo \(kept)"); event = .undone
            case .reacquire(let kept): actions.append("reacquire \(kept)"); event = .undone
            case .deliver: actions.append("deliver"); return actions
            case .reply(let failure): actions.append("reply" + (failure.map { " \($0)" } ?? "")); return actions
            case .end: actions.append("end"); return actions
            }
            action = machine.handle(event, ledger: &ledger)
        }
    }

    @Test("a relinquish with a save: the reacquirer is kept before the save and the reply; its reacquire gives it back")
    func relinquishSaveReacquire() {
        var ledger = ServingLedger<String>()
        let served = serve(.relinquish(writer, followUps: true), ledger: &ledger,
                           answers: ["relinquish": .relinquished("r1"), "follow-ups": .followedUp])
        #expect(served == ["relinquish", "follow-ups", "reply"])
        #expect(ledger.keptCount == 1 && ledger.owes("10-a"))
        let reacquired = serve(.reacquire(writer), ledger: &ledger, answers: [:])
        #expect(reacquired == ["reacquire r1", "end"])
        #expect(ledger.keptCount == 0 && !ledger.owes("10-a"))
    }

    @Test("a refusal is replied, and nothing is kept")
    func refused() {
        var ledger = ServingLedger<String>()
        let served = serve(.relinquish(writer, followUps: true), ledger: &ledger, answers: ["relinquish": .failed("no")])
        #expect(served == ["relinquish", "reply no"])
        #expect(!ledger.owes("10-a"))
    }

    @Test("a save that fails after the relinquish: the item is given back before the failure is replied")
    func followUpFails() {
        var ledger = ServingLedger<String>()
        let served = serve(.relinquish(writer, followUps: true), ledger: &ledger,
                           answers: ["relinquish": .relinquished("r1"), "follow-ups": .failed("disk full")])
        #expect(served == ["relinquish", "follow-ups", "undo r1", "reply disk full"])
        #expect(!ledger.owes("10-a"))
    }

    @Test("the asker died while the presenter relinquished: undone at once, and nothing kept for it")
    func askerDiedWhileRelinquishing() {
        var ledger = ServingLedger<String>()
        Machine.arrived(.relinquish(writer, followUps: false), ledger: &ledger)
        var (machine, action) = Machine.start(.relinquish(writer, followUps: false), hasPresenter: true, ledger: &ledger)
        guard case .relinquish = action else { Issue.record("not asked: \(action)"); return }
        _ = ledger.senderDied("10-a")
        action = machine.handle(.relinquished("r1"), ledger: &ledger)
        guard case .undo("r1") = action else { Issue.record("not undone: \(action)"); return }
        action = machine.handle(.undone, ledger: &ledger)
        guard case .reply(nil) = action else { Issue.record("no reply: \(action)"); return }
        #expect(ledger.keptCount == 0)
    }

    @Test("a relinquish whose reacquire came first, or whose presenter is gone, calls no presenter")
    func notServed() {
        var ledger = ServingLedger<String>()
        Machine.arrived(.relinquish(writer, followUps: false), ledger: &ledger)
        Machine.arrived(.reacquire(writer), ledger: &ledger)
        let (_, action) = Machine.start(.relinquish(writer, followUps: false), hasPresenter: true, ledger: &ledger)
        guard case .end = action else { Issue.record("served: \(action)"); return }
        let served = serve(.relinquish(writer, followUps: false), hasPresenter: false, ledger: &ledger, answers: [:])
        #expect(served == ["reply"])
        #expect(!ledger.owes("10-a"))
    }

    @Test("a dead asker's notice undoes each relinquish it left kept, one after another; other calls are delivered")
    func senderGoneAndOthers() {
        var ledger = ServingLedger<String>()
        let second = ServingLedger<String>.Key(process: "10-a", request: 2)
        for (key, kept) in [(writer, "r1"), (second, "r2")] {
            _ = serve(.relinquish(key, followUps: false), ledger: &ledger, answers: ["relinquish": .relinquished(kept)])
        }
        let owed = ledger.senderDied("10-a")
        #expect(owed)
        let served = serve(.senderGone("10-a"), ledger: &ledger, answers: [:])
        #expect(served.count == 3 && Set(served.prefix(2)) == ["undo r1", "undo r2"] && served.last == "end")
        #expect(!ledger.owes("10-a"))
        let delivered = serve(.other, ledger: &ledger, answers: [:])
        #expect(delivered == ["deliver"])
    }
}
