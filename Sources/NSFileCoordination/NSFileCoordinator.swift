#if !canImport(Darwin)
import Foundation
internal import FileCoordination

/// Coordinates the reading and writing of files and directories with every other
/// coordinator and presenter, in this process and in others (Apple's
/// `NSFileCoordinator`, with Apple's signatures): code written for Apple's Foundation
/// compiles unchanged with `import NSFileCoordination` added.
///
/// ```swift
/// let coordinator = NSFileCoordinator(filePresenter: nil)
/// var error: NSError?
/// coordinator.coordinate(writingItemAt: url, options: .forMerging, error: &error) { url in
///     append(line, to: url)
/// }
/// if let error { report(error) }
/// ```
///
/// Readers share; a writer excludes readers and writers of the same item; deleting,
/// moving or replacing a directory covers everything inside it. Before an access, the
/// registered ``NSFilePresenter``s of the item (and of the directories containing it)
/// are asked to relinquish it and save; after a write they hear what changed. Other
/// processes take part through the coordination space (`FILECOORD_SPACE`, else one per
/// user), with no daemon.
///
/// The `coordinate` forms with an `error` pointer block the calling thread until the
/// claims are granted and the presenters have answered, then run the accessor on it.
/// They must not run on the Swift concurrency pool's threads (an `async` function or the
/// main actor's task): waiting there takes a thread the coordination itself needs. Code
/// that can `await` should use `FileCoordinator` from `FileCoordination`.
///
/// Unlike Apple's, a presenter that never answers does not hold a coordinator forever:
/// see ``presenterTimeout``.
open class NSFileCoordinator: NSObject, @unchecked Sendable {
    // Unchecked: `engines` is read and written under `lock` only; `bridge` never changes.
    private let bridge: PresenterBridge?
    private let lock = NSLock()
    /// The engine's coordinator, last; before it, those replaced by a new
    /// ``purposeIdentifier`` (``cancel()`` reaches their coordinations too).
    private var engines: [FileCoordinator]
    /// Set by ``cancel()``: no later coordination of this coordinator runs its block.
    private var cancelled = false

    /// A coordinator acting for `filePresenterOrNil`: that presenter is never messaged
    /// about this coordinator's accesses, and every coordinator made for it shares its
    /// ``purposeIdentifier``.
    public init(filePresenter filePresenterOrNil: (any NSFilePresenter)?) {
        bridge = filePresenterOrNil.map { PresenterBridges.shared.bridge(for: $0) }
        engines = [Self.configured(FileCoordinator(filePresenter: bridge))]
        super.init()
    }

    /// A coordinator acting for no presenter.
    public override convenience init() {
        self.init(filePresenter: nil)
    }

    /// The coordinator that coordinations use now.
    var engine: FileCoordinator {
        lock.withLock { engines[engines.count - 1] }
    }

    /// Coordinators with the same purpose never block each other. Unique by default;
    /// shared by the coordinators made for one presenter. Set it before coordinating.
    public var purposeIdentifier: String {
        get { engine.purposeIdentifier }
        set {
            let replacement = Self.configured(FileCoordinator(filePresenter: bridge, purposeIdentifier: newValue))
            lock.withLock { engines.append(replacement) }
        }
    }

    /// Ends every coordination of this coordinator that is still waiting (for other
    /// claims, in this process or another, or for presenters): its accessor is not run,
    /// and its error is `NSUserCancelledError`. Accessors already running finish. Later
    /// coordinations and batches of this coordinator fail the same way, as Apple's do.
    public func cancel() {
        let all = lock.withLock { () -> [FileCoordinator] in
            cancelled = true
            return engines
        }
        for engine in all { engine.cancel() }
    }

    /// `NSUserCancelledError` once ``cancel()`` was called, else nil.
    var cancellation: NSError? {
        lock.withLock { cancelled } ? CocoaErrors.from(FileCoordinationError.coordinatorCancelled()) : nil
    }

    // MARK: Presenters

