// Coordination between processes through one coordination space.
import CPeers
import Dispatch
import FileCoordination
import Foundation

/// The other process of the cross-process figures: this same binary, started as
/// `filecoord-bench --child SPACE PATH PRESENTERS CLAIMS`. It presents PATH, plus
/// PRESENTERS unrelated files and a read claim on CLAIMS unrelated files, prints "ready",
/// and lives until its stdin closes.
func runChild(_ arguments: [String]) async throws -> Never {
    let space = FilePath(arguments[0]), path = arguments[1]
    let presenters = Int(arguments[2]) ?? 0, claims = Int(arguments[3]) ?? 0
    try await FileCoordinator.joinCoordinationSpace(at: space)
    final class Acknowledger: FilePresenter {
        let presentedItemURL: URL?
        init(_ url: URL) { presentedItemURL = url }
    }
    await FileCoordinator.addFilePresenter(Acknowledger(URL(fileURLWithPath: path)))
    let unrelated = FilePath(path).removingLastComponent().appending("unrelated")
    try? FileManager.default.createDirectory(atPath: unrelated.string, withIntermediateDirectories: true)
    var kept: [Acknowledger] = []
    // 100 files a directory: each presenter's watch is on its file's directory, and one
    // directory's events reach every presenter in it.
    func file(_ index: Int) -> FilePath { unrelated.appending("\(index / 100)").appending("\(index)") }
    for index in 0 ..< max(presenters, claims) {
        if index % 100 == 0 { try? FileManager.default.createDirectory(atPath: file(index).removingLastComponent().string, withIntermediateDirectories: true) }
        let file = file(index).string
        if !FileManager.default.fileExists(atPath: file) { _ = FileManager.default.createFile(atPath: file, contents: Data("x".utf8)) }
        if index < presenters {
            let presenter = Acknowledger(URL(fileURLWithPath: file))
            await FileCoordinator.addFilePresenter(presenter)
            kept.append(presenter)
        }
    }
    let intents = (0 ..< claims).map { FileAccessIntent.readingIntent(with: URL(fileURLWithPath: file($0).string)) }
    let coordinator = FileCoordinator()
    let hold = Task {
        if intents.isEmpty { FileHandle.standardOutput.write(Data("ready\n".utf8)); return }
        try await coordinator.coordinate(with: intents) {
            FileHandle.standardOutput.write(Data("ready\n".utf8))
            try await Task.sleep(for: .seconds(3600)) // held until the parent closes our stdin
        }
    }
    _ = FileHandle.standardInput.readDataToEndOfFile()
    hold.cancel()
    withExtendedLifetime(kept) {}
    exit(0)
}

/// Starts the child and waits for its ready line.
func startChild(space: String, path: String, presenters: Int, claims: Int) throws -> (Process, Pipe) {
    try startChild(["--child", space, path, "\(presenters)", "\(claims)"])
}

/// Starts this binary again with `arguments` (a child role) and waits for its ready line;
/// the child lives until its standard input (the pipe returned) closes.
func startChild(_ arguments: [String]) throws -> (Process, Pipe) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    process.arguments = arguments
    let input = Pipe(), output = Pipe()
    process.standardInput = input
    process.standardOutput = output
    try process.run()
    let line = output.fileHandleForReading.availableData
    precondition(String(decoding: line, as: UTF8.self).hasPrefix("ready"), "the child did not start")
    return (process, input)
}

