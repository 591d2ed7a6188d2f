import AsyncFileIO
import Foundation
import Synchronization
import Testing
@testable import FileCoordination
import TestSupport

/// A shared, ordered log of what presenters and accessors did.
final class EventLog: Sendable {
    private struct State {
        var events: [String] = []
        var waiters: [(event: String, count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }
    private let state = Locked(State())

    func append(_ event: String) {
        let ready = state.withLock { state in
            state.events.append(event)
            let seen = state.events.filter { $0 == event }.count
            let matched = state.waiters.filter { $0.event == event && $0.count <= seen }
            state.waiters.removeAll { $0.event == event && $0.count <= seen }
            return matched.map(\.continuation)
        }
        for continuation in ready { continuation.resume() }
    }

    var all: [String] { state.withLock { $0.events } }
    func clear() { state.withLock { $0.events.removeAll() } }

    /// Whether `event` is logged `count` times within `limit`, looked at every 10 ms.
    func waitFor(_ event: String, count: Int = 1, within limit: Duration) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while state.withLock({ $0.events.filter { $0 == event }.count }) < count {
            guard ContinuousClock.now < deadline else { return false }
            try? await Task.sleep(for: .milliseconds(10)) // ok: polling the log, bounded
        }
        return true
    }

    /// Suspends until `event` has been logged `count` times (at once if it already was).
    func waitFor(_ event: String, count: Int = 1) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state in
                if state.events.filter({ $0 == event }).count >= count { return true }
                state.waiters.append((event, count, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }
}

/// A presenter that logs every callback as "NAME:callback[:detail]".
final class Recorder: FilePresenter {
    enum Behavior: Sendable { case normal, refuseWriters, hangOnWriters }

    let name: String
    let log: EventLog
    let behavior: Behavior
    private let url: Locked<URL>
    var presentedItemURL: URL? { url.withLock { $0 } }

    init(_ name: String, url: URL, log: EventLog, behavior: Behavior = .normal) {
        self.name = name
        self.log = log
        self.behavior = behavior
        self.url = Locked(url)
    }

    struct Refusal: Error, CustomStringConvertible { var description: String { "document is busy" } }

    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
        log.append("\(name):relinquishToReader")
        return { [log, name] in log.append("\(name):reacquire") }
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        log.append("\(name):relinquishToWriter")
        switch behavior {
        case .normal: break
        case .refuseWriters: throw Refusal()
        case .hangOnWriters:
            // Never answers (until cancelled, which a hung presenter would not notice either).
            let forever = AsyncStream<Void> { _ in }
            for await _ in forever {}
        }
        return { [log, name] in log.append("\(name):reacquire") }
    }

    func savePresentedItemChanges() async throws { log.append("\(name):save") }
    func accommodatePresentedItemDeletion() async throws { log.append("\(name):accommodateDeletion") }
    func presentedItemDidMove(to newURL: URL) async {
        url.withLock { $0 = newURL }
        log.append("\(name):didMove:\(newURL.path)")
    }
    func presentedItemDidChange() async { log.append("\(name):didChange") }
    func presentedSubitemDidAppear(at url: URL) async { log.append("\(name):subitemDidAppear:\(url.lastPathComponent)") }
    func presentedSubitemDidChange(at url: URL) async { log.append("\(name):subitemDidChange:\(url.lastPathComponent)") }
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) async {
        log.append("\(name):subitemDidMove:\(oldURL.lastPathComponent)->\(newURL.lastPathComponent)")
    }
    func accommodatePresentedSubitemDeletion(at url: URL) async throws {
        log.append("\(name):accommodateSubitemDeletion:\(url.lastPathComponent)")
    }
}

/// A temporary directory for one test, removed at the end.
final class Sandbox: Sendable {
    let url: URL
    /// In the system's temporary directory, or in `base`.
    init(under base: String = NSTemporaryDirectory()) {
        url = URL(fileURLWithPath: base)
            .appendingPathComponent("filecoord-coord-\(getpid())-\(UInt64.random(in: 0 ... .max))")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    deinit { removeTreeLater(url.path) }

    @discardableResult
    func file(_ name: String, _ content: String = "x") -> URL {
        let file = url.appendingPathComponent(name)
        try! FileManager.default.createDirectory(at: file.deletingLastPathComponent(), withIntermediateDirectories: true)
        try! writeFixture(Data(content.utf8), toPath: file.path)
        return file
    }

    func directory(_ name: String) -> URL {
        let directory = url.appendingPathComponent(name)
        try! FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }
}

/// Registers presenters for the duration of `body`.
func withPresenters<T>(_ presenters: [any FilePresenter], isolation: isolated (any Actor)? = #isolation,
                       _ body: () async throws -> T) async rethrows -> T {
    for presenter in presenters { await FileCoordinator.addFilePresenter(presenter) }
    defer { for presenter in presenters { FileCoordinator.removeFilePresenter(presenter) } }
    return try await body()
}

/// A one-shot signal that tasks wait for (any number of them) and another gives.
final class Gate: Sendable {
    /// Nil once open; before, the tasks waiting.
    private let waiting = Locked<[CheckedContinuation<Void, Never>]?>([])
    init() {}
    func open() {
        let waiters = waiting.withLock { waiting in
            defer { waiting = nil }
            return waiting ?? []
        }
        for waiter in waiters { waiter.resume() }
    }
    func wait() async {
        await withCheckedContinuation { continuation in
            let resumeNow = waiting.withLock { waiting in
                guard waiting != nil else { return true }
                waiting!.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }
}

/// A value behind a lock, shareable between tasks.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: AsyncFileIO.Locked<Value>
    init(_ value: Value) { mutex = AsyncFileIO.Locked(value) }
    func withLock<T>(_ body: (inout Value) -> T) -> T { mutex.withLock { body(&$0) } }
}
