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
            // The slot written and the spare opened after it (no spare under a low
            // descriptor limit: one slot).
            #expect((1 ... 2).contains(inodes.count), "\(inodes)")
            #expect(Set(try FileManager.default.contentsOfDirectory(atPath: mailbox)).isSubset(of: ["1-abc-r0", "1-abc-r1"]))
        }
    }

    @Test("a slot not read yet is never written: with four unread, the sender gets no slot (it writes a file of its own)")
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

    @Test("a sender looks for an empty slot starting with the one it wrote longest ago, not the one it made first")
    func writtenLongestAgoFirst() throws {
        try withSlots { slots, directoryFD throws in
            var generations: [UInt64] = []
            func sendOne(_ text: String) throws {
                generations.append(try #require(try send(text, slots, directoryFD)?.generation))
            }
            for text in ["a", "b", "c"] { try sendOne(text) } // slots 0, 1 and 2, none read
            #expect(try receive().count == 3)
            try sendOne("d")
            try sendOne("e")
            #expect(try receive().count == 2)
            try sendOne("f")
            try sendOne("g")
            // Slot 2, written third, is then the empty slot written longest ago (slot 0 was
            // written again since). With spares, the slot for a message is chosen as the
            // message before it ends: "g" takes it; without, "f" does.
            #expect((slots.hasSpare(for: "target") ? generations[6] : generations[5]) == 2, "\(generations)")
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
            // The slot written and the spare opened after it (no spare under a descriptor
            // limit below 256: the slot alone).
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox).count == (slots.hasSpare(for: "target") ? 2 : 1))
            slots.removeAll(dirFD: directoryFD)
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox) == [])
            #expect(try slots.open(for: "target", dirFD: directoryFD) == nil)
        }
    }

    @Test("leaving removes the empty slots and leaves one not read yet to its receiver")
    func leaveUnread() throws {
        try withSlots { slots, directoryFD throws in
            _ = try send("did-change", slots, directoryFD)
            _ = try send("reacquire", slots, directoryFD)
            #expect(try receive() == ["did-change", "reacquire"])
            let last = try #require(try send("last", slots, directoryFD))
            slots.removeAll(dirFD: directoryFD)
            #expect(try FileManager.default.contentsOfDirectory(atPath: mailbox) == ["1-abc-r\(last.generation!)"])
            #expect(try receive() == ["last"])
        }
    }

    @Test("the receiver's truncation through /proc/self/fd signals no IN_CLOSE_WRITE; truncating through a descriptor opened for writing would")
    func truncationIsSilent() throws {
        try FileManager.default.createDirectory(atPath: mailbox, withIntermediateDirectories: true)
        let inotify = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        try #require(inotify >= 0)
        defer { close(inotify) }
        #expect(inotify_add_watch(inotify, mailbox, UInt32(IN_CLOSE_WRITE)) >= 0)
        // The events queued, once at least `expected` are (waiting up to 10 s for them). A
        // close's event can come late: a process another test spawns at that moment holds
        // the descriptor until its exec.
        func closeWrites(expecting expected: Int) -> Int {
            var events = 0
            var buffer = [UInt8](repeating: 0, count: 4096)
            let deadline = ContinuousClock.now + .seconds(10)
            repeat {
                var ready = pollfd(fd: inotify, events: Int16(POLLIN), revents: 0)
                if events < expected { _ = poll(&ready, 1, 100) }
                let count = buffer.withUnsafeMutableBytes { read(inotify, $0.baseAddress, $0.count) }
                var offset = 0
                while offset < count {
                    events += 1
                    let length = buffer.withUnsafeBytes { $0.load(fromByteOffset: offset + 12, as: UInt32.self) }
                    offset += 16 + Int(length)
                }
            } while events < expected && ContinuousClock.now < deadline
            return events
        }
        let path = mailbox + "/1-abc-r0"
        let created = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        #expect(write(created, "message", 7) == 7)
        close(created)
        #expect(closeWrites(expecting: 1) == 1)
        let reader = open(path, O_RDONLY | O_CLOEXEC)
        #expect(truncate("/proc/self/fd/\(reader)", 0) == 0)
        close(reader)
        #expect(closeWrites(expecting: 0) == 0)
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)).isEmpty)
        let writer = open(path, O_RDWR | O_CLOEXEC)
        #expect(ftruncate(writer, 0) == 0)
        close(writer)
        #expect(closeWrites(expecting: 1) == 1)
    }

    @Test("an empty slot replaced by a FIFO (or anything but a file) is never opened: the send goes on at once, the name is removed")
    func fifoInPlaceOfSlot() throws {
        try withSlots { slots, directoryFD throws in
            _ = try #require(try send("first", slots, directoryFD))
            #expect(try receive() == ["first"])
            var fifos: [String] = []
            for name in try FileManager.default.contentsOfDirectory(atPath: mailbox) {
                let path = mailbox + "/" + name
                #expect(unlink(path) == 0)
                #expect(mkfifo(path, 0o600) == 0)
                fifos.append(path)
            }
            try #require(!fifos.isEmpty)
            // On a thread of its own: a send blocked in the FIFO's open is let go by a
            // reader opened after the bound.
            let sent = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                _ = try? send("second", slots, directoryFD)
                sent.signal()
            }
            let ended = sent.wait(timeout: .now() + 5) == .success
            if !ended { for path in fifos { close(open(path, O_RDONLY | O_NONBLOCK)) } }
            #expect(ended, "the send waited in a FIFO's open")
            _ = sent.wait(timeout: .now() + 5)
            for path in fifos { #expect(!FileManager.default.fileExists(atPath: path) || !isFIFO(path), "\(path) is still a FIFO") }
            #expect(try receive() == ["second"])
        }
    }

    func isFIFO(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO
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

    @Test("past 64 processes written to, the one used longest ago is forgotten and its empty slots removed")
    func manyTargets() throws {
        try withSlots { slots, directoryFD throws in
            let count = MessageSlots.maximumTargets + 36
            for index in 0 ..< count {
                let target = "target-\(index)"
                try FileManager.default.createDirectory(atPath: sandbox.url.path + "/mail/" + target, withIntermediateDirectories: true)
                let lease = try #require(try slots.open(for: target, dirFD: directoryFD))
                #expect(write(lease.fd, "m", 1) == 1)
                close(lease.fd)
                slots.finished(lease, written: true, dirFD: directoryFD)
                slots.makeSpare(for: target, dirFD: directoryFD)
                // The receiver reads it.
                #expect(truncate(sandbox.url.path + "/mail/\(target)/1-abc-r\(lease.generation!)", 0) == 0)
            }
            let left = try (0 ..< count).map { try FileManager.default.contentsOfDirectory(atPath: sandbox.url.path + "/mail/target-\($0)").count }
            #expect(left.prefix(count - MessageSlots.maximumTargets).allSatisfy { $0 == 0 }, "\(left)")
            #expect(left.suffix(MessageSlots.maximumTargets).allSatisfy { $0 > 0 }, "\(left)")
            // A forgotten process written to again gets new slots.
            let again = try #require(try slots.open(for: "target-0", dirFD: directoryFD))
            close(again.fd)
            slots.finished(again, written: false, dirFD: directoryFD)
        }
    }

    @Test("a mailbox that is gone ends the send with .gone")
    func gone() throws {
        try withSlots { slots, directoryFD throws in
            try FileManager.default.removeItem(atPath: mailbox)
            #expect(throws: SpaceMail.SendError.gone) { _ = try slots.open(for: "target", dirFD: directoryFD) }
        }
    }

    @Test("a receiver's read leaves the slot's access time as it was (no inode dirtied per message)")
    func readLeavesAccessTime() throws {
        try withSlots { slots, directoryFD throws in
            _ = try #require(try send("message", slots, directoryFD))
            // The slot written (the spare beside it is empty).
            let name = try #require(try FileManager.default.contentsOfDirectory(atPath: mailbox).first {
                (try? FileManager.default.attributesOfItem(atPath: mailbox + "/" + $0)[.size] as? Int) == 7
            })
            // An access time older than the modification time: a `relatime` (or
            // `strictatime`) mount updates it on the next read.
            var times = [timespec(tv_sec: 1_000_000, tv_nsec: 0), timespec(tv_sec: 2_000_000, tv_nsec: 0)]
            #expect(utimensat(AT_FDCWD, mailbox + "/" + name, &times, 0) == 0)
            let mailboxFD = open(mailbox, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            try #require(mailboxFD >= 0)
            defer { close(mailboxFD) }
            guard case .success(let fd) = SpaceMail.openMessage(dirFD: mailboxFD, name: Array(name.utf8)) else {
                Issue.record("the slot could not be opened")
                return
            }
            var buffer = [UInt8](repeating: 0, count: 64)
            #expect(read(fd, &buffer, buffer.count) == 7)
            close(fd)
            var info = stat()
            #expect(stat(mailbox + "/" + name, &info) == 0)
            #expect(info.st_atim.tv_sec == 1_000_000)
        }
    }
}
