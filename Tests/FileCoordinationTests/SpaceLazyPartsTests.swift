import Foundation
import Testing
import TestSupport
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

/// What a process holds of a space while it is in it, and gives back when it leaves: a
/// long-lived process that joins and leaves spaces keeps nothing of the ones it left.
@Suite("leaving a space")
struct SpaceLeavingTests {
    let sandbox = Sandbox()

    @Test("a process that joined, claimed, presented and watched, then left, keeps no descriptor in the space and no watch on it")
    func leavingKeepsNothing() async throws {
        let root = FilePath(sandbox.url.path + "/space")
        let item = FilePath(sandbox.url.path + "/item")
        #expect(FileManager.default.createFile(atPath: item.string, contents: Data("x".utf8)))
        for _ in 0 ..< 3 {
            let (space, mail) = try await joinUseAndLeave(root, item)
            // Work under way as the process left (the watcher thread's last delivery) may
            // hold the space's parts a moment longer; bounded, polled.
            for _ in 0 ..< 5_000 where space.value != nil || mail.value != nil {
                try await Task.sleep(for: .milliseconds(1)) // ok: polling for another thread's last release, bounded
            }
            #expect(space.value == nil, "the space is kept after the process left it")
            #expect(mail.value == nil, "the space's mail is kept after the process left it")
            #expect(openDescriptors(under: root) == 0, "descriptors left open in a space the process left")
            let watched = ["", "claims.lock", "claims", "procs"].map { $0.isEmpty ? root : root.appending($0) }
            #expect(KernelWatches.count(on: watched) == 0, "watches left on a space the process left")
        }
    }

    /// Joins the space at `root`, uses every part of it, leaves it; returns what is left of it.
    private func joinUseAndLeave(_ root: FilePath, _ item: FilePath) async throws -> (space: Weak<CoordinationSpace>, mail: Weak<SpaceMail>) {
        let space = try await CoordinationSpace.join(root, hooks: CoordinationCenter.spaceHooks)
        try await space.locks.openShards(UInt64.max)
        #expect(space.takeClaimsNow([CoordinationRules.Claim(path: item, access: .writing)], for: 1))
        space.releaseClaims(of: 1)
        let presenter = Recorder("p", url: item.fileURL, log: EventLog())
        #expect(await space.publish(presenter, at: item))
        #expect(await space.startWatching())
        #expect(openDescriptors(under: root) > 0, "the space's files are not open while the process is in it")
        await space.withdraw(presenter)
        await space.leave()
        return (Weak(space), Weak(space.mail))
    }
}

/// A reference that does not keep its object.
final class Weak<Object: AnyObject>: @unchecked Sendable {
    weak var value: Object?
    init(_ value: Object) { self.value = value }
}
