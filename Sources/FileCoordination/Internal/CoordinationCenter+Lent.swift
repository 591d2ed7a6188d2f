import AsyncFileIO
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
    /// every other process out meanwhile, and every other coordination of the item asks
    /// the same presenter, whose requests are served one at a time, after this one.
    struct Lent {
        let purpose: String
        let path: [UInt8]

        /// Whether `claims` of a request with `purpose` all name an item lent to it.
        static func cover(_ lent: [Lent], _ claims: [CoordinationRules.Claim], purpose: String?) -> Bool {
            guard !lent.isEmpty, let purpose, !claims.isEmpty else { return false }
            return claims.allSatisfy { claim in lent.contains { $0.purpose == purpose && $0.path == claim.key.bytes } }
        }
    }

    /// Lends `path`, held by another process's coordination, to the coordinators made for
    /// `presenter` while that coordination waits for it (``Lent``); returns what ends it.
    func lend(_ presenter: any FilePresenter, _ path: FilePath) -> @Sendable () -> Void {
        let lent = Lent(purpose: FileCoordinator.purpose(of: presenter), path: path.platformBytes)
        state.withLock { $0.lent.append(lent) }
        return { [self] in
            state.withLock { state in
                if let index = state.lent.firstIndex(where: { $0.purpose == lent.purpose && $0.path == lent.path }) {
                    state.lent.remove(at: index)
                }
            }
        }
    }
}
