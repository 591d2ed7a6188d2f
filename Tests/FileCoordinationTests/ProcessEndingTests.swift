import Testing
@testable import FileCoordination

/// What a process does when another may have ended, decided without I/O.
@Suite("a process that may have ended")
struct ProcessEndingTests {
    @Test("a dead process awaited and owed: its requests end unanswered, its relinquishes are given back, its files cleaned up")
    func deadAwaitedAndOwed() {
        let outcome = ProcessEnding.decide(waiting: [3, 5], owes: true) { false }
        #expect(outcome == ProcessEnding.Outcome(unanswered: [3, 5], givesBack: true, cleansUp: true))
    }

    @Test("a dead process only owed: its relinquishes are given back; nothing awaited it, so nothing found it gone to clean up")
    func deadOnlyOwed() {
        #expect(ProcessEnding.decide(waiting: [], owes: true) { false } == ProcessEnding.Outcome(givesBack: true))
    }

    @Test("a dead process only awaited: its requests end unanswered and its files are cleaned up; nothing is given back")
    func deadOnlyAwaited() {
        #expect(ProcessEnding.decide(waiting: [7], owes: false) { false } == ProcessEnding.Outcome(unanswered: [7], cleansUp: true))
    }

    @Test("a live process is left alone, and one neither awaited nor owed is not even looked at")
    func aliveOrUnconcerned() {
        #expect(ProcessEnding.decide(waiting: [1], owes: true) { true } == ProcessEnding.Outcome())
        var looked = 0
        let outcome = ProcessEnding.decide(waiting: [], owes: false) {
            looked += 1
            return false
        }
        #expect(outcome == ProcessEnding.Outcome())
        #expect(looked == 0, "a process nothing depends on was looked for in the file system")
    }

    @Test("after an overflow every process awaited or owed is looked at again, once each, in order")
    func recheck() {
        #expect(ProcessEnding.toRecheck(awaited: ["b", "a"], owed: ["c", "a"]) == ["a", "b", "c"])
    }
}
