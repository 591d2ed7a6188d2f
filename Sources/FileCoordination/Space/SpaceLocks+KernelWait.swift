import AsyncFileIO
import CFileCoordinationShims
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A waiting claim's wait, in the kernel: one blocking lock call on the byte a try found
/// in its way (``KernelLockWait``).
///
/// - The next writers' queue byte of the claim (the byte writers of one item queue on) is
///   waited for on this process's own descriptor of its shard, and the lock the kernel
///   grants is the claim's: writers get it one after another, in the kernel's order, each
///   woken alone. It is then counted as ``take(_:)`` counts a byte (a lock call that
///   finds it held already by this process), so that the process's other tasks see it.
///   The claim holds only its queue bytes below it meanwhile, as in any wait.
/// - Any other byte (a queue byte a reader tests, an item's, a directory's) is waited for
///   on a descriptor of the shard opened for the wait alone, in the mode the claim wants
///   it, and given back at once by closing that descriptor: the byte was free, and the
///   claim tries again. Nothing else is held while the call blocks, so no wait holds a
///   byte that another wait needs (the claim's queue bytes aside, which climb in offset,
///   as `docs/protocol.md` says).
extension SpaceLocks {
    /// How a wait in the kernel ended.
    enum KernelWaitOutcome: Equatable {
        /// The claim's queue byte is held and counted: the claim keeps it.
        case taken
        /// The byte was free for a moment, or the wait was cancelled: try the claim again
        /// (a cancelled acquisition then throws).
        case tryAgain
        /// No thread, descriptor or signal could be had: wait another way.
        case unavailable
    }

    /// Waits in the kernel for `blocker`; `token`: the acquisition's, for ``cancel(token:)``.
    func waitInKernel(for blocker: Blocker, token: UInt64?) async -> KernelWaitOutcome {
        let wait = KernelLockWait()
        if let token {
            let cancelled = state.withLock { state in
                if state.cancelled.contains(token) { return true }
                state.kernelWaits[token] = wait
                return false
            }
            if cancelled { return .tryAgain }
        }
        defer { if let token { _ = state.withLock { $0.kernelWaits.removeValue(forKey: token) } } }
        let offset = blocker.byte.offset
        let type = blocker.byte.exclusive ? fc_F_WRLCK : fc_F_RDLCK
        let shard = Self.shard(offset)
        do {
            if blocker.isQueue {
                // A closed shard (this process left the space): the next try says so.
                guard let fd = shards[shard].state.withLock({ $0.fd >= 0 ? $0.fd : nil }) else { return .tryAgain }
                let result = try await wait.run({ [self] wait in
                    kernelWaitsInCall.add(1, ordering: .relaxed)
                    defer { kernelWaitsInCall.subtract(1, ordering: .relaxed) }
                    return wait.lock(fd, type, offset)
                }, abandoned: { [self] result in
                    if case .success = result { giveBackUncounted(offset, fd: fd) }
                })
                switch result {
                case .success?:
                    // Counted as any take; a lock call that finds it held already by this
                    // process (lost meanwhile to the process's own release: wait again).
                    if case .taken? = try? take(blocker.byte) { return .taken }
                    // Not counted (its lock call failed, ENOLCK): the kernel's grant is given
                    // back, or it would hold off every writer of the item while the process lives.
                    giveBackUncounted(offset, fd: fd)
                    return .tryAgain
                case nil, .failure(.interrupted)?: return .tryAgain
                case .failure?: return .unavailable
                }
            }
            let (directoryFD, owner, name) = (directoryFD, owner, Self.shardName(shard))
            let result = try await wait.run({ [self] wait -> Result<Void, Errno> in
                kernelWaitsInCall.add(1, ordering: .relaxed)
                defer { kernelWaitsInCall.subtract(1, ordering: .relaxed) }
                // Read-only for a shared wait: its close is no `IN_CLOSE_WRITE` for the
                // processes that watch the claims.
                let flags = blocker.byte.exclusive ? O_RDWR : O_RDONLY
                let fd: Int32
                switch OwnedFiles.open(directoryFD, name, flags, kind: .regularFile, privateOnly: false, owner: owner) {
                case .success(let opened): fd = opened
                case .failure(.system(let errno)): return .failure(errno)
                case .failure: return .failure(.permissionDenied)
                }
                // Closing it gives back whatever it was granted.
                defer { _ = Syscall.close(fd) }
                return wait.lock(fd, type, offset)
            }, abandoned: { _ in })
            switch result {
            case .success?, nil, .failure(.interrupted)?: return .tryAgain
            case .failure?: return .unavailable
            }
        } catch {
            return .unavailable
        }
    }

    /// A queue byte the kernel granted to a wait whose claim had gone: given back, unless
    /// a task of this process counts it now (the lock is then that task's). On the wait's
    /// thread, under the shard's lock.
    func giveBackUncounted(_ offset: Int64, fd: Int32) {
        let unlocked = shards[Self.shard(offset)].state.withLock { state in
            guard state.fd == fd, state.bytes.kernelLock(at: offset) == fc_F_UNLCK else { return false }
            _ = Syscall.lock(fd, fc_F_UNLCK, offset, 1)
            return true
        }
        if unlocked { ringIfOthersWait() }
    }
}
