import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The state shared by a batch's workers and its consumer.
///
/// Built to stay off locks on the hot path: workers claim indices with an atomic
/// counter and keep finished results in a private buffer, publishing them under the
/// lock in groups, or at once when the consumer is waiting. The consumer takes all
/// published results in one lock acquisition and starts workers when there is room.
final class BatchStorage: Sendable {
    enum Take {
        /// Never empty, and no element nil (optional so that each can be moved out).
        case results([BatchReadResult?])
        case finished
        case pending
    }

    struct State {
        /// Given order: a ring of `slots.count` results indexed by `index % slots.count`.
        var slots: [BatchReadResult?]
        /// Completion order: results in arrival order.
        /// (Optional, so that results move in and out without a copy: see `Iterator.local`.)
        var ready: [BatchReadResult?] = []
        var handed = 0
        var activeWorkers = 0
        var waiter: UnsafeContinuation<Void, Never>?
        /// Waits for the last worker to stop (after cancellation): only that wakes it.
        var stopWaiter: UnsafeContinuation<Void, Never>?
        /// When the consumer parked (monotonic nanoseconds).
        var waitingSince: UInt64 = 0

        var deliverable: Bool {
            slots.isEmpty ? !ready.isEmpty : slots[handed % slots.count] != nil
        }

        /// Whether enough is deliverable to be worth waking the consumer for: each wake
        /// costs two context switches, so results are handed over in groups.
        func worthWaking(groupSize: Int, groupBytes: Int) -> Bool {
            if slots.isEmpty {
                return ready.count >= groupSize || ready.reduce(0, { $0 + ($1.map(BatchStorage.size(of:)) ?? 0) }) >= groupBytes
            }
            var count = 0, bytes = 0
            while count < groupSize, bytes < groupBytes, let result = slots[(handed + count) % slots.count] {
                count += 1
                bytes += BatchStorage.size(of: result)
            }
            return count >= groupSize || bytes >= groupBytes
        }
    }

    /// How many results (or bytes) make a group worth waking the consumer for.
    static let wakeGroup = 64
    static let wakeBytes = 4 << 20
    /// A waiting consumer is woken for whatever is ready after this long (nanoseconds).
    static let wakeLatency: UInt64 = 1_000_000

    /// Results a worker keeps before publishing when nobody is waiting for them.
    static let publishEvery = 16

