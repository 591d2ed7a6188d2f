import Foundation
import Testing
@testable import FileCoordination

@Suite("reply deadlines")
struct ReplyDeadlinesTests {
    @Test("deadlines expire in time order, an earlier one added later included; a removed one never expires")
    func expireInOrder() async {
        let deadlines = ReplyDeadlines()
        let log = EventLog()
        deadlines.add(1, after: .milliseconds(300)) { log.append("1") }
        deadlines.add(3, after: .milliseconds(100)) { log.append("3") }
        deadlines.add(2, after: .milliseconds(50)) { log.append("2") }
        deadlines.remove(3)
        await log.waitFor("1")
        #expect(log.all == ["2", "1"])
        // Idle now; a new deadline starts a sleeper again.
        deadlines.add(4, after: .milliseconds(10)) { log.append("4") }
        await log.waitFor("4")
        #expect(log.all == ["2", "1", "4"])
    }
}
