import AsyncFileIO
import SystemCalls
import CFileCoordinationShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Message files used again and again: *slots*.
///
/// A message to another process is a file in that process's mailbox. Creating one file
/// per message and unlinking it after reading churns inodes: on ext4 without a journal
/// every new inode scans past the recently deleted ones (`recently_deleted` in the
/// kernel), and the receiver's unlink waits for the directory's lock while the sender
/// creates the next file (together 6% of a profile of a stream of writes; the stream was
/// 10-20% faster without them). So a sender keeps up to ``slotsPerTarget`` files of its
/// own in each receiver's mailbox, named `<sender>-r<generation>`; the receiver reads a
/// slot and truncates it to empty instead of unlinking it, and the sender writes its next
/// message into a slot it finds empty. No inode is made or freed in a steady stream.
///
/// The rule that keeps messages in order: every `IN_CLOSE_WRITE` on a live slot is the
/// close after one message. The sender writes a slot only when it is empty (read and
/// truncated by the receiver, which reads only on that event), and a slot closed without
/// a message written (a spare given up, a failed write) is *retired*: unlinked, and its
/// generation never used again, so the event of that close finds no file (or an empty
/// one).
///
/// For the few processes written to last, the next slot is opened after each message
/// (a *spare*), so the next message is a `write` and a `close` with no path lookup.
/// All of it blocks: it runs on the library's I/O threads.
final class MessageSlots: Sendable {
    /// Slots one sender keeps in one mailbox.
    static let slotsPerTarget = 4
    /// Spares kept at most: one descriptor each.
    static let maximumSpares = 4
    /// Processes whose slots are remembered at most. A long-lived process that answers
    /// many short-lived ones would otherwise remember every one of them; the one used
    /// longest ago (with nothing being written) is forgotten, its empty slots removed.
    static let maximumTargets = 64

    /// A file opened for one message.
    struct Lease {
        let fd: Int32
        let target: String
        /// The slot's generation; nil for a one-shot file (created for this message).
        let generation: UInt64?
    }

    private struct Target {
        /// Generations whose files exist, as far as this process knows, the one written
        /// longest ago first: its receiver has most likely emptied it, so the search for
        /// an empty slot looks at it first.
        var live: [UInt64] = []
        /// Generations being written or held as the spare.
        var reserved: Set<UInt64> = []
        var spare: (fd: Int32, generation: UInt64)?
        /// When this process last wrote to the target (a count of uses).
        var used: UInt64 = 0
    }

    private struct State {
        var targets: [String: Target] = [:]
        /// Targets in the order their spares were made, the oldest first.
        var spareOrder: [String] = []
        var nextGeneration: UInt64 = 0
        var uses: UInt64 = 0
        var closed = false
        /// Every mailbox this process made a slot in (up to ``maximumMailboxesRemembered``;
        /// nil past that): only those can hold its slots when it leaves.
        var madeSlotsIn: Set<String>? = []
    }

    /// Mailboxes remembered for leaving; past it, leaving looks through every mailbox.
    static let maximumMailboxesRemembered = 4096

    private let state = Locked(State())
    private let me: String
    /// False when the descriptor limit is low: a descriptor is worth more than a lookup.
    private let keepsSpares: Bool

    init(me: String) {
        self.me = me
        keepsSpares = if case .success(let limit) = Syscall.descriptorLimit() { limit.rlim_cur >= 256 } else { false }
    }

    /// The name of a slot relative to the space directory.
    private func name(_ target: String, _ generation: UInt64) -> String {
        SpaceLayout.slot(to: target, from: me, generation: generation)
    }

    /// Whether a file name in a mailbox is a slot (`<sender>-r<generation>`) rather than a
    /// one-shot message (`<sender>-<number>`).
    static func isSlot(_ name: [UInt8]) -> Bool {
        guard let dash = name.lastIndex(of: UInt8(ascii: "-")), dash + 1 < name.count else { return false }
        return name[dash + 1] == UInt8(ascii: "r")
    }

