@_spi(FileCoordinationInternal) import AsyncFileIO
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
enum PendingMessage: Sendable {
    case didChange(PresenterRegistry.Entry)
    case didMove(PresenterRegistry.Entry, to: FilePath)
    case subitemDidAppear(PresenterRegistry.Entry, FilePath)
    case subitemDidChange(PresenterRegistry.Entry, FilePath)
    case subitemDidMove(PresenterRegistry.Entry, from: FilePath, to: FilePath)
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

/// A coordination between its two halves: claims held, presenters messaged.
final class CoordinationSession: Sendable {
    struct Item: Sendable {
        var path: FilePath
        var request: ItemRequest
        /// The URL to hand the accessor: the caller's own, unless the item moved or a
        /// symbolic link was resolved (then made from `path`).
        var url: URL
        var subtree: Bool
        /// For writes with container presenters: whether the item existed before.
        var existedBefore: Bool?

        var isWrite: Bool { if case .writing = request { true } else { false } }
        var writingOptions: FileCoordinator.WritingOptions {
            if case .writing(_, let options) = request { options } else { [] }
        }
        var readingOptions: FileCoordinator.ReadingOptions {
            if case .reading(_, let options) = request { options } else { [] }
        }
    }

    let request: CoordinationRules.RequestID?
    let items: [Item]
    let reacquirers: [(PresenterRegistry.Entry, FileReacquirer)]
    let context: CoordinationContext
    /// Presenter watches told to drop this write's own inotify events, until `finish`.
    let suppressions: [(PresenterWatch, Int)]

    init(request: CoordinationRules.RequestID?, items: [Item], reacquirers: [(PresenterRegistry.Entry, FileReacquirer)],
         context: CoordinationContext, suppressions: [(PresenterWatch, Int)] = []) {
        self.request = request
        self.items = items
        self.reacquirers = reacquirers
        self.context = context
        self.suppressions = suppressions
    }

    var urls: [URL] { items.map(\.url) }
}
