import AsyncFileIO
import SystemPackage

/// What a coordination asks each presenter before its access: Apple's order table
/// (`docs/design.md`, "Message order") as a pure function of the items accessed and the
/// presenters each concerns. No I/O and no awaits: ``CoordinationMachine`` asks for the
/// plan, and its driver carries it out (each presenter's steps in order, all presenters at once).
package struct PresenterPlan {
    /// One presenter's steps: relinquish (to a reader or a writer), then save or
    /// accommodate the deletion, then one step per deleted subitem.
    package struct Steps {
        var entry: PresenterRegistry.Entry
        /// The item accessed, and how (a writer outranks a reader).
        var path: FilePath
        var kind: FileAccessRequest.Kind
        var save = false
        var accommodateDeletion = false
        var subitemDeletions: [FilePath] = []
    }

    /// In the order the presenters were first concerned.
    private(set) var steps: [Steps] = []
    private var positions: [ObjectIdentifier: Int] = [:]

    var isEmpty: Bool { steps.isEmpty }

    /// Adds what an access to `path` asks of the presenters it concerns. `asks(entry)`
    /// says whether a presenter is asked at all (one asked already in the same batch, or
    /// silent earlier in it, is not).
    mutating func add(_ path: FilePath, _ request: ItemRequest, concerned: PresenterRegistry.Concerned,
                      asks: (PresenterRegistry.Entry) -> Bool = { _ in true }) {
        let kind: FileAccessRequest.Kind
        let saves: Bool
        var deleting = false
        switch request {
        case .reading(_, let options):
            kind = .reading
            saves = options.isDisjoint(with: [.withoutChanges, .immediatelyAvailableMetadataOnly])
        case .writing(_, let options):
            kind = .writing
            saves = options.isDisjoint(with: [.forDeleting, .forReplacing, .contentIndependentMetadataOnly])
            deleting = options.contains(.forDeleting)
        }
        func plan(_ entry: PresenterRegistry.Entry, _ update: (inout Steps) -> Void) {
            guard asks(entry) else { return }
            let position: Int
            if let known = positions[entry.id] {
                position = known
                if kind == .writing { (steps[position].path, steps[position].kind) = (path, kind) } // a writer outranks a reader
            } else {
                position = steps.count
                positions[entry.id] = position
                steps.append(Steps(entry: entry, path: path, kind: kind))
            }
            update(&steps[position])
        }
        for entry in concerned.item + concerned.inside {
            plan(entry) { steps in
                if deleting { steps.accommodateDeletion = true } else if saves { steps.save = true }
            }
        }
        for entry in concerned.containers {
            plan(entry) { steps in
                if deleting { steps.subitemDeletions.append(path) } else if saves { steps.save = true }
            }
        }
    }
}

extension PresenterPlan {
    /// What the presenters a write concerns are told after it, the order table's "after
    /// it" column: the item's presenters hear `didChange` (not for a move, whose
    /// `didMove` the move sends, and not those that moved with it), and the presenters
    /// of containing directories `subitemDidAppear` for a new item or `subitemDidChange`
    /// for a changed one. A deletion sends nothing here (its presenters accommodated it
    /// before). `existsAfter` matters only when a container's presenter is concerned.
    static func after(write path: FilePath, options: FileCoordinator.WritingOptions, existedBefore: Bool?,
                      concerned: PresenterRegistry.Concerned, moved: Set<ObjectIdentifier>,
                      existsAfter exists: Bool) -> [PendingMessage] {
        guard !options.contains(.forDeleting) else { return [] }
        var messages: [PendingMessage] = []
        if !options.contains(.forMoving) {
            messages += concerned.item.filter { !moved.contains($0.id) }.map { .didChange($0) }
        }
        guard !concerned.containers.isEmpty else { return messages }
        if existedBefore == false && exists {
            messages += concerned.containers.map { .subitemDidAppear($0, path) }
        } else if !options.contains(.forMoving) && exists {
            messages += concerned.containers.map { .subitemDidChange($0, path) }
        }
        return messages
    }
}