func percentile(_ values: [Double], _ p: Double) -> Double {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

func runSpace(_ paths: [String]) async throws {
    let root = NSTemporaryDirectory() + "filecoord-bench-space-\(getpid())"
    try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: root) }
    let space = root + "/space", item = root + "/items/doc"
    try FileManager.default.createDirectory(atPath: root + "/items", withIntermediateDirectories: true)
    _ = FileManager.default.createFile(atPath: item, contents: Data("x".utf8))
    try await FileCoordinator.joinCoordinationSpace(at: FilePath(space))
    let coordinator = FileCoordinator()
    let url = URL(fileURLWithPath: item), readURL = URL(fileURLWithPath: paths[0])

    /// Call-to-accessor latency of a write whose item a presenter in the child presents.
    /// With `pause`, each write comes that long after the previous one ends (an editor's
    /// occasional save, say): every thread on the way has gone to sleep by then.
    /// Also each call's whole duration (to its return: the `did-change` and `reacquire`
    /// written).
    func writeLatencies(_ count: Int, pause: Int? = nil) async throws -> (toAccessor: [Double], whole: [Double]) {
        var samples: [Double] = [], wholeCalls: [Double] = []
        for _ in 0 ..< count {
            if let pause { try await Task.sleep(for: .microseconds(pause)) }
            let start = DispatchTime.now().uptimeNanoseconds
            var began: UInt64 = 0
            try await coordinator.coordinate(writingItemAt: url) { _ in began = DispatchTime.now().uptimeNanoseconds }
            samples.append(Double(began - start) / 1000)
            wholeCalls.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
        }
        return (samples, wholeCalls)
    }
    /// Cost of an uncontended coordinated read with an empty accessor.
    func readCost() async throws -> Double {
        let iterations = 100_000
        var best = Double.infinity
        for _ in 0 ..< rounds {
            let start = DispatchTime.now().uptimeNanoseconds
            for _ in 0 ..< iterations { try await coordinator.coordinate(readingItemAt: readURL) { _ in } }
            best = min(best, Double(DispatchTime.now().uptimeNanoseconds - start) / Double(iterations) / 1000)
        }
        return best
    }

    // FILECOORD_BENCH_BATCH_ONLY=1: only the coordinated batch read in place (for profiling:
    // five timed reads per warm-up, so that the profile is mostly theirs); =paths: from paths;
    // =sequence: through the sequence.
    if let only = ProcessInfo.processInfo.environment["FILECOORD_BENCH_BATCH_ONLY"] {
        let urls = paths.map { URL(fileURLWithPath: $0) }
        let filePaths = paths.map { FilePath($0) }
        for _ in 0 ..< rounds {
            warmPageCache(paths)
            for _ in 0 ..< 5 {
                let options = BatchReadOptions(concurrency: concurrency)
                let rate = Double(paths.count) / (try await seconds {
                    if only == "paths" {
                        _ = try await coordinator.readFiles(at: filePaths, batchOptions: options).forEachFile { _ in }
                    } else if only == "sequence" {
                        var tally = Tally()
                        for try await result in coordinator.readFiles(at: urls, batchOptions: options) {
                            if case .success(let data) = result.result { tally.add(data) }
                        }
                    } else {
                        _ = try await coordinator.readFiles(at: urls, batchOptions: options).forEachFile { _ in }
                    }
                })
                print(String(format: "coordinated batch read %@: %.0f files/s", only == "sequence" ? "through the sequence" : "in place", rate))
            }
        }
        return
    }
    // FILECOORD_BENCH_FLOOR_ONLY=N: only N round trips of the C floor (for `perf stat`
    // beside FILECOORD_BENCH_WRITE_ONLY: CPU per round trip against CPU per write).
    if let count = ProcessInfo.processInfo.environment["FILECOORD_BENCH_FLOOR_ONLY"].flatMap({ Int($0) }) {
        var floor = [Double](repeating: 0, count: count)
        precondition(peer_inotify_round_trips(root + "/c-floor", Int32(count), 0, &floor) == 0, "the C floor failed")
        print(String(format: "C floor: %d round trips, p50 %.0f us", count, percentile(floor, 0.5)))
        return
    }
    // FILECOORD_BENCH_WRITE_ONLY=1: only the write latency with a presenter in the child (for profiling;
    // FILECOORD_BENCH_UNRELATED=N gives the child N unrelated presenters and claims, none by default).
    if ProcessInfo.processInfo.environment["FILECOORD_BENCH_WRITE_ONLY"] != nil {
        let unrelated = Int(ProcessInfo.processInfo.environment["FILECOORD_BENCH_UNRELATED"] ?? "0") ?? 0
        let (child, input) = try startChild(space: space, path: item, presenters: unrelated, claims: unrelated)
        _ = try await writeLatencies(200)
        // FILECOORD_BENCH_WRITE_PAUSE_US: the pause before each write (none by default).
        let pause = ProcessInfo.processInfo.environment["FILECOORD_BENCH_WRITE_PAUSE_US"].flatMap { Int($0) }
        for _ in 0 ..< rounds {
            let (samples, whole) = try await writeLatencies(pause == nil ? 2000 : 500, pause: pause)
            print(String(format: "write, one presenter in the other process: p50 %6.0f us  p99 %6.0f us   (whole call p50 %6.0f us)",
                         percentile(samples, 0.5), percentile(samples, 0.99), percentile(whole, 0.5)))
        }
        try input.fileHandleForWriting.close()
        child.waitUntilExit()
        return
    }
    print("\nacross processes (one coordination space; the other process is this binary's --child)")
    let alone = try await readCost()
    print(String(format: "  uncontended coordinated read (kernel claims), empty accessor   %7.2f us   goal <= 5 us: %@",
                 alone, alone <= 5 ? "met" : "NOT MET"))

    // Coordinated batch read beside the C pool, and beside the C pool that takes a shared
    // lock per file as the space does (and one per 32 files), in the same run.
    var c: [Double] = [], ours: [Double] = [], inPlace: [Double] = [], fromPaths: [Double] = []
    var cLocked: [Double] = [], cGroupLocked: [Double] = []
    let urls = paths.map { URL(fileURLWithPath: $0) }
    let filePaths = paths.map { FilePath($0) }
    for _ in 0 ..< rounds {
        warmPageCache(paths)
        c.append(Double(paths.count) / (await seconds { _ = cPool(paths) }))
        warmPageCache(paths)
        cLocked.append(Double(paths.count) / (await seconds { _ = cLockedPool(paths, shards: root + "/c-shards", filesPerLock: 1) }))
        warmPageCache(paths)
        cGroupLocked.append(Double(paths.count) / (await seconds { _ = cLockedPool(paths, shards: root + "/c-shards", filesPerLock: 32) }))
        warmPageCache(paths)
        ours.append(Double(paths.count) / (try await seconds {
            var tally = Tally()
            for try await result in coordinator.readFiles(at: urls, batchOptions: BatchReadOptions(concurrency: concurrency)) {
                if case .success(let data) = result.result { tally.add(data) }
            }
        }))
        warmPageCache(paths)
        inPlace.append(Double(paths.count) / (try await seconds {
            _ = try await coordinator.readFiles(at: urls, batchOptions: BatchReadOptions(concurrency: concurrency))
                .forEachFile(perWorker: Tally()) { tally, file in tally.add(file) }
        }))
        warmPageCache(paths)
        fromPaths.append(Double(paths.count) / (try await seconds {
            _ = try await coordinator.readFiles(at: filePaths, batchOptions: BatchReadOptions(concurrency: concurrency))
                .forEachFile(perWorker: Tally()) { tally, file in tally.add(file) }
        }))
    }
    let cMedian = percentile(c, 0.5), oursMedian = percentile(ours, 0.5), inPlaceMedian = percentile(inPlace, 0.5)
    let fromPathsMedian = percentile(fromPaths, 0.5)
    /// The median of the rounds' ratios of `values` to `peer`, with their range.
    func ratio(_ values: [Double], _ peer: [Double]) -> (median: Double, text: String) {
        let ratios = zip(values, peer).map { $0 / $1 }.sorted()
        return (ratios[ratios.count / 2], String(format: "%.2fx (%.2f-%.2f)", ratios[ratios.count / 2], ratios.first!, ratios.last!))
    }
    print(String(format: "  coordinated batch read, 10,000 small files   %9.0f files/s   C pool %9.0f files/s   %.2fx   goal >= 0.75x: %@",
                 oursMedian, cMedian, oursMedian / cMedian, oursMedian / cMedian >= 0.75 ? "met" : "NOT MET"))
    print(String(format: "    the same read in place (forEachFile)       %9.0f files/s                          %.2fx   goal >= 0.85x: %@",
                 inPlaceMedian, inPlaceMedian / cMedian, inPlaceMedian / cMedian >= 0.85 ? "met" : "NOT MET"))
    print(String(format: "    in place, given paths (as the C pool is)   %9.0f files/s                          %.2fx   goal >= 0.85x: %@",
                 fromPathsMedian, fromPathsMedian / cMedian, fromPathsMedian / cMedian >= 0.85 ? "met" : "NOT MET"))
    // The fair peer: the C pool under a shared OFD lock per file, on the file's byte in
    // one of 64 shards, as the protocol takes a claim (ratios: median of the rounds').
    print(String(format: "  C pool, a shared lock per file (16 threads)  %9.0f files/s   %@ of the C pool", percentile(cLocked, 0.5), ratio(cLocked, c).text))
    print(String(format: "  C pool, a shared lock per 32 files           %9.0f files/s   %@ of the C pool", percentile(cGroupLocked, 0.5), ratio(cGroupLocked, c).text))
    for (name, values) in [("coordinated batch read (the sequence)", ours), ("in place (forEachFile)", inPlace), ("in place, given paths", fromPaths)] {
        let against = ratio(values, cLocked)
        print(String(format: "    %@ against the lock per file   %@   goal >= 0.90x: %@",
                     name.padding(toLength: 38, withPad: " ", startingAt: 0), against.text, against.median >= 0.9 ? "met" : "NOT MET"))
    }

    // FILECOORD_BENCH_UNRELATED=N sets the second run's count (10,000 by default).
    let unrelated = Int(ProcessInfo.processInfo.environment["FILECOORD_BENCH_UNRELATED"] ?? "10000") ?? 10_000
    var resident: [(child: Int, here: Int)] = []
    for (presenters, claims) in [(0, 0), (unrelated, unrelated)] {
        let setUp = DispatchTime.now().uptimeNanoseconds
        let before = heapInUseKiB()
        let (child, input) = try startChild(space: space, path: item, presenters: presenters, claims: claims)
        let setUpSeconds = Double(DispatchTime.now().uptimeNanoseconds - setUp) / 1e9
        _ = try await writeLatencies(200) // warm: the registry read, the mailboxes
        resident.append((residentKiB(child.processIdentifier), heapInUseKiB() - before))
        let (samples, wholeCalls) = try await writeLatencies(2000)
        let p50 = percentile(samples, 0.5), p99 = percentile(samples, 0.99)
        let whole50 = percentile(wholeCalls, 0.5)
        let read = try await readCost()
        print(String(format: "  with %5d unrelated presenters and claims elsewhere (the other process set up in %.1f s):", presenters, setUpSeconds))
        // The floor in the same minutes: what the write's one round trip (the
        // relinquish and its reply) costs two C processes through inotify.
        var floor = [Double](repeating: 0, count: 2000)
        if peer_inotify_round_trips(root + "/c-floor", Int32(floor.count), 0, &floor) == 0 {
            let floor50 = percentile(floor, 0.5), floor99 = percentile(floor, 0.99)
            print(String(format: "    write, one presenter in the other process: p50 %6.0f us  p99 %6.0f us", p50, p99))
            print(String(format: "    C floor: a message and its answer through inotify p50 %6.0f us  p99 %6.0f us   (two processes, a write and close each way)",
                         floor50, floor99))
            print(String(format: "      p50 %.1fx the floor's   goal <= 2x: %@;   p99 %.1fx the floor's p99   goal <= 3x and <= 1 ms: %@",
                         p50 / floor50, p50 <= 2 * floor50 ? "met" : "NOT MET",
                         p99 / floor99, p99 <= 3 * floor99 && p99 <= 1000 ? "met" : "NOT MET"))
            // What a caller that times its own call waits: after the accessor, the
            // `did-change` and `reacquire` messages are written before the claim goes.
            print(String(format: "    the whole call, as its caller waits for it:  p50 %6.0f us  p99 %6.0f us   %.1fx the floor's p50   goal <= 1.5x: %@",
                         whole50, percentile(wholeCalls, 0.99), whole50 / floor50, whole50 <= 1.5 * floor50 ? "met" : "NOT MET"))
        } else {
            print(String(format: "    write, one presenter in the other process: p50 %6.0f us  p99 %6.0f us   (no C floor: it failed to run)", p50, p99))
        }
        print(String(format: "    uncontended coordinated read, empty accessor %7.2f us", read))
        if presenters == 0 {
            // After a pause every thread of both processes sleeps; the C floor pauses the same way.
            let idle = try await writeLatencies(500, pause: 5000).toAccessor
            var pausedFloor = [Double](repeating: 0, count: 500)
            let idle50 = percentile(idle, 0.5)
            print(String(format: "    the write, each 5 ms after the last:         p50 %6.0f us  p99 %6.0f us", idle50, percentile(idle, 0.99)))
            if peer_inotify_round_trips(root + "/c-floor", Int32(pausedFloor.count), 5000, &pausedFloor) == 0 {
                let floor50 = percentile(pausedFloor, 0.5)
                print(String(format: "    C floor, each 5 ms after the last:           p50 %6.0f us  p99 %6.0f us   %.1fx   goal <= 5x: %@",
                             floor50, percentile(pausedFloor, 0.99), idle50 / floor50, idle50 <= 5 * floor50 ? "met" : "NOT MET"))
            }
        }
        // Signed: memory that earlier workloads left in use may be freed meanwhile.
        print(String(format: "    memory: the other process %ld KiB resident; this one's heap %+ld KiB from its start to after the first writes",
                     resident.last!.child, resident.last!.here))
        try input.fileHandleForWriting.close()
        child.waitUntilExit()
    }
    if resident.count == 2, unrelated > 0 {
        let perPresenter = Double(resident[1].child - resident[0].child) * 1024 / Double(unrelated)
        let perRemote = Double(resident[1].here - resident[0].here) * 1024 / Double(unrelated)
        print(String(format: "  memory per presenter (with its claim and watch) in its process: %.0f bytes; per presenter of another process, in the writer: %.0f bytes",
                     perPresenter, perRemote))
    }
}

/// The C pool under a shared lock per file (or per `filesPerLock` files), its 64 shard
/// files in `shards` (`peer_read_files_locked`).
func cLockedPool(_ paths: [String], shards: String, filesPerLock: Int) -> Tally {
    var sum: UInt64 = 0
    let bytes = withCPaths(paths) { peer_read_files_locked($0, $1, Int32(concurrency), shards, Int32(filesPerLock), &sum) }
    precondition(bytes >= 0, "the C pool with locks failed (a shard or a lock call)")
    return Tally(bytes: Int(bytes), sum: sum)
}

/// This process's heap in use (`malloc`'s allocated bytes, its mapped blocks included),
/// KiB. Unlike the resident size, it does not fall when the machine pages out what
/// earlier workloads left (this VM's DAMON does: the resident size measured growth
/// below zero).
func heapInUseKiB() -> Int {
    Int(peer_heap_in_use()) / 1024
}

/// A process's resident size (VmRSS), KiB; 0 when it cannot be read.
func residentKiB(_ pid: Int32) -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
    return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
}
