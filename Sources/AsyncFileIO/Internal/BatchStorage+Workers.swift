import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

extension BatchStorage {
    static func size(of result: BatchReadResult) -> Int {
        if case .success(let data) = result.result { return data.count }
        return 0
    }

    /// How many workers' groups the consumer claims at once when it reads: its directory
    /// is looked up once per claim, and its results are published together.
    static let consumerGroups = 4

    /// Claims the next `chunk` indices, `groups` times over (or given-back ones, unless not
    /// `givenBackToo`), or nil when the worker should stop: the batch is done or
    /// cancelled, or reading is too far ahead of the consumer.
    func claim(givenBackToo: Bool = true, groups: Int = 1) -> Range<Int>? {
        guard !cancelled.load(ordering: .relaxed) else { return nil }
        // Given-back indices come first (see `givenBackDue`). Under a gate, a run of them
        // (up to a group: the consumer's) is claimed together, so that the gate is asked
        // once for it and the worker stops at the buffer limit within it, as in any group;
        // without, one at a time.
        if givenBackToo, givenBackCount.load(ordering: .acquiring) > 0,
           let run = givenBack.withLock({ list -> Range<Int>? in
               guard let first = list.first, givenBackDue(first, handed: handed.load(ordering: .acquiring)) else { return nil }
               var end = first + 1
               while gate != nil, end - first < chunk, end - first < list.count, list[end - first] == end { end += 1 }
               list.removeFirst(end - first)
               // Under the lock, as `giveBack` writes it: a count lowered after the lock
               // (as a subtraction did) could undo a give-back made in between, and its
               // files would then wait unseen while no worker runs.
               givenBackCount.store(list.count, ordering: .releasing)
               return first ..< end
           })
        {
            return run
        }
        guard bufferedBytes.load(ordering: .relaxed) < options.maximumBufferedBytes,
              nextIndex.load(ordering: .relaxed) - handed.load(ordering: .acquiring) < window
        else { return nil }
        var size = 1
        if chunk > 1 {
            let largest = largestFile.load(ordering: .relaxed)
            if largest > 0, largest * chunk * concurrency <= options.maximumBufferedBytes { size = chunk * groups }
        }
        let start = nextIndex.wrappingAdd(size, ordering: .relaxed).oldValue
        return start < inputs.count ? start ..< Swift.min(start + size, inputs.count) : nil
    }

    /// Whether the lowest given-back index, `first`, may be read now: below the buffer
    /// limit, or past it when it is the result the consumer takes next in the given
    /// order, which the results buffered behind it wait for. Any other waits for its turn
    /// or for room: read one after another past the limit, given-back files that the
    /// consumer left with gaps between them (too large for it to read inline) would all
    /// be buffered at once.
    func givenBackDue(_ first: Int, handed: Int) -> Bool {
        bufferedBytes.load(ordering: .relaxed) < options.maximumBufferedBytes || (options.order == .given && first == handed)
    }

    /// Returns claimed indices left unread, to be claimed again (lowest first) before new
    /// ones; `atLimit` counts it as a group stopped at the buffer limit.
    func giveBack(_ indices: some Sequence<Int>, atLimit: Bool = true) {
        givenBack.withLock { list in
            list.append(contentsOf: indices)
            list.sort()
            givenBackCount.store(list.count, ordering: .releasing)
        }
        if atLimit { givenBackTotal.add(1, ordering: .relaxed) }
    }