    let inputs: FileBatchReader.Inputs
    let options: BatchReadOptions
    let concurrency: Int
    /// How far claiming may run ahead of the consumer (a soft bound: concurrent claims
    /// may pass it by at most `concurrency * chunk` for the workers and
    /// `consumerGroups * chunk` for the consumer, which the ring has room for).
    let window: Int
    let nextIndex = Atomic<Int>(0)
    let handed = Atomic<Int>(0)
    let bufferedBytes = Atomic<Int>(0)
    /// The most bytes buffered at once so far (for tests of the buffer limit).
    let peakBufferedBytes = Atomic<Int>(0)
    var mostBufferedBytes: Int { peakBufferedBytes.load(ordering: .relaxed) }
    let cancelled = Atomic<Bool>(false)
    let consumerWaiting = Atomic<Bool>(false)
    let descriptors = DescriptorWaits()
    let gate: (any InPlaceGate)?
    /// How many consecutive files a worker claims at once: with a gate, a group that the
    /// gate is asked about together (as the in-place batch does; a claim per file had
    /// the workers contend for the claim tables); without, `Inputs.ungatedClaim`. In both
    /// cases only while groups of the largest file read so far fit in
    /// `maximumBufferedBytes` (back-pressure is checked per claim).
    let chunk: Int
    /// The largest file read so far (bytes).
    let largestFile = Atomic<Int>(0)
    /// Indices claimed but left unread, to be read by the workers: a worker's group
    /// stopped at the buffer limit (without a gate), and files the consumer did not read
    /// itself. Sorted; `givenBackCount` mirrors their number, read without the lock.
    let givenBack = Locked<[Int]>([])
    let givenBackCount = Atomic<Int>(0)
    /// How many times a group was given back at the buffer limit (for tests).
    let givenBackTotal = Atomic<Int>(0)
    var groupsGivenBack: Int { givenBackTotal.load(ordering: .relaxed) }
    /// Set once a read had to wait for a device (its file was not all in the page cache):
    /// from then on the batch may use up to `concurrency` threads. Until then, reads come
    /// from the page cache and more threads than cores would only take turns. (Where the
    /// file system cannot tell, as tmpfs, a read that took over 200 us sets it.)
    let blocking = Atomic<Bool>(false)
    /// False once a read found that the file system cannot tell (no `RWF_NOWAIT`).
    let cacheProbes = Atomic<Bool>(true)
    /// Whether the consumer reads files itself while no result is ready
    /// (``readOnConsumer(_:)``): with the thread-pool engine and no gate or one that
    /// admits files without blocking, until the kernel or a file system turns out unable
    /// to tell a read that would wait.
    let consumerReads: Atomic<Bool>
    /// Whether the consumer's last attempt read a file: while it does, it is one of the
    /// threads reading from the page cache (a directory on a tmpfs, say, leaves every
    /// file to the workers, which are then one a core again).
    let consumerReading = Atomic<Bool>(true)
    /// The most workers that may run while the consumer reads: one thread a core in all,
    /// and at most `concurrency` descriptors (the consumer holds two).
    var workersBesideConsumer: Int { min(concurrency - 2, Self.processors - 1) }
    /// Consecutive groups the gate could not answer for without blocking (the consumer's
    /// alone). Past ``unknownStreakLimit`` (files of many directories, few of them looked
    /// up yet) the consumer stops reading, and the workers are one a core again.
    let unknownStreak = Atomic<Int>(0)
    static let unknownStreakLimit = 2
    /// How many times the consumer stopped reading a claim at the buffer limit (for tests).
    let consumerStopsAtLimit = Atomic<Int>(0)
    var consumerStoppedAtLimit: Int { consumerStopsAtLimit.load(ordering: .relaxed) }
    /// How many files the consumer read itself (for tests).
    let consumerReadTotal = Atomic<Int>(0)
    var filesReadByConsumer: Int { consumerReadTotal.load(ordering: .relaxed) }
    /// How many files the consumer claimed and left to the workers unread, other than at
    /// the buffer limit: too large to read inline, or not readable without waiting (for tests).
    let consumerLeftTotal = Atomic<Int>(0)
    var filesLeftByConsumer: Int { consumerLeftTotal.load(ordering: .relaxed) }
    static let processors = max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    let state: Locked<State>

    init(inputs: FileBatchReader.Inputs, options: BatchReadOptions, gate: (any InPlaceGate)?) {
        self.inputs = inputs
        self.options = options
        self.gate = options.engine == .threadPool ? gate : nil
        // (No more workers than files: a huge `concurrency` would size the window and the ring.)
        concurrency = max(1, min(options.concurrency, inputs.count))
        chunk = self.gate != nil ? 32 : inputs.ungatedClaim(workers: concurrency)
        // (The consumer's file and directory count against `concurrency`, which must
        // leave a worker.)
        consumerReads = Atomic(options.engine == .threadPool && self.gate?.admitsWithoutBlocking != false && concurrency >= 3)
        // Room for every worker's private group plus as much again in the shared ring,
        // so that workers pause for a slow consumer, not for each other. (Smaller
        // windows, meant to keep buffers in the CPU caches, measured no better.) And
        // several wake groups: with a window of one group (64 files, as concurrency 2
        // had), the workers stopped each time the consumer was woken, and read 0.44x
        // of the C pool instead of 0.73x.
        window = max(2 * concurrency * Self.publishEvery, 4 * Self.wakeGroup)
        let slots = options.order == .given
            ? [BatchReadResult?](repeating: nil, count: window + (concurrency + Self.consumerGroups) * chunk)
            : []
        state = Locked(State(slots: slots))
    }

