import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A batch's input cursor and cancel flag, each alone on its cache line: every worker
/// advances the cursor, and beside the batch's other fields (or the flag, which every
/// worker reads per file) each of those writes made the other workers' next loads of
/// them miss.
final class SharedCursor: Sendable {
    // 128 bytes apart: x86 fetches lines in adjacent pairs.
    private typealias Padding = (Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int)
    private static let padding: Padding = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    private let before = SharedCursor.padding
    /// The next input index to claim.
    let next = Atomic<Int>(0)
    private let between = SharedCursor.padding
    /// Set when the batch is cancelled.
    let cancelled = Atomic<Bool>(false)
    private let after = SharedCursor.padding
}

/// How the workers of one batch share descriptors when the process runs out: a worker
/// whose open fails with `EMFILE` tries again while another worker of the batch may still
/// close a file, instead of failing (up to about 1 s).
final class DescriptorWaits: Sendable {
    /// Workers running (between ``workerStarted()`` and ``workerEnded()``).
    private let active = Atomic<Int>(0)
    /// Those of them waiting for a descriptor: they hold none.
    private let waiting = Atomic<Int>(0)

    /// A worker starts taking files (on its thread, not when it is queued).
    func workerStarted() { active.add(1, ordering: .relaxed) }

    /// A worker takes no more files.
    func workerEnded() { active.subtract(1, ordering: .relaxed) }

    /// Runs `read` on a running worker, again while it fails with `EMFILE` and another
    /// worker is not waiting (it holds a file, or is about to open one and close it).
    /// When every running worker waits, none can free a descriptor: they are held
    /// elsewhere in the process, for a moment (the runtime's own) or for good, so the
    /// file fails after ``aloneRetries`` more tries (50 ms).
    func read<T>(_ read: () -> Result<T, FileCoordinationError>) -> Result<T, FileCoordinationError> {
        var waited = 0, alone = 0
        defer { if waited > 0 { waiting.subtract(1, ordering: .relaxed) } }
        while true {
            let result = read()
            guard case .failure(let error) = result, error.code == .tooManyOpenFiles, waited < 2000 else { return result }
            if waited == 0 { waiting.add(1, ordering: .relaxed) }
            waited += 1
            if active.load(ordering: .relaxed) <= waiting.load(ordering: .relaxed) {
                alone += 1
                if alone > Self.aloneRetries { return result }
            }
            usleep(500)
        }
    }

    /// Tries, 0.5 ms apart, of a worker that no other worker can free a descriptor for.
    static let aloneRetries = 100
}

extension Atomic where Value == Int {
    /// Raises the value to `candidate` if it is larger.
    func max(_ candidate: Int) {
        var current = load(ordering: .relaxed)
        while candidate > current {
            let (exchanged, original) = compareExchange(expected: current, desired: candidate, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }
}