    /// The sender a slot's name gives (`<sender>` of `<sender>-r<generation>`), if it is a
    /// process's name.
    static func sender(ofSlot name: [UInt8]) -> String? {
        guard let dash = name.lastIndex(of: UInt8(ascii: "-")) else { return nil }
        let sender = String(decoding: name[..<dash], as: UTF8.self)
        return SpaceMail.isProcessName(sender) ? sender : nil
    }

    /// Opens the file for the next message to `target`: its spare, else an empty slot,
    /// else a new slot while it has fewer than ``slotsPerTarget``. Nil when every slot
    /// holds a message not read yet: the caller then creates a one-shot file. Throws
    /// ``SpaceMail/SendError/gone`` when the mailbox no longer exists.
    func open(for target: String, dirFD: Int32) throws(SpaceMail.SendError) -> Lease? {
        let spare: (fd: Int32, generation: UInt64)? = state.withLock { state in
            state.uses += 1
            state.targets[target]?.used = state.uses
            guard let spare = state.targets[target]?.spare else { return nil }
            state.targets[target]?.spare = nil
            state.spareOrder.removeAll { $0 == target }
            return spare
        }
        if let spare {
            // Empty: only this process writes it, and it was empty when opened.
            if case .success(let info) = Syscall.fstat(spare.fd), info.st_nlink > 0 {
                return Lease(fd: spare.fd, target: target, generation: spare.generation)
            }
            _ = Syscall.close(spare.fd)
            retire(target, spare.generation, dirFD: dirFD)
        }
        return try claim(for: target, dirFD: dirFD, onlyKnown: false)
    }

    /// Reserves and opens an empty slot, or a new one. With `onlyKnown`, only for a
    /// target this process has written to and not dropped since.
    private func claim(for target: String, dirFD: Int32, onlyKnown: Bool) throws(SpaceMail.SendError) -> Lease? {
        let candidates: [UInt64] = state.withLock { state in
            guard !state.closed, let known = state.targets[target] else { return [] }
            return known.live.filter { !known.reserved.contains($0) }
        }
        for generation in candidates {
            // Still live (another thread may have retired it since the list was taken,
            // and be about to unlink it) and not reserved by another thread meanwhile.
            let reserved = state.withLock { state in
                guard state.targets[target]?.live.contains(generation) == true else { return false }
                return state.targets[target]?.reserved.insert(generation).inserted ?? false
            }
            guard reserved else { continue }
            let name = name(target, generation)
            // Gone (removed by its receiver, one that unlinks what it read, or with the
            // mailbox): forgotten; any other failure only skips it this time.
            func skip(_ errno: Errno) { if errno == .noSuchFileOrDirectory { forget(target, generation) } else { unreserve(target, generation) } }
            let info: stat
            switch Syscall.lstatat(dirFD, name) {
            case .success(let value): info = value
            case .failure(let errno):
                skip(errno)
                continue
            }
            guard info.st_size == 0 else {
                unreserve(target, generation) // not read yet
                continue
            }
            // A FIFO (or a device) put in its place would block the open, and with it this
            // sender's messages and the release of its claims: only a file is opened, and
            // without waiting, should it be swapped since.
            guard info.st_mode & S_IFMT == S_IFREG else {
                retire(target, generation, dirFD: dirFD)
                continue
            }
            let fd: Int32
            switch Syscall.openat(dirFD, name, O_WRONLY | O_NONBLOCK | fc_O_NOFOLLOW) {
            case .success(let value): fd = value
            case .failure(let errno):
                skip(errno)
                continue
            }
            if case .success(let info) = Syscall.fstat(fd), (info.st_mode & S_IFMT) == S_IFREG, info.st_size == 0, info.st_nlink > 0 {
                return Lease(fd: fd, target: target, generation: generation)
            }
            _ = Syscall.close(fd)
            retire(target, generation, dirFD: dirFD)
        }
        let (generation, forgotten): (UInt64?, (name: String, known: Target)?) = state.withLock { state in
            guard !state.closed, !onlyKnown || state.targets[target] != nil,
                  state.targets[target, default: Target()].live.count < Self.slotsPerTarget
            else { return (nil, nil) }
            let forgotten = state.targets[target] == nil ? Self.forgetOldest(&state) : nil
            let generation = state.nextGeneration
            state.nextGeneration += 1
            state.targets[target, default: Target()].live.append(generation)
            state.targets[target]?.used = state.uses
            if state.madeSlotsIn != nil {
                state.madeSlotsIn!.insert(target)
                if state.madeSlotsIn!.count > Self.maximumMailboxesRemembered { state.madeSlotsIn = nil }
            }
            state.targets[target]?.reserved.insert(generation)
            return (generation, forgotten)
        }
        if let (name, known) = forgotten {
            // Closed unused, a spare must not stay a slot; the other empty slots go too.
            if let spare = known.spare { _ = Syscall.close(spare.fd) }
            for generation in known.live { Self.removeIfEmpty(self.name(name, generation), dirFD: dirFD) }
        }
        guard let generation else { return nil }
        switch Syscall.openat(dirFD, name(target, generation), O_WRONLY | O_CREAT | O_EXCL | fc_O_NOFOLLOW) {
        case .success(let fd):
            return Lease(fd: fd, target: target, generation: generation)
        case .failure(let errno):
            forget(target, generation)
            if errno == .noSuchFileOrDirectory { throw .gone }
            return nil
        }
    }

