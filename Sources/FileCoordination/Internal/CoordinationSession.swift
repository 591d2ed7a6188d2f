import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// One item of a coordination, as asked.
enum ItemRequest: Sendable {
    case reading(URL, FileCoordinator.ReadingOptions)
    case writing(URL, FileCoordinator.WritingOptions)

    var url: URL {
        switch self {
        case .reading(let url, _), .writing(let url, _): url
        }
    }

    /// The request an intent makes, at the intent's current URL.
    init(_ intent: FileAccessIntent) {
        switch intent.kind {
        case .reading(let options): self = .reading(intent.url, options)
        case .writing(let options): self = .writing(intent.url, options)
        }
    }
}

/// A message to a presenter after an access, delivered once the accessor has returned.
package enum PendingMessage: Sendable {
    case didChange(PresenterRegistry.Entry)
    case didMove(PresenterRegistry.Entry, to: FilePath)
    case subitemDidAppear(PresenterRegistry.Entry, FilePath)
    case subitemDidChange(PresenterRegistry.Entry, FilePath)
    case subitemDidMove(PresenterRegistry.Entry, from: FilePath, to: FilePath)

    /// The presenter told.
    package var entry: PresenterRegistry.Entry {
        switch self {
        case .didChange(let entry), .didMove(let entry, _), .subitemDidAppear(let entry, _), .subitemDidChange(let entry, _),
             .subitemDidMove(let entry, _, _): entry
        }
    }
}

/// The coordination an accessor runs in (a task-local): collects the move messages
/// reported with `item(at:didMoveTo:)` until the accessor returns.
final class CoordinationContext: Sendable {
    @TaskLocal static var current: CoordinationContext?

    let coordinator: FileCoordinator
    private let deferred = Locked<[PendingMessage]>([])
    /// Presenters told of a move in this coordination: they hear `didMove`, not `didChange`.
    private let moved = Locked<Set<ObjectIdentifier>>([])

    func recordMoved(_ ids: some Sequence<ObjectIdentifier>) {
        moved.withLock { $0.formUnion(ids) }
    }

    var movedPresenters: Set<ObjectIdentifier> { moved.withLock { $0 } }

    init(coordinator: FileCoordinator) {
        self.coordinator = coordinator
    }

    func `defer`(_ messages: [PendingMessage]) {
        deferred.withLock { $0 += messages }
    }

    func takeDeferred() -> [PendingMessage] {
        deferred.withLock { messages in
            defer { messages.removeAll() }
            return messages
        }
    }
}

/// Presenters already asked to relinquish and save by `prepare(...)`: coordinations
/// inside the batch do not ask them again.
final class PreparedBatch: Sendable {
    @TaskLocal static var current: PreparedBatch?
    let presenters: Set<ObjectIdentifier>
    init(presenters: Set<ObjectIdentifier>) { self.presenters = presenters }
}

/// A coordination between its two halves (``FileCoordinator/begin(_:intents:claimPath:since:)``
/// and ``FileCoordinator/finish(_:accessorRan:)``): its machine, and what its
/// driver holds for it.
final class CoordinationSession: Sendable {
    let context: CoordinationContext
    /// The caller's intents, which follow their items.
    let intents: [FileAccessIntent]
    /// The coordinator's cancellations when the coordination began: a `cancel()` after
    /// that ends it before its accessor.
    let cancellations: Int
    private let state = Locked(State())

    private struct State {
        var machine = CoordinationMachine(items: [], owner: nil)
        /// Presenter watches told to drop this write's own inotify events, until the end.
        var suppressions: [(PresenterWatch, Int)] = []
    }

    init(coordinator: FileCoordinator, intents: [FileAccessIntent], cancellations: Int) {
        context = CoordinationContext(coordinator: coordinator)
        self.intents = intents
        self.cancellations = cancellations
    }

    /// The machine as the first half left it (the accessor may run).
    var machine: CoordinationMachine {
        get { state.withLock { $0.machine } }
        set { state.withLock { $0.machine = newValue } }
    }

    var suppressions: [(PresenterWatch, Int)] {
        get { state.withLock { $0.suppressions } }
        set { state.withLock { $0.suppressions = newValue } }
    }

    func suppress(_ watch: PresenterWatch, _ token: Int) {
        state.withLock { $0.suppressions.append((watch, token)) }
    }

    var items: [CoordinationMachine.Item] { machine.items }
    var request: CoordinationRules.RequestID? { machine.request }
    var urls: [URL] { machine.urls }
}
