import AsyncFileIO
import FileWatching
import Foundation
import Synchronization
import SystemCalls
import SystemPackage

/// Watches a registered presenter's item for changes made outside coordination and turns
/// them into the presenter's callbacks, one at a time, in the order they happened.
///
/// Coordinated writes the presenter was already told about (or made itself) are not
/// echoed: after such a write the coordinator calls ``suppress(_:)``, which syncs the
/// watcher and drops that path's events up to the sync point.
package final class PresenterWatch: Sendable {
    private let presenter: any FilePresenter
    private let center: CoordinationCenter
    private let state: Locked<State>

    private struct State {
        var watcher: FileWatcher?
        var consumer: Task<Void, Never>?
        var suppressed: [(token: Int, path: FilePath, upTo: UInt64)] = []
        /// The sequence number of the last event the consumer checked: a suppression
        /// ending at or before it can match no later event.
        var checked: UInt64 = 0
        var nextToken = 0
        var stopped = false
        /// Counts the watches begun: a watch begun later replaces one begun earlier, even
        /// one whose start ends after it.
        var generation = 0
    }

    init(presenter: any FilePresenter, center: CoordinationCenter) {
        self.presenter = presenter
        self.center = center
        state = Locked(State())
    }

    /// Starts watching `path` (recursively for a directory). An item that does not exist
    /// (yet, or any more) is watched once it appears (``awaitItem(at:)``); another failure
    /// (a watch limit) is logged, and coordination works without the watch.
    func start(at path: FilePath) async {
        do {
            try await begin(at: path, reportingExisting: false)
        } catch let error as FileCoordinationError where error.code == .notFound {
            let generation = nextGeneration()
            let waiting = Task { await self.awaitItem(at: path) }
            if !replaceConsumer(watcher: nil, consumer: waiting, generation: generation) { waiting.cancel() }
        } catch {
            Self.warnUnwatchable(path, error)
        }
    }

    /// Watches `path`, which exists, and consumes its events; with `reportingExisting`
    /// the presenter hears of the item and what it holds as new.
    /// With `movedHere`, the presenter is told first that its item moved to `path`.
    private func begin(at path: FilePath, reportingExisting: Bool, movedHere: Bool = false) async throws {
        let generation = nextGeneration()
        // Held from before the watch starts: what the watch reports happens after it. (Not
        // between the watcher's start and its installing below: a write's suppression ends
        // with no sync while no watcher is installed, and the write's events would then
        // reach the presenter as a change made outside coordination.)
        let anchor = AnchorSlot(await runOnIOThreadToCompletion { ItemAnchor(holding: path) })
        let watcher = try await FileWatcher(watching: path, recursive: presenter.presentedItemWatchesSubtree,
                                            settle: presenter.presentedItemSettleInterval,
                                            reportingExisting: reportingExisting)
        // Said before the watch is reported started (a command prints `ready` then).
        let warned = !watcher.unwatchedDirectories.isEmpty
        if warned { Self.warnUnwatched(watcher.unwatchedDirectories, of: path) }
        let consumer = Task {
            let (item, movedAway) = await self.consume(watcher, item: path, anchor: anchor, warned: warned, movedHere: movedHere)
            // The watch ended by itself (the item, or a directory above it, went away),
            // not stopped or replaced: the presenter is still registered there, so the
            // item is watched again once it is back; an item moved away is watched
            // where it went.
            let ended = self.state.withLock { state -> Bool in
                guard !state.stopped, state.generation == generation else { return false }
                state.watcher = nil
                return true
            }
            guard ended else { return }
            if movedAway {
                watcher.cancel()
                await self.follow(to: item)
            } else {
                await self.awaitItem(at: item)
            }
        }
        if !replaceConsumer(watcher: watcher, consumer: consumer, generation: generation) {
            watcher.cancel()
            consumer.cancel()
        }
    }

    /// The item was moved away by a program that does not coordinate: it is watched where
    /// it went, and the presenter told of the move before anything that happens there.
    private func follow(to destination: FilePath) async {
        do {
            try await begin(at: destination, reportingExisting: false, movedHere: true)
        } catch {
            // Gone again already, or unwatchable there: told of the move all the same.
            await call("presentedItemDidMove(to:)", at: destination) { [presenter] in
                await presenter.presentedItemDidMove(to: destination.fileURL)
            }
            if let error = error as? FileCoordinationError, error.code == .notFound {
                await awaitItem(at: destination)
            } else {
                Self.warnUnwatchable(destination, error)
            }
        }
    }

    /// Calls the presenter under the timeout policy, as a coordination does.
    private func call(_ name: String, at item: FilePath, _ body: @escaping @Sendable () async throws -> Void) async {
        let entry = PresenterRegistry.Entry(presenter: presenter, path: item)
        _ = try? await PresenterCall(policy: .default, entry: entry, metrics: center.metrics)(name, body)
    }

    private func nextGeneration() -> Int {
        state.withLock { state in
            state.generation += 1
            return state.generation
        }
    }

    /// Installs a watcher and the task that consumes it (or waits for the item), ending
    /// those it replaces; false once the watch is stopped, or when a watch begun later
    /// replaced this one.
    private func replaceConsumer(watcher: FileWatcher?, consumer: Task<Void, Never>, generation: Int) -> Bool {
        let replaced = state.withLock { state -> (FileWatcher?, Task<Void, Never>?)? in
            guard !state.stopped, state.generation == generation else { return nil }
            defer { state.watcher = watcher; state.consumer = consumer }
            return (state.watcher, state.consumer)
        }
        guard let (previous, previousConsumer) = replaced else { return false }
        previous?.cancel()
        // The task replacing itself (an item watched again) is not cancelled.
        if previousConsumer != consumer { previousConsumer?.cancel() }
        return true
    }

    /// Waits until an item at `path` exists, then watches it, telling the presenter of it
    /// and of what it holds as new (all of it appeared since the item went away). The
    /// nearest directory above it that exists is watched for the next name down, one
    /// level at a time: no polling, and a directory above removed meanwhile is followed
    /// up. Ends when the task is cancelled (the watch stopped or replaced).
    private func awaitItem(at path: FilePath) async {
        while !Task.isCancelled {
            guard let ancestor = try? await runOnIOThread({ Self.nearestExisting(path) }) else { return }
            if ancestor == path {
                do {
                    try await begin(at: path, reportingExisting: true)
                    return
                } catch let error as FileCoordinationError where error.code == .notFound {
                    continue // gone again before its watch was in place
                } catch {
                    Self.warnUnwatchable(path, error)
                    return
                }
            }
            let above: FileWatcher
            do {
                above = try await FileWatcher(watching: ancestor, recursive: false)
            } catch let error as FileCoordinationError where error.code == .notFound {
                continue
            } catch {
                Self.warnUnwatchable(path, error)
                return
            }
            // Made since it was looked for, before the watch was in place?
            if (try? await runOnIOThread({ Self.nearestExisting(path) })) == ancestor {
                // Any change in that directory (or its end) is a reason to look again.
                _ = try? await above.nextSequenced()
            }
            above.cancel()
        }
    }

    /// `path` if it exists, else the nearest directory above it that does (`/` at worst).
    private static func nearestExisting(_ path: FilePath) -> FilePath {
        var candidate = path
        while candidate.components.count > 0, case .failure = candidate.withPlatformString({ Syscall.stat(path: $0) }) {
            candidate = candidate.removingLastComponent()
        }
        return candidate
    }

    private static func warnUnwatchable(_ path: FilePath, _ error: any Error) {
        FileCoordinator.logger.warning("cannot watch a presenter's item; it will hear coordinated access only",
                                          metadata: ["path": "\(path)", "error": "\(error)"])
    }

    /// Logs the one warning that part of the item is not watched.
    private static func warnUnwatched(_ unwatched: [FilePath], of path: FilePath) {
        FileCoordinator.logger.warning(
            "the inotify watch limit (fs.inotify.max_user_watches) is reached: \(unwatched.count) directories of a presenter's item (and all inside them) are not watched, and changes made there outside coordination are not heard; some watches were left for other processes",
            metadata: ["path": "\(path)", "unwatched": "\(unwatched.prefix(3).map(\.string).joined(separator: ", "))\(unwatched.count > 3 ? ", ..." : "")"])
    }

    func stop() {
        let (watcher, consumer) = state.withLock { state in
            state.stopped = true
            defer { state.watcher = nil; state.consumer = nil }
            return (state.watcher, state.consumer)
        }
        watcher?.cancel()
        consumer?.cancel()
    }

    /// Drops the events of `path` (and inside it) caused until now: a coordination has
    /// reported them already.
    func suppress(_ path: FilePath) async {
        await endSuppressing(beginSuppressing(path))
    }

    /// Starts dropping the events of `path` (and inside it), before a coordinated write
    /// runs; ``endSuppressing(_:)`` ends it once the write's own events are in.
    package func beginSuppressing(_ path: FilePath) -> Int {
        state.withLock { state in
            state.nextToken += 1
            state.suppressed.append((state.nextToken, path, .max))
            return state.nextToken
        }
    }

    /// Syncs the watcher, then keeps dropping the path's events only up to that point.
    /// The sync runs in a task of its own: a coordination cancelled during its accessor
    /// has written all the same, and ending the suppression without the sync would let
    /// the write's own events through as a change made outside coordination.
    package func endSuppressing(_ token: Int) async {
        let watcher = state.withLock { $0.watcher }
        let mark = await Task(executorPreference: BlockingCaller.executor) { try? await watcher?.syncMark() }.value
        endSuppressing(token, at: mark ?? 0)
    }

    /// Ends a suppression, called on the watcher thread while it handles an event that
    /// the write's own events are known to precede (another process's message sent after
    /// the write): they are all buffered already, so no sync is needed.
    func endSuppressingOnWatcherThread(_ token: Int) {
        let watcher = state.withLock { $0.watcher }
        endSuppressing(token, at: watcher?.bufferedMark ?? 0)
    }

    private func endSuppressing(_ token: Int, at mark: UInt64) {
        state.withLock { state in
            if let index = state.suppressed.firstIndex(where: { $0.token == token }) { state.suppressed[index].upTo = mark }
            // Without this, a write that caused no event (or whose events came before the
            // last one checked) would stay listed until the next event: forever, for an
            // item nobody changes outside coordination.
            state.suppressed.removeAll { $0.upTo <= state.checked }
        }
    }

    /// How many suppressions are listed (tests).
    var suppressionCount: Int { state.withLock { $0.suppressed.count } }

    private func isSuppressed(_ event: FileEvent, sequence: UInt64) -> Bool {
        state.withLock { state in
            state.checked = sequence
            state.suppressed.removeAll { $0.upTo < sequence }
            return state.suppressed.contains { entry in
                event.path.starts(with: entry.path) || (event.destination?.starts(with: entry.path) ?? false)
            }
        }
    }

    /// The ``ItemAnchor`` a watch's consumer takes: held by nothing else, so that a
    /// deleted file's descriptor (and its space on disk) goes when the consumer drops it.
    private final class AnchorSlot: Sendable {
        private let anchor: Locked<ItemAnchor?>
        init(_ anchor: ItemAnchor?) { self.anchor = Locked(anchor) }
        func take() -> ItemAnchor? {
            anchor.withLock { anchor in
                defer { anchor = nil }
                return anchor
            }
        }
    }

    /// Turns the watcher's events into the presenter's callbacks until the watcher ends,
    /// or the item moved out of the watched directory (`movedAway`, told as a move);
    /// returns where the item was last (a watched item follows renames).
    private func consume(_ watcher: FileWatcher, item start: FilePath, anchor slot: AnchorSlot,
                         warned: Bool, movedHere: Bool) async -> (item: FilePath, movedAway: Bool) {
        var item = start
        var anchor = slot.take()
        let presenter = self.presenter
        func call(_ name: String, _ body: @escaping @Sendable () async throws -> Void) async {
            await self.call(name, at: start, body)
        }
        if movedHere {
            let newURL = start.fileURL
            await call("presentedItemDidMove(to:)") { await presenter.presentedItemDidMove(to: newURL) }
        }
        // Directories left out by the watch limit, told when the watch starts and
        // whenever more are (each new directory's creation is an event of its parent's).
        var unwatchedCount = 0
        func tellUnwatched() async {
            let unwatched = watcher.unwatchedDirectories
            guard unwatched.count > unwatchedCount else { return }
            if unwatchedCount == 0 && !warned { Self.warnUnwatched(unwatched, of: start) }
            let added = unwatched[unwatchedCount...].map(\.fileURL)
            unwatchedCount = unwatched.count
            await call("presentedItemIsPartlyUnwatched(_:)") { await presenter.presentedItemIsPartlyUnwatched(added) }
        }
        await tellUnwatched()
        while let (event, sequence) = try? await watcher.nextSequenced() {
            await tellUnwatched()
            if isSuppressed(event, sequence: sequence) {
                // Already reported by a coordinated move; the watcher follows the item.
                if event.kind == .moved, event.path == item, let destination = event.destination { item = destination }
                continue
            }
            let url = event.path.fileURL
            if event.path == item || event.kind == .resync {
                switch event.kind {
                case .modified, .attributesChanged, .created:
                    // A save by rename put another item there: that one is held now.
                    if event.kind != .attributesChanged {
                        let current = anchor
                        anchor = await runOnIOThreadToCompletion { [item] in
                            current.flatMap { $0.holds(item) ? $0 : nil } ?? ItemAnchor(holding: item)
                        }
                    }
                    await call("presentedItemDidChange()") { await presenter.presentedItemDidChange() }
                case .resync:
                    await call("presentedItemDidLoseEvents()") { await presenter.presentedItemDidLoseEvents() }
                case .deleted:
                    let held = anchor
                    if let destination = await runOnIOThreadToCompletion({ [item] in held?.movedAway(from: item) }) {
                        // Told by the watch at its new place (``follow(to:)``).
                        _ = center.move(from: item, to: destination)
                        return (destination, true)
                    }
                    anchor = nil // a deleted file's space is freed
                    await call("accommodatePresentedItemDeletion()") { try await presenter.accommodatePresentedItemDeletion() }
                case .moved:
                    guard let destination = event.destination else { continue }
                    _ = center.move(from: item, to: destination)
                    let newURL = destination.fileURL
                    item = destination
                    await call("presentedItemDidMove(to:)") { await presenter.presentedItemDidMove(to: newURL) }
                }
                continue
            }
            switch event.kind {
            case .created:
                await call("presentedSubitemDidAppear(at:)") { await presenter.presentedSubitemDidAppear(at: url) }
            case .modified, .attributesChanged:
                await call("presentedSubitemDidChange(at:)") { await presenter.presentedSubitemDidChange(at: url) }
            case .moved:
                guard let destination = event.destination?.fileURL else { continue }
                await call("presentedSubitem(at:didMoveTo:)") { await presenter.presentedSubitem(at: url, didMoveTo: destination) }
            case .deleted:
                await call("accommodatePresentedSubitemDeletion(at:)") { try await presenter.accommodatePresentedSubitemDeletion(at: url) }
            case .resync:
                break
            }
        }
        return (item, false)
    }
}
