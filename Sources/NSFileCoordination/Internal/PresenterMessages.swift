#if !canImport(Darwin)
import Foundation

/// One presenter's messages, run on its operation queue one at a time in the order
/// posted: the next is added to the queue when the one before has returned. So a queue
/// that runs several operations at once (an `OperationQueue()` as made) still never runs
/// two messages of one presenter together, as Apple's coordinators never send them.
final class PresenterMessages: @unchecked Sendable {
    // Unchecked: `pending` and `running` are read and written under `lock` only.
    private let lock = NSLock()
    private var pending: [(OperationQueue, @Sendable () -> Void)] = []
    private var running = false

    /// Runs `message` on `queue` after every message posted before it.
    func post(on queue: OperationQueue, _ message: @escaping @Sendable () -> Void) {
        let start = lock.withLock {
            if running {
                pending.append((queue, message))
                return false
            }
            running = true
            return true
        }
        if start { run(message, on: queue) }
    }

    /// The next message is added when this one's operation has finished, run or
    /// cancelled (`cancelAllOperations()` on the presenter's queue): a cancelled one must
    /// not leave every later message waiting for it.
    private func run(_ message: @escaping @Sendable () -> Void, on queue: OperationQueue) {
        let operation = BlockOperation(block: message)
        operation.completionBlock = { [self] in
            let next: (OperationQueue, @Sendable () -> Void)? = lock.withLock {
                guard !pending.isEmpty else {
                    running = false
                    return nil
                }
                return pending.removeFirst()
            }
            if let (queue, message) = next { run(message, on: queue) }
        }
        queue.addOperation(operation)
    }
}
#endif