    /// Ends a lease whose descriptor the caller closed: a slot with its message in it
    /// waits for the receiver; one closed without a whole message is retired.
    func finished(_ lease: Lease, written: Bool, dirFD: Int32) {
        guard let generation = lease.generation else { return }
        guard written else { return retire(lease.target, generation, dirFD: dirFD) }
        // Moved to the end of the live slots: the last to be looked at for the next message.
        state.withLock { state in
            state.targets[lease.target]?.reserved.remove(generation)
            guard let index = state.targets[lease.target]?.live.firstIndex(of: generation) else { return }
            state.targets[lease.target]?.live.remove(at: index)
            state.targets[lease.target]?.live.append(generation)
        }
    }

    /// Opens the slot for the next message to `target` ahead of need, unless there is one.
    /// A failure only means the next message opens its slot itself.
    func makeSpare(for target: String, dirFD: Int32) {
        guard keepsSpares, state.withLock({ !$0.closed && $0.targets[target]?.spare == nil }) else { return }
        guard let lease = try? claim(for: target, dirFD: dirFD, onlyKnown: true), let generation = lease.generation else { return }
        let unused: (target: String, fd: Int32, generation: UInt64)? = state.withLock { state in
            // Another thread made one meanwhile, the target was dropped, or the process left.
            guard !state.closed, state.targets[target] != nil, state.targets[target]?.spare == nil else {
                return (target, lease.fd, generation)
            }
            state.targets[target]?.spare = (lease.fd, generation)
            state.spareOrder.append(target)
            guard state.spareOrder.count > Self.maximumSpares else { return nil }
            let oldest = state.spareOrder.removeFirst()
            guard let spare = state.targets[oldest]?.spare else { return nil }
            state.targets[oldest]?.spare = nil
            return (oldest, spare.fd, spare.generation)
        }
        if let unused {
            _ = Syscall.close(unused.fd)
            retire(unused.target, unused.generation, dirFD: dirFD)
        }
    }

    /// Whether a spare is open in `target`'s mailbox.
    func hasSpare(for target: String) -> Bool {
        state.withLock { $0.targets[target]?.spare != nil }
    }

