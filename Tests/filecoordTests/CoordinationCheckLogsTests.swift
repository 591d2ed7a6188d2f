import Foundation
import Testing

/// The randomized checker's rules on logs written by hand: what a stopped or starved
/// worker leaves behind is not taken for a broken promise, and a broken one is still found.
@Suite("the randomized checker's reading of its logs")
struct CoordinationCheckLogsTests {
    /// Seconds as the logs' nanoseconds.
    private func ns(_ seconds: Double) -> String { String(Int64(seconds * 1e9)) }

    /// The change made at the end, heard at once (the worker is not deaf).
    private func end(_ at: Double) -> String { "W \(ns(at))\nU \(ns(at))\nH \(ns(at + 0.01))\n" }

    @Test("an ask served late, after the asker gave up on the presenter and ran its accessor, is not an ask twice")
    func lateAnswer() {
        // Worker 11 presents i0 and was stopped: it serves the ask of coordination c1 at
        // 12 s, after c1 gave up on it (its timeout) and ran its accessor at 10-11 s, and
        // then the ask of c2, whose accessor runs at 14 s.
        let presenter = "A i0 22 \(ns(12)) c1\nA i0 22 \(ns(13)) c2\n" + end(20)
        let asker = "B 1 write - i0 \(ns(10))\nE 1 \(ns(11))\nB 2 write - i0 \(ns(14))\nE 2 \(ns(15))\n" + end(20)
        let found = CoordinationCheck.findings([(11, presenter), (22, asker)], killed: [:], hung: false, counter: 0)
        #expect(found.problems.isEmpty, "\(found.problems)")
        #expect(found.asks == 2 && found.accesses == 2)
    }

    @Test("two asks of one presenter for one coordination are found")
    func askedTwice() {
        let presenter = "A i0 22 \(ns(1)) c1\nA i0 22 \(ns(2)) c1\n" + end(20)
        let asker = "B 1 write - i0 \(ns(3))\nE 1 \(ns(4))\n" + end(20)
        let found = CoordinationCheck.findings([(11, presenter), (22, asker)], killed: [:], hung: false, counter: 0)
        #expect(found.problems.count == 1)
        #expect(found.problems.first?.contains("asked 2 times by 22 for one coordination") == true, "\(found.problems)")
    }

    @Test("overlapping writers and a lost increment are found")
    func brokenPromises() {
        let one = "B 1 increment - counter \(ns(1))\nE 1 \(ns(3))\n" + end(20)
        let two = "B 1 increment - counter \(ns(2))\nE 1 \(ns(4))\n" + end(20)
        let found = CoordinationCheck.findings([(11, one), (22, two)], killed: [:], hung: false, counter: 1)
        #expect(found.problems.contains { $0.hasPrefix("overlap on counter") }, "\(found.problems)")
        #expect(found.problems.contains { $0.hasPrefix("lost update") }, "\(found.problems)")
    }

    @Test("a round whose logs keep growing is slow, not hung, however long it runs; one whose logs stop growing for the limit is hung")
    func progress() {
        var watch = ProgressWatch(limit: .seconds(90))
        let start = ContinuousClock.now
        for second in 0 ... 300 {
            let hung = watch.observe(size: second * 10, at: start + .seconds(second))
            #expect(!hung)
        }
        let quietFor89 = watch.observe(size: 3000, at: start + .seconds(389))
        let quietFor90 = watch.observe(size: 3000, at: start + .seconds(390))
        #expect(!quietFor89)
        #expect(quietFor90)
    }
}
