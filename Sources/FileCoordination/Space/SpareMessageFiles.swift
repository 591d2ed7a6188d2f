import CFileCoordinationShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Message files made ahead of need: for each of the few processes this one wrote to
/// last, an empty file in that process's mailbox, created and kept open after the
/// previous message went out. The next message to that process is then a `write` and a
/// `close` on its way to the receiver, with no file created on the way (creating one
/// measured 7-37 us on this machine's ext4 against 4-5 us for the write and close; 3-8 us
/// against 2-3 us on tmpfs). Every message is written from an I/O thread, so the blocking
/// create stays off the cooperative pool.
///
/// A spare closed unused (the process leaves the space, or drops the spare to keep few
/// descriptors) is an empty message file: receivers remove those without a warning. A
/// spare in the mailbox of a process that died goes with that mailbox; writing into it
/// afterwards reaches no one, which a request detects by the receiver's liveness check,
/// as it would for a message written just before the receiver died.
final class SpareMessageFiles: Sendable {
    /// Spares kept at most: one descriptor each.
    static let maximumCount = 4

    private struct State {
        var descriptors: [String: Int32] = [:]
        /// Targets in the order their spares were made, the oldest first.
        var order: [String] = []
        var closed = false
    }
    private let state = Mutex(State())
    /// False when the descriptor limit is low: a descriptor is worth more than a create.
    private let enabled: Bool

    init() {
        var limit = rlimit()
        enabled = getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 && limit.rlim_cur >= 256
    }

    /// The spare for `target`, now the caller's to write and close; nil when there is none.
    func take(for target: String) -> Int32? {
        state.withLock { state in
            guard let fd = state.descriptors.removeValue(forKey: target) else { return nil }
            state.order.removeAll { $0 == target }
            return fd
        }
    }

    /// Creates the next spare for `target` at `name` (relative to `dirFD`), unless one
    /// exists. Blocking: on an I/O thread. A failure only means the next message creates
    /// its file itself.
    func make(for target: String, dirFD: Int32, name: String) {
        guard enabled, state.withLock({ !$0.closed && $0.descriptors[target] == nil }) else { return }
        let fd = fc_openat(dirFD, name, O_WRONLY | O_CREAT | O_EXCL | fc_O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        let dropped: [Int32] = state.withLock { state in
            // Another thread made one meanwhile, or the process left the space.
            guard !state.closed, state.descriptors[target] == nil else { return [fd] }
            state.descriptors[target] = fd
            state.order.append(target)
            guard state.order.count > Self.maximumCount else { return [] }
            let oldest = state.order.removeFirst()
            return state.descriptors.removeValue(forKey: oldest).map { [$0] } ?? []
        }
        for fd in dropped { Glibc.close(fd) }
    }

    /// Forgets the spare for `target` (a process found dead or gone): its file went with
    /// that process's mailbox.
    func drop(_ target: String) {
        if let fd = take(for: target) { Glibc.close(fd) }
    }

    /// Closes every spare (unused: their receivers remove them) and makes no more.
    func closeAll() {
        let fds = state.withLock { state in
            state.closed = true
            state.order.removeAll()
            defer { state.descriptors.removeAll() }
            return Array(state.descriptors.values)
        }
        for fd in fds { Glibc.close(fd) }
    }
}