    /// Forgets `target` (a process found dead or gone, whose slots go with its mailbox).
    func drop(_ target: String, dirFD: Int32) {
        let spare = state.withLock { state -> (fd: Int32, generation: UInt64)? in
            state.spareOrder.removeAll { $0 == target }
            return state.targets.removeValue(forKey: target)?.spare
        }
        // Closed unused, it must not stay a slot (see the rule above).
        if let spare {
            _ = Syscall.close(spare.fd)
            _ = Syscall.unlinkat(dirFD, name(target, spare.generation))
        }
    }

    /// Whether this process left the space (``removeAll(dirFD:)``): it writes no more.
    var isClosed: Bool { state.withLock { $0.closed } }

    /// Closes the spares and removes every empty slot of this process, the forgotten ones
    /// included (it leaves the space, its record already removed), from the mailboxes it
    /// made slots in (a process that sent nothing looks at no mailbox: with a thousand
    /// processes leaving, each listing every mailbox was a million directory reads). A
    /// slot holding a message not read yet stays: its receiver removes it after reading,
    /// finding the record gone.
    func removeAll(dirFD: Int32) {
        let (spares, mailboxes): ([Int32], Set<String>?) = state.withLock { state in
            state.closed = true
            state.spareOrder.removeAll()
            defer { state.targets.removeAll() }
            return (state.targets.values.compactMap { $0.spare?.fd }, state.madeSlotsIn)
        }
        for fd in spares { _ = Syscall.close(fd) }
        Self.removeEmptySlots(of: me, dirFD: dirFD, in: mailboxes.map { Array($0) })
    }

    /// Removes the empty slots of `process` (which writes no more: it left, or it is dead)
    /// from `mailboxes`, else from every mailbox. One holding a message not read yet is
    /// its receiver's to remove.
    static func removeEmptySlots(of process: String, dirFD: Int32, in mailboxes: [String]? = nil) {
        for mailbox in mailboxes ?? (try? SpaceMail.list(dirFD, SpaceLayout.mailboxes)) ?? [] where mailbox != process {
            for name in (try? SpaceMail.list(dirFD, SpaceLayout.mailbox(mailbox))) ?? [] where SpaceLayout.isSlot(name, of: process) {
                removeIfEmpty(SpaceLayout.mailboxEntry(mailbox, name), dirFD: dirFD)
            }
        }
    }

    /// Unlinks the slot `name` (relative to the space) if it is empty. For slots whose
    /// sender writes no more: it left, or it is dead.
    static func removeIfEmpty(_ name: String, dirFD: Int32) {
        guard case .success(let info) = Syscall.lstatat(dirFD, name), info.st_size == 0 else { return }
        _ = Syscall.unlinkat(dirFD, name)
    }

    /// At ``maximumTargets``, removes the target used longest ago that has nothing being
    /// written (its spare aside) and returns it, for the caller to close its spare and
    /// remove its empty slots.
    private static func forgetOldest(_ state: inout State) -> (name: String, known: Target)? {
        guard state.targets.count >= maximumTargets else { return nil }
        let idle = state.targets.filter { _, known in
            known.reserved.allSatisfy { $0 == known.spare?.generation }
        }
        guard let oldest = idle.min(by: { $0.value.used < $1.value.used })?.key,
              let known = state.targets.removeValue(forKey: oldest)
        else { return nil }
        state.spareOrder.removeAll { $0 == oldest }
        return (oldest, known)
    }

    private func unreserve(_ target: String, _ generation: UInt64) {
        state.withLock { _ = $0.targets[target]?.reserved.remove(generation) }
    }

    /// Stops using a slot whose file is gone.
    private func forget(_ target: String, _ generation: UInt64) {
        state.withLock { state in
            state.targets[target]?.reserved.remove(generation)
            state.targets[target]?.live.removeAll { $0 == generation }
        }
    }

    /// Stops using a slot closed without a message, and unlinks it: the event of that
    /// close must not find a slot that holds a later message.
    private func retire(_ target: String, _ generation: UInt64, dirFD: Int32) {
        forget(target, generation)
        _ = Syscall.unlinkat(dirFD, name(target, generation))
    }
}