    /// Registers `filePresenter` for its `presentedItemURL` (read now): coordinators in
    /// this process message it at once, those of other processes once it is published
    /// in the coordination space (in the background, usually within a millisecond).
    /// The presenter is kept until ``removeFilePresenter(_:)``. A second call for the same
    /// presenter does nothing. A presenter whose `presentedItemURL` is nil (an untitled
    /// document) is messaged from when a write of a coordinator made for it (its first
    /// save) leaves it naming an item, or a second call finds it naming one.
    public class func addFilePresenter(_ filePresenter: any NSFilePresenter) {
        guard let bridge = PresenterBridges.shared.add(filePresenter) else { return }
        FileCoordinator.addFilePresenter(bridge)
    }

    /// After a coordination of this coordinator: its presenter, registered while it
    /// presented nothing, is registered with the engine once it names an item.
    func placePresenter() {
        guard let presenter = bridge?.presenter, let placed = PresenterBridges.shared.place(presenter) else { return }
        FileCoordinator.addFilePresenter(placed)
    }

    /// Unregisters `filePresenter`: it is not messaged again (other processes stop finding
    /// it shortly after).
    public class func removeFilePresenter(_ filePresenter: any NSFilePresenter) {
        guard let bridge = PresenterBridges.shared.unregister(filePresenter) else { return }
        FileCoordinator.removeFilePresenter(bridge)
    }

    /// The presenters registered in this process, in the order they were added.
    public class var filePresenters: [any NSFilePresenter] {
        PresenterBridges.shared.registered
    }

    // MARK: Moves and ubiquity

    /// Announces, inside a write accessor with `forMoving`, that the item at `oldURL` is
    /// about to move to `newURL`. Nothing needs to happen before the move here.
    public func item(at oldURL: URL, willMoveTo newURL: URL) {
        engine.item(at: oldURL, willMoveTo: newURL)
    }

    /// Reports, inside a write accessor, that the item at `oldURL` moved to `newURL`.
    /// Presenters of the item and of everything inside it hear
    /// ``NSFilePresenter/presentedItemDidMove(to:)``, those of the directories that held or
    /// hold it ``NSFilePresenter/presentedSubitem(at:didMoveTo:)``, after the accessor
    /// returns; coordinations waiting for the item follow it. Returns once the move is
    /// recorded (it blocks the calling thread briefly).
    public func item(at oldURL: URL, didMoveTo newURL: URL) {
        engine.itemBlocking(at: oldURL, didMoveTo: newURL)
    }

    /// Reports a change of the item's ubiquity attributes. There is no iCloud here: this
    /// does nothing.
    public func item(at url: URL, didChangeUbiquityAttributes attributes: Set<URLResourceKey>) {}

    // MARK: The presenter timeout

    /// How long a presenter may take to answer one message (a relinquish, a save, an
    /// accommodation) before coordinators made afterwards go on without its answer, with a
    /// logged warning naming it. Default: 30 seconds. Apple's coordinators wait forever,
    /// so one presenter that never answers holds every writer of its item; `nil` restores
    /// that. Applies to the coordinators made after it is set, in this process; a
    /// presenter in another process is bounded by the asking coordinator's setting.
    public class var presenterTimeout: Duration? {
        get { PresenterTimeoutSetting.current }
        set { PresenterTimeoutSetting.current = newValue }
    }

    /// `engine` under the presenter timeout now set.
    private static func configured(_ engine: FileCoordinator) -> FileCoordinator {
        if let policy = PresenterTimeoutSetting.policy { engine.setPresenterTimeoutPolicy(policy) }
        return engine
    }
}

/// The process's ``NSFileCoordinator/presenterTimeout``, and the engine's policy for it
/// (nil while it is the engine's default).
private final class PresenterTimeoutSetting: @unchecked Sendable {
    // Unchecked: `value` is read and written under `lock` only.
    private static let shared = PresenterTimeoutSetting()
    /// Far beyond any wait worth having (about 31 years): "forever" to the engine's timer.
    private static let forever = Duration.seconds(1_000_000_000)
    private let lock = NSLock()
    private var value: Duration? = PresenterTimeoutPolicy.default.timeout

    static var current: Duration? {
        get { shared.lock.withLock { shared.value } }
        set { shared.lock.withLock { shared.value = newValue } }
    }

    static var policy: PresenterTimeoutPolicy? {
        let timeout = current
        if timeout == PresenterTimeoutPolicy.default.timeout { return nil }
        return PresenterTimeoutPolicy(timeout: timeout ?? forever, action: .proceed)
    }
}
#endif
