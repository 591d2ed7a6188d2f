import Foundation
import Testing
@testable import FileCoordination

/// What a process of a space makes only once it needs it: a process that only claims (most
/// `filecoord exec`s) makes no mailbox and starts no task serving presenters' requests.
@Suite("a space's parts made on first need")
struct SpaceLazyPartsTests {
    let sandbox = Sandbox()

    @Test("claims alone make no mailbox and start no serving task; the first presenter makes the mailbox and starts serving; leaving removes the mailbox")
    func claimsAloneThenAPresenter() async throws {
        let root = sandbox.url.path + "/space"
        let space = try await CoordinationSpace.join(FilePath(root), hooks: CoordinationCenter.spaceHooks)
        let mailbox = root + "/mail/" + space.processName
        let item = FilePath(sandbox.url.path + "/item")
        #expect(FileManager.default.createFile(atPath: item.string, contents: Data("x".utf8)))
        try await space.locks.openShards(UInt64.max)
        #expect(space.takeClaimsNow([CoordinationRules.Claim(path: item, access: .writing)], for: 1))
        space.releaseClaims(of: 1)
        #expect(!FileManager.default.fileExists(atPath: mailbox), "a process that only claimed made a mailbox")
        #expect(!space.mail.server.isServing, "a process that presents nothing started serving")

        let presenter = Recorder("p", url: item.fileURL, log: EventLog())
        #expect(await space.publish(presenter, at: item))
        #expect(FileManager.default.fileExists(atPath: mailbox))
        #expect(space.mail.server.isServing)
        await space.withdraw(presenter)
        await space.leave()
        #expect(!FileManager.default.fileExists(atPath: mailbox))
    }
}
