import Testing
@testable import FileCoordination

/// The messages waiting to be written to one process (``Outbox``), step by step.
@Suite("Outbox")
struct OutboxTests {
    typealias Box = Outbox<String, Int>

    /// Takes writes and waiters in order, each write succeeding, until the outbox is empty.
    func drained(_ box: inout Box) -> [String] {
        var steps: [String] = []
        while true {
            switch box.next() {
            case .empty: return steps
            case .resume(let waiter): steps.append("resume \(waiter)")
            case .write(let write, _):
                steps.append(write)
                box.written()
            }
        }
    }

    @Test("writes and waiters are taken in the order posted")
    func inOrder() {
        var box = Box("did-change")
        box.post("reacquire")
        let waits = box.wait(1)
        #expect(waits)
        box.post("relinquish")
        #expect(box.hasQueued)
        #expect(drained(&box) == ["did-change", "reacquire", "resume 1", "relinquish"])
        #expect(box.isEmpty)
    }

    @Test("a failed write stays first, the waiters go at once, and a later waiter does not wait until it is written")
    func failedWriteKeepsOrder() {
        var box = Box("did-change")
        box.post("reacquire")
        let waits = box.wait(1)
        #expect(waits)
        guard case .write("did-change", failures: 0) = box.next() else { Issue.record("not the first write"); return }
        let (pause, resume) = box.failed()
        #expect(pause == 10 && resume == [1])
        let waitsForFailed = box.wait(2)
        #expect(!waitsForFailed, "a coordination does not wait for a write that failed")
        box.post("relinquish")
        guard case .write("did-change", failures: 1) = box.next() else { Issue.record("the failed write is not first"); return }
        box.written()
        #expect(drained(&box) == ["reacquire", "relinquish"])
        let waitsAgain = box.wait(3)
        #expect(waitsAgain, "written again: coordinations wait again")
    }

    @Test("the pause doubles from 10 ms up to 1 s")
    func pauses() {
        var box = Box("did-change")
        var pauses: [Int] = []
        for _ in 0 ..< 10 { pauses.append(box.failed().pauseMilliseconds) }
        #expect(pauses == [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000])
        box.written()
        let next = box.failed().pauseMilliseconds
        #expect(next == 10, "counted again for the next write")
    }
}