    /// How many files have been claimed for reading so far (for tests of back-pressure).
    var claimedCount: Int { min(nextIndex.load(ordering: .relaxed), inputs.count) }

    // MARK: Consumer side

    func take() -> Take {
        let (take, spawn): (Take, Int) = state.withLock { state in
            var moved: [BatchReadResult?] = []
            if state.slots.isEmpty {
                swap(&moved, &state.ready)
                state.handed += moved.count
            } else {
                let ring = state.slots.count
                while let result = state.slots[state.handed % ring].take() {
                    state.handed += 1
                    moved.append(result)
                }
            }
            handed.store(state.handed, ordering: .releasing)
            var bytes = 0
            for result in moved { bytes += result.map(Self.size(of:)) ?? 0 }
            let buffered = bufferedBytes.subtract(bytes, ordering: .relaxed).newValue
            var spawn = 0
            let givenBack = givenBackCount.load(ordering: .acquiring)
            if !cancelled.load(ordering: .relaxed), buffered < options.maximumBufferedBytes
                || (givenBack > 0 && self.givenBack.withLock({ $0.first.map { givenBackDue($0, handed: state.handed) } ?? false })) {
                let claimed = min(nextIndex.load(ordering: .relaxed), inputs.count)
                // From the page cache, one thread a core; the consumer, when it reads, is
                // one of them, and its two descriptors among the `concurrency` open.
                let threads = blocking.load(ordering: .relaxed) ? concurrency
                    : consumerReads.load(ordering: .relaxed) && consumerReading.load(ordering: .relaxed) ? workersBesideConsumer
                    : min(concurrency, Self.processors)
                // Given-back files are read whatever the window (and past the buffer limit
                // when due: see `givenBackDue`).
                let room = max(window - (claimed - state.handed), givenBack)
                spawn = max(0, min(threads - state.activeWorkers, inputs.count - claimed + givenBack, room))
                state.activeWorkers += spawn
            }
            if !moved.isEmpty { return (.results(moved), spawn) }
            return (state.handed == inputs.count ? .finished : .pending, spawn)
        }
        for _ in 0 ..< spawn { startWorker() }
        return take
    }

