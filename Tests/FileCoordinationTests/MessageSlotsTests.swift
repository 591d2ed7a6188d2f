import Foundation
import Testing
@testable import FileCoordination

/// A sender's message slots in another process's mailbox (docs/protocol.md, Messages),
/// with this test playing the receiver: it reads a slot and truncates it, as
/// `SpaceMail.received` does.
@Suite("message slots")
struct MessageSlotsTests {
    let sandbox = Sandbox()
    var mailbox: String { sandbox.url.path + "/mail/target" }

    /// Runs `body` with slots of the sender `1-abc` and the space directory's descriptor.
    func withSlots(_ body: (MessageSlots, Int32) throws -> Void) throws {
        try FileManager.default.createDirectory(atPath: mailbox, withIntermediateDirectories: true)
        let directoryFD = open(sandbox.url.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try #require(directoryFD >= 0)
        defer { close(directoryFD) }
        try body(MessageSlots(me: "1-abc"), directoryFD)
    }

    /// Sends `text` as the sender does: a lease, one write, close, then a spare.
    func send(_ text: String, _ slots: MessageSlots, _ directoryFD: Int32) throws -> MessageSlots.Lease? {
        guard let lease = try slots.open(for: "target", dirFD: directoryFD) else { return nil }
        let bytes = Array(text.utf8)
        #expect(write(lease.fd, bytes, bytes.count) == bytes.count)
        close(lease.fd)
        slots.finished(lease, written: true, dirFD: directoryFD)
        slots.makeSpare(for: "target", dirFD: directoryFD)
        return lease
    }

    /// The receiver's side: every non-empty file's content, each file then emptied.
    func receive() throws -> [String] {
        var messages: [String] = []
        for name in try FileManager.default.contentsOfDirectory(atPath: mailbox).sorted() {
            let path = mailbox + "/" + name
            let content = try String(contentsOfFile: path, encoding: .utf8)
            guard !content.isEmpty else { continue }
            messages.append(content)
            #expect(truncate(path, 0) == 0)
        }
        return messages
    }

    func inode(_ name: String) -> UInt64? {
        (try? FileManager.default.attributesOfItem(atPath: mailbox + "/" + name)[.systemFileNumber] as? UInt64) ?? nil
    }

    @Test("a slot emptied by its receiver is written again: 50 messages make no new file after the first two")
    func reuse() throws {
        try withSlots { slots, directoryFD throws in
            var inodes: Set<UInt64> = []
            for index in 0 ..< 50 {
                let lease = try #require(try send("message \(index)", slots, directoryFD))
                #expect(lease.generation != nil)
                #expect(try receive() == ["message \(index)"])
                for name in try FileManager.default.contentsOfDirectory(atPath: mailbox) {
                    #expect(MessageSlots.isSlot(Array(name.utf8)), "\(name)")
                    if let inode = inode(name) { inodes.insert(inode) }
                }
            }
            // The slot written and the spare opened after it.
            #expect(inodes.count == 2, "\(inodes)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox).sorted() == ["1-abc-r0", "1-abc-r1"])
        }
    }

    @Test("a slot not read yet is never written; past four, the sender falls back to a file of its own")
    func unread() throws {
        try withSlots { slots, directoryFD throws in
            for index in 0 ..< MessageSlots.slotsPerTarget {
                #expect(try send("message \(index)", slots, directoryFD) != nil)
            }
            #expect(try slots.open(for: "target", dirFD: directoryFD) == nil)
            // Every message is still there, each in its own slot.
            #expect(try receive() == (0 ..< MessageSlots.slotsPerTarget).map { "message \($0)" })
            #expect(try send("after", slots, directoryFD) != nil)
            #expect(try receive() == ["after"])
        }
    }

    @Test("a slot closed without a message is removed and its name never used again; leaving removes the rest")
    func retire() throws {
        try withSlots { slots, directoryFD throws in
            let failed = try #require(try slots.open(for: "target", dirFD: directoryFD))
            close(failed.fd)
            slots.finished(failed, written: false, dirFD: directoryFD)
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox) == [])
            let next = try #require(try send("hello", slots, directoryFD))
            #expect(next.generation != failed.generation)
            #expect(try receive() == ["hello"])
            // The slot written and the spare opened after it.
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox).count == 2)
            slots.removeAll(dirFD: directoryFD)
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox) == [])
            #expect(try slots.open(for: "target", dirFD: directoryFD) == nil)
        }
    }

    @Test("a target dropped as gone takes its spare with it")
    func drop() throws {
        try withSlots { slots, directoryFD throws in
            let sent = try #require(try send("hello", slots, directoryFD))
            #expect(try receive() == ["hello"])
            slots.drop("target", dirFD: directoryFD)
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox) == ["1-abc-r\(sent.generation!)"])
        }
    }

    @Test("a mailbox that is gone ends the send with .gone")
    func gone() throws {
        try withSlots { slots, directoryFD throws in
            try FileManager.default.removeItem(atPath: mailbox)
            #expect(throws: SpaceMail.SendError.gone) { _ = try slots.open(for: "target", dirFD: directoryFD) }
        }
    }
}
