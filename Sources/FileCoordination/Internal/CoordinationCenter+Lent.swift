import AsyncFileIO
import Synchronization
import SystemPackage

extension CoordinationCenter {
    /// An item another process's coordination holds while it waits for a presenter of
    /// this process to save it (or accommodate its deletion): coordinations made for that
    /// presenter, on that item, run under the asker's claim instead of taking their own.
    ///
    /// This is Apple's rule across processes, as ``CoordinationRules/yield(_:to:)`` is in
    /// one: a document asked to save writes through a coordinator made for it while the
    /// asker waits for that save. Taking its own claim, it would wait for the asker's,
    /// and the asker for the save, until the presenter timeout. The asker's claim keeps
    /// every other process out meanwhile (the presenter's process lends only what no
    /// other process may be reading, see ``PresenterServer``), and every other
    /// coordination of the item asks the same presenter, whose requests are served one
    /// at a time, after this one.
    struct Lent {
        let loan: UInt64
        let purpose: String
        let path: [UInt8]
        /// The requests granted under it, until they are released: the presenter's answer
        /// waits for them.
        var covered: Set<RequestID> = []
        /// No request is granted under it any more (the save ended, or its asker gave up).
        var revoked = false
        /// The end of the loan, waiting for the requests it covers.
        var ended: UnsafeContinuation<Void, Never>?

        /// Whether `claims` of request `id` with `purpose` all name one item lent to that
        /// purpose; if so the request is recorded as covered.
        static func cover(_ lent: inout [Lent], _ claims: [CoordinationRules.Claim], purpose: String?, id: RequestID) -> Bool {
            guard !lent.isEmpty, let purpose, let first = claims.first?.key.bytes else { return false }
            guard let index = lent.firstIndex(where: { !$0.revoked && $0.purpose == purpose && $0.path == first }),
                  claims.allSatisfy({ $0.key.bytes == first }) else { return false }
            lent[index].covered.insert(id)
            return true
        }

        /// Request `id` was released: a loan that ended and covered nothing more is
        /// removed, and its end resumed (returned).
        static func released(_ id: RequestID, _ lent: inout [Lent]) -> UnsafeContinuation<Void, Never>? {
            guard let index = lent.firstIndex(where: { $0.covered.contains(id) }) else { return nil }
            lent[index].covered.remove(id)
            guard lent[index].covered.isEmpty, let ended = lent[index].ended else { return nil }
            lent.remove(at: index)
            return ended
        }
    }

    /// Numbers the loans of items to this process's presenters (``lend(_:_:)``).
    static let loans = Atomic<UInt64>(0)

    /// Lends `path`, held by another process's coordination, to the coordinators made for
    /// `presenter` while that coordination waits for it (``Lent``). Not in a space that
    /// fences claims (etcd): an accessor there needs a claim of its own process.
    func lend(_ presenter: any FilePresenter, _ path: FilePath) -> ItemLoan {
        guard !(transport?.fencesClaims ?? false) else { return ItemLoan(revoke: {}, end: {}) }
        let loan = Self.loans.add(1, ordering: .relaxed).newValue
        state.withLock { $0.lent.append(Lent(loan: loan, purpose: FileCoordinator.purpose(of: presenter), path: path.platformBytes)) }
        return ItemLoan(revoke: { [self] in revokeLoan(loan, waiting: nil) },
                        end: { [self] in await withUnsafeContinuation { revokeLoan(loan, waiting: $0) } })
    }

    /// Grants nothing more under `loan`; with `waiting`, resumes it once the requests the
    /// loan covers are released (at once when there are none).
    private func revokeLoan(_ loan: UInt64, waiting: UnsafeContinuation<Void, Never>?) {
        let done = state.withLock { state -> Bool in
            guard let index = state.lent.firstIndex(where: { $0.loan == loan }) else { return true }
            state.lent[index].revoked = true
            guard let waiting else { return false }
            if state.lent[index].covered.isEmpty {
                state.lent.remove(at: index)
                return true
            }
            state.lent[index].ended = waiting
            return false
        }
        if done { waiting?.resume() }
    }
}