    /// Reads files on the consumer's thread while no result is ready, as far as no step
    /// waits for a device, a server or a daemon (``CachedWholeFileReader``), and
    /// publishes them as a worker would. On a
    /// machine with few cores a consumer that waits for workers is a thread more than
    /// there are cores; reading, it does one worker's share, its files need no hand-off,
    /// and the buffers it frees come back to it warm. A file it cannot read so is given
    /// back to the workers (and not claimed by the consumer again), as is a file over
    /// ``CachedWholeFileReader/inlineLimit``. The consumer reads at most until the
    /// read-ahead window is full. Returns whether to look for results again before
    /// waiting: it read some, or it just stopped reading.
    func readOnConsumer(_ reader: CachedWholeFileReader) -> Bool {
        // Not while a fault is armed for a test (it applies to the workers' calls), nor
        // beside more than `workersBesideConsumer` workers: after it stopped reading,
        // `take()` started the worker it stood in for (and the ring has room for
        // `concurrency` workers' claims beside the consumer's).
        guard consumerReads.load(ordering: .relaxed), !blocking.load(ordering: .relaxed), !Faults.isArmed,
              state.withLock({ $0.activeWorkers }) <= workersBesideConsumer,
              let indices = claim(givenBackToo: false, groups: gate == nil ? Self.consumerGroups : 1)
        else { return false }
        // With a gate, the consumer's group is one worker's: one question for all of it,
        // asked without blocking. Refused, the group goes back to the workers, which ask
        // for each file that they may wait for.
        var token: UInt64?
        if let gate {
            let paths = indices.compactMap { index -> (Int, PlatformPath)? in
                if case .path(let path) = inputs[index] { (index, path) } else { nil }
            }
            switch paths.isEmpty ? .refused : gate.enterWithoutBlocking(paths) {
            case .admitted(let admitted):
                token = admitted
                unknownStreak.store(0, ordering: .relaxed)
            case .notKnownYet where unknownStreak.load(ordering: .relaxed) < Self.unknownStreakLimit:
                // The worker beside it resolves the directory (given-back files come
                // first): the consumer waits for it, and stays one of the readers.
                unknownStreak.add(1, ordering: .relaxed)
                giveBack(Array(indices), atLimit: false)
                return false
            case .notKnownYet, .refused:
                giveBack(Array(indices), atLimit: false)
                return consumerReading.exchange(false, ordering: .relaxed)
            }
        }
        // The directory is looked up again by the next call: a path renamed or relinked
        // meanwhile is read where it now leads, and no descriptor is kept between calls.
        defer { reader.close() }
        var results: [BatchReadResult] = []
        var unread: [Int] = []
        var largest = 0, read = 0
        reading: for index in indices {
            // Past the buffer limit, the rest goes back as a worker's group would.
            guard !cancelled.load(ordering: .relaxed),
                  index == indices.lowerBound || bufferedBytes.load(ordering: .relaxed) + read < options.maximumBufferedBytes
            else {
                if !cancelled.load(ordering: .relaxed) { consumerStopsAtLimit.add(1, ordering: .relaxed) }
                unread += index ..< indices.upperBound
                break
            }
            guard case .path(let path) = inputs[index] else {
                unread.append(index)
                continue
            }
            // Under a gate the name itself is what it claimed: a link there goes back to
            // the workers, which leave it to the gate's owner.
            switch reader.read(path, maximumSize: min(options.maximumFileSize, CachedWholeFileReader.inlineLimit),
                               followingLast: gate == nil) {
            case .read(let data):
                largest = max(largest, data.count)
                read += data.count
                results.append(BatchReadResult(index: index, platformPath: path, result: .success(data)))
            case .elsewhere:
                consumerLeftTotal.add(1, ordering: .relaxed)
                unread.append(index)
            case .unsupported:
                consumerReads.store(false, ordering: .relaxed)
                unread += index ..< indices.upperBound
                break reading
            }
        }
        // Its claim is given back before any of its files is: a worker may claim them next.
        if let token { gate?.leave(token) }
        // (Not claimed by the consumer again: given-back files are the workers'.)
        if !unread.isEmpty { giveBack(unread, atLimit: false) }
        if chunk > 1 { largestFile.max(largest) }
        let wasReading = consumerReading.exchange(!results.isEmpty, ordering: .relaxed)
        // A consumer that stops reading looks again at once: `take()` then starts the
        // worker it stood in for.
        guard !results.isEmpty else { return wasReading }
        consumerReadTotal.add(results.count, ordering: .relaxed)
        publish(&results, exiting: false)
        return true
    }

    /// Suspends until a result can be taken, the workers have all stopped, or the batch is cancelled.
    func waitForResults() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let now = state.withLock { state in
                if state.deliverable || state.activeWorkers == 0 || cancelled.load(ordering: .relaxed) { return true }
                state.waiter = continuation
                state.waitingSince = monotonicNanoseconds()
                consumerWaiting.store(true, ordering: .relaxed)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Suspends until no worker is reading (after ``cancel()``): every descriptor is closed.
    func waitUntilStopped() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let now = state.withLock { state in
                if state.activeWorkers == 0 { return true }
                state.stopWaiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Whether ``cancel()`` was called.
    var isCancelled: Bool { cancelled.load(ordering: .relaxed) }

    func cancel() {
        cancelled.store(true, ordering: .relaxed)
        let waiter = state.withLock { state in
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}
