import Foundation
import Testing
@testable import FileCoordination

/// Cleaning up after other processes of a space: a dead one's slots are looked for in
/// every mailbox; one that left has none left anywhere, and no mailbox is listed for it.
@Suite("cleaning up after other processes")
struct SpaceCleanUpTests {
    let sandbox = Sandbox()

    @Test("a process that left (no record, no mailbox) lists no mailbox and is not reported as cleaned up after; one that died with its mailbox has its slots in others' removed")
    func leftAndDead() async throws {
        let root = sandbox.url.path + "/space"
        let space = try await CoordinationSpace.join(FilePath(root), hooks: CoordinationCenter.spaceHooks)
        // Another process's mailbox (pids above any pid_max: never alive), holding an
        // empty slot of each.
        let other = root + "/mail/4194302-d"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: other + "/4194301-a-r0", contents: nil))
        #expect(FileManager.default.createFile(atPath: other + "/4194303-b-r0", contents: nil))
        // 4194303-b died with its mailbox still there.
        try FileManager.default.createDirectory(atPath: root + "/mail/4194303-b", withIntermediateDirectories: true)

        #expect(await !space.mail.cleanUp("4194301-a"), "a process that left was reported as cleaned up after")
        #expect(FileManager.default.fileExists(atPath: other + "/4194301-a-r0"), "a mailbox was listed for a process that left")

        #expect(await space.mail.cleanUp("4194303-b"))
        #expect(!FileManager.default.fileExists(atPath: other + "/4194303-b-r0"))
        #expect(!FileManager.default.fileExists(atPath: root + "/mail/4194303-b"))
        await space.leave()
    }
}