    /// Publishes a worker's finished results; with `exiting`, also retires the worker.
    func publish(_ results: inout [BatchReadResult], exiting: Bool) {
        var bytes = 0
        for result in results { bytes += Self.size(of: result) }
        peakBufferedBytes.max(bufferedBytes.add(bytes, ordering: .relaxed).newValue)
        let waiter: UnsafeContinuation<Void, Never>? = state.withLock { state in
            // Moved, not copied (see `Iterator.local`); in completion order, in the
            // order the worker finished them.
            if state.slots.isEmpty {
                var end = state.ready.count + results.count
                state.ready.append(contentsOf: repeatElement(nil, count: results.count))
                while let result = results.popLast() {
                    end -= 1
                    state.ready[end] = result
                }
            } else {
                while let result = results.popLast() {
                    let slot = result.index % state.slots.count
                    // (The ring has room for every claim in flight, see `window`: a result
                    // put over another would be delivered in its place.)
                    precondition(state.slots[slot] == nil, "result \(result.index) over another in the ring")
                    state.slots[slot] = result
                }
            }
            if exiting { state.activeWorkers -= 1 }
            if state.activeWorkers == 0, let stopWaiter = state.stopWaiter {
                state.stopWaiter = nil
                stopWaiter.resume()
            }
            guard state.waiter != nil else { return nil }
            if state.activeWorkers > 0 {
                guard state.deliverable else { return nil }
                let tail = nextIndex.load(ordering: .relaxed) >= inputs.count && givenBackCount.load(ordering: .relaxed) == 0
                guard tail || state.worthWaking(groupSize: Self.wakeGroup, groupBytes: Self.wakeBytes)
                    || monotonicNanoseconds() - state.waitingSince >= Self.wakeLatency
                else { return nil }
            }
            consumerWaiting.store(false, ordering: .relaxed)
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    func startWorker() {
        switch options.engine {
        case .threadPool:
            IOThreadPool.shared.submit { [self] in
                descriptors.workerStarted()
                var finished: [BatchReadResult] = []
                finished.reserveCapacity(Self.publishEvery)
                var finishedBytes = 0
                var oldest: UInt64 = 0
                // Publishing takes the lock and may wake the consumer: do it for a group
                // of results, for a large one, or when the consumer has waited a while.
                func publishIfDue() {
                    guard finished.count >= Self.publishEvery || finishedBytes >= 1 << 20
                        || (consumerWaiting.load(ordering: .relaxed) && monotonicNanoseconds() - oldest >= 100_000)
                    else { return }
                    publish(&finished, exiting: false)
                    finishedBytes = 0
                }
                while let indices = claim() {
                    let group = indices.map { (index: $0, input: inputs[$0]) }
                    // With a gate: one question for a group of several files, else one per file.
                    var token: UInt64?
                    if let gate, group.count > 1 {
                        let paths = group.compactMap { file -> (Int, PlatformPath)? in
                            if case .path(let path) = file.input { (file.index, path) } else { nil }
                        }
                        if paths.count > 1 { token = gate.enter(paths) }
                    }
                    for (position, file) in group.enumerated() {
                        // Without a gate, a group is not read further once cancelled, nor past
                        // the buffer limit (a jump from small files to large ones): the rest
                        // is given back, so a group holds no more than a single claim would.
                        if gate == nil, position > 0 {
                            if cancelled.load(ordering: .relaxed) { break }
                            if bufferedBytes.load(ordering: .relaxed) + finishedBytes >= options.maximumBufferedBytes {
                                giveBack(group[position...].lazy.map(\.index))
                                break
                            }
                        }
                        // A group is read to its end under its claim, except past the
                        // buffer limit (a jump from small files to large ones): the rest of
                        // it is left to the gate's owner, which reads it as the consumer
                        // gets there.
                        if let gate, position > 0,
                           bufferedBytes.load(ordering: .relaxed) + finishedBytes >= options.maximumBufferedBytes
                        {
                            for rest in group[position...] {
                                gate.skip(rest.index)
                                let path = Self.path(of: rest.input)
                                finished.append(BatchReadResult(index: rest.index, path: path, result: .failure(Self.leftToGate(path))))
                            }
                            break
                        }
                        let started = monotonicNanoseconds()
                        var probe = FileOperations.CacheProbe.notProbed
                        let result = readBlocking(file.index, file.input, askingGate: gate != nil && token == nil, probe: &probe)
                        if finished.isEmpty { oldest = started }
                        if probe == .unsupported { cacheProbes.store(false, ordering: .relaxed) }
                        if !blocking.load(ordering: .relaxed) && (probe == .waitedForDevice
                            || (!cacheProbes.load(ordering: .relaxed) && monotonicNanoseconds() - started > 200_000)) {
                            blocking.store(true, ordering: .relaxed)
                        }
                        let size = Self.size(of: result)
                        if chunk > 1 { largestFile.max(size) }
                        finishedBytes += size
                        finished.append(consume result)
                        // A group's last result waits until the group has left the gate: the
                        // consumer, once it has every result, must find every claim given back.
                        if token == nil || position < group.count - 1 { publishIfDue() }
                    }
                    if let token {
                        gate?.leave(token)
                        publishIfDue()
                    }
                }
                descriptors.workerEnded()
                publish(&finished, exiting: true)
            }
        case .dispatchIO:
            Task { [self] in
                var finished: [BatchReadResult] = []
                while let indices = claim() {
                    for index in indices where !cancelled.load(ordering: .relaxed) {
                        finished.append(await readWithDispatch(index))
                    }
                    publish(&finished, exiting: false)
                }
                publish(&finished, exiting: true)
            }
        }
    }
    /// The placeholder result of a file left to the gate's owner (which replaces it).
    static func leftToGate(_ path: FilePath) -> FileCoordinationError {
        FileCoordinationError(.read, code: .cancelled, path: path, message: "left to the full coordination")
    }

    static func path(of input: FileBatchReader.PlatformResolved) -> FilePath {
        switch input {
        case .path(let path): path.filePath
        case .invalid(let path, _): path
        }
    }

    /// Reads one file; with `askingGate`, only if the gate lets it through alone.
    func readBlocking(_ index: Int, _ input: FileBatchReader.PlatformResolved, askingGate: Bool,
                              probe: inout FileOperations.CacheProbe) -> BatchReadResult {
        switch input {
        case .invalid(let path, let error):
            return BatchReadResult(index: index, path: path, result: .failure(error))
        case .path(let path):
            var token: UInt64?
            if askingGate, let gate {
                token = gate.enter([(index, path)])
                guard token != nil else {
                    return BatchReadResult(index: index, path: path.filePath, result: .failure(Self.leftToGate(path.filePath)))
                }
            }
            // Probing tells a device wait from a preempted thread, until the batch knows.
            let probing = !blocking.load(ordering: .relaxed) && cacheProbes.load(ordering: .relaxed)
            var learned = FileOperations.CacheProbe.notProbed
            // Under a gate, the name itself is what the gate may have claimed: a link is not
            // followed here but left to the gate's owner.
            let gated = gate != nil
            let result = descriptors.read {
                FileOperations.readWholeFile(path, maximumSize: options.maximumFileSize, probingCache: probing,
                                             followingLast: !gated, probe: &learned)
            }
            probe = learned
            if let token { gate?.leave(token) }
            if let gate, case .failure(let error) = result, FileOperations.isLinkRefused(error) {
                gate.skip(index)
                return BatchReadResult(index: index, path: path.filePath, result: .failure(Self.leftToGate(path.filePath)))
            }
            return BatchReadResult(index: index, platformPath: path, result: result)
        }
    }

    func readWithDispatch(_ index: Int) async -> BatchReadResult {
        switch inputs.resolved(index) {
        case .invalid(let path, let error):
            return BatchReadResult(index: index, path: path, result: .failure(error))
        case .path(let path):
            do {
                let data = try await Data(asyncContentsOf: path, maximumSize: options.maximumFileSize, engine: .dispatchIO)
                return BatchReadResult(index: index, path: path, result: .success(data))
            } catch let error as FileCoordinationError {
                return BatchReadResult(index: index, path: path, result: .failure(error))
            } catch {
                return BatchReadResult(index: index, path: path, result: .failure(
                    FileCoordinationError(.read, code: .unknown, path: path, message: "\(error)", cause: error)))
            }
        }
    }
}
