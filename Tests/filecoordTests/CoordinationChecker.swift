@_spi(FileCoordinationInternal) import AsyncFileIO
import FileCoordination
import Foundation
import Synchronization
import SystemPackage
import Testing
import TestSupport

/// A randomized checker of the promise across processes, on the public API.
///
/// Several worker processes (this test binary again, in ``CheckerWorker``) share a
/// coordination space and a handful of items. Each presents one item and runs seeded
/// random coordinations: reads, writes, crossed multi-item claims (read X + write Y, and
/// the reverse), increments of a counter, and moves of a file between two directories.
/// Every accessor logs its interval on `CLOCK_MONOTONIC` (one clock for every process),
/// every presenter each time it is asked. The parent kills workers with SIGKILL (and,
/// in the soak, stops them with SIGSTOP for a while) on a seeded schedule, then checks:
/// no writer's interval overlaps another access to the same item, no update to the
/// counter was lost, no worker hung, and no presenter was asked twice by one coordination.
///
/// Seeded and replayable: `FILECOORD_CHECK_SEED=N` reruns the same operations and kill
/// schedule (the interleaving is the machine's). `make test` runs a small budget;
/// `make soak` runs it for minutes (`docs/reliability.md`).
struct CoordinationCheck {
    struct Options {
        var seed: UInt64
        var workers = 6
        var steps = 400
        var kills = 2
        var stops = 0
        /// A run longer than this is a hang.
        var hangLimit: Duration = .seconds(90)
    }

    /// One accessor's interval.
    struct Interval {
        var pid: Int32
        var writes: Set<String>
        var reads: Set<String>
        var begin: Int64
        var end: Int64?
        var operation: String
    }

    /// When each killed worker was killed (`CLOCK_MONOTONIC`).
    final class Kills: Sendable {
        let times = Locked<[Int32: Int64]>([:])
    }

    static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }

    /// Runs one round; returns the problems found (empty: the promise held) and what ran.
    static func run(_ options: Options, in directory: String) async throws -> (problems: [String], summary: String) {
        let space = directory + "/space"
        let items = directory + "/items"
        for folder in [items, items + "/a", items + "/b", directory + "/logs"] {
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        }
        for index in 0 ..< 4 { try Data("0".utf8).write(to: URL(fileURLWithPath: items + "/i\(index)")) }
        try Data("0".utf8).write(to: URL(fileURLWithPath: items + "/counter"))
        try Data("m".utf8).write(to: URL(fileURLWithPath: items + "/a/m"))
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        var random = SplitMix64(seed: options.seed)
        var workers: [(pid: pid_t, log: String)] = []
        for index in 0 ..< options.workers {
            let log = directory + "/logs/w\(index)"
            let environment = [
                CheckerWorker.spaceVariable + "=" + space, CheckerWorker.itemsVariable + "=" + items,
                CheckerWorker.seedVariable + "=\(random.next())", CheckerWorker.stepsVariable + "=\(options.steps)",
                CheckerWorker.logVariable + "=" + log, CheckerWorker.barrierVariable + "=" + directory + "/barrier",
            ]
            let spawned = try Spawned([binary, "--testing-library", "swift-testing", "--filter", "CheckerWorker"], environment: environment,
                                      output: log + ".out")
            workers.append((spawned.pid, log))
        }
        // The schedule of faults: a kill or a stop at a random moment in the first seconds.
        var faults: [(at: Duration, worker: Int, stop: Bool)] = []
        for _ in 0 ..< options.kills { faults.append((.milliseconds(Int(random.next() % 4000)), Int(random.next() % UInt64(options.workers)), false)) }
        for _ in 0 ..< options.stops { faults.append((.milliseconds(Int(random.next() % 4000)), Int(random.next() % UInt64(options.workers)), true)) }
        faults.sort { $0.at < $1.at }
        let killedAt = Kills()
        let pids = workers.map(\.pid)
        let injector = Task {
            let start = ContinuousClock.now
            for fault in faults {
                try await Task.sleep(until: start + fault.at) // ok: the fault schedule is in real time
                let pid = pids[fault.worker]
                if fault.stop {
                    kill(pid, SIGSTOP)
                    try await Task.sleep(for: .milliseconds(300)) // ok: how long a stopped worker stays stopped
                    kill(pid, SIGCONT)
                } else {
                    killedAt.times.withLock { if $0[pid] == nil { $0[pid] = now() } }
                    kill(pid, SIGKILL)
                }
            }
        }
        // Every worker ends, or the run is a hang.
        let hung = Flag()
        let watchdog = Task {
            try await Task.sleep(for: options.hangLimit) // ok: the bound of a hang
            hung.set()
            for pid in pids { kill(pid, SIGCONT); kill(pid, SIGKILL) }
        }
        // The barrier: once every worker still alive has done its steps, each checks that
        // its presenter still hears changes.
        let logs = workers.map(\.log)
        let barrier = Task {
            while !hung.isSet {
                let dead = killedAt.times.withLock { Set($0.keys) }
                let waiting = zip(pids, logs).allSatisfy { pid, log in
                    dead.contains(pid) || ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("\nW ")
                        || kill(pid, 0) != 0
                }
                if waiting { break }
                try await Task.sleep(for: .milliseconds(20)) // ok: polling the workers' logs
            }
            _ = FileManager.default.createFile(atPath: directory + "/barrier", contents: nil)
        }
        var statuses: [Int32: Int32] = [:]
        for worker in workers { statuses[worker.pid] = await Spawned(pid: worker.pid).wait() }
        barrier.cancel()
        watchdog.cancel()
        injector.cancel()
        _ = await injector.result
        var problems: [String] = []
        if hung.isSet { problems.append("hang: the workers had not ended after \(options.hangLimit)") }
        let killed = killedAt.times.withLock { $0 }
        for (pid, status) in statuses where status != 0 && killed[pid] == nil && !hung.isSet {
            let output = workers.first { $0.pid == pid }.flatMap { try? String(contentsOfFile: $0.log + ".out", encoding: .utf8) } ?? ""
            let reason = output.split(separator: "\n").first { $0.contains("Caught error") || $0.contains("rror") } ?? ""
            problems.append("worker \(pid) exited with status \(status): \(reason)")
        }
        // The logs.
        var intervals: [Interval] = []
        var asks: [(presenter: Int32, item: String, asker: Int32, at: Int64)] = []
        var completedIncrements = 0, openIncrements = 0
        for worker in workers {
            let text = (try? String(contentsOfFile: worker.log, encoding: .utf8)) ?? ""
            var open: [Int: Interval] = [:]
            var (changedAt, heardAt): (Int64?, Int64?) = (nil, nil)
            defer {
                // A worker that lived to the end: its presenter heard a fresh change in 1 s.
                if killed[worker.pid] == nil, !hung.isSet {
                    if let changedAt, let heardAt {
                        if heardAt - changedAt > 1_000_000_000 { problems.append("worker \(worker.pid)'s presenter heard a change after \(Double(heardAt - changedAt) / 1e9) s") }
                    } else {
                        problems.append("worker \(worker.pid)'s presenter never heard the change made at the end (deaf)")
                    }
                }
            }
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ").map(String.init)
                guard fields.count >= 2 else { continue }
                switch fields[0] {
                case "B" where fields.count == 6:
                    // B <seq> <operation> <reads> <writes> <ns>
                    let set: (String) -> Set<String> = { $0 == "-" ? [] : Set($0.split(separator: ",").map(String.init)) }
                    open[Int(fields[1])!] = Interval(pid: worker.pid, writes: set(fields[4]), reads: set(fields[3]),
                                                     begin: Int64(fields[5])!, end: nil, operation: fields[2])
                case "E" where fields.count == 3:
                    if var interval = open.removeValue(forKey: Int(fields[1])!) {
                        interval.end = Int64(fields[2])!
                        if interval.operation == "increment" { completedIncrements += 1 }
                        intervals.append(interval)
                    }
                case "A" where fields.count == 4:
                    asks.append((worker.pid, fields[1], Int32(fields[2])!, Int64(fields[3])!))
                case "U": changedAt = Int64(fields[1])
                case "H": heardAt = Int64(fields[1])
                default: break
                }
            }
            // Begun and never ended: the worker was killed inside the accessor.
            for (_, var interval) in open {
                interval.end = killed[worker.pid]
                if interval.operation == "increment" { openIncrements += 1 }
                intervals.append(interval)
            }
        }
        // No writer overlaps another access to the same item.
        var byItem: [String: [Interval]] = [:]
        for interval in intervals {
            for item in interval.writes.union(interval.reads) { byItem[item, default: []].append(interval) }
        }
        for (item, list) in byItem {
            let sorted = list.sorted { $0.begin < $1.begin }
            for (index, first) in sorted.enumerated() {
                let end = first.end ?? .max
                for second in sorted[(index + 1)...] {
                    guard second.begin < end else { break }
                    guard first.writes.contains(item) || second.writes.contains(item) else { continue }
                    problems.append("overlap on \(item): \(first.operation) by \(first.pid) [\(first.begin), \(String(describing: first.end))] "
                        + "and \(second.operation) by \(second.pid) from \(second.begin)")
                }
            }
        }
        // No update lost: the counter counts every completed increment, and at most the
        // ones killed inside their accessor besides.
        let counter = Int((try? String(contentsOfFile: items + "/counter", encoding: .utf8)) ?? "") ?? -1
        if counter < completedIncrements || counter > completedIncrements + openIncrements {
            problems.append("lost update: the counter is \(counter) after \(completedIncrements) completed increments (\(openIncrements) killed inside)")
        }
        // A presenter is asked once per coordination: between two asks by one process
        // for the same item, that process ran an accessor on it.
        let beginsByPid = Dictionary(grouping: intervals, by: \.pid)
        for group in Dictionary(grouping: asks, by: { "\($0.presenter) \($0.item) \($0.asker)" }).values {
            let times = group.map(\.at).sorted()
            for (first, second) in zip(times, times.dropFirst()) {
                let ran = (beginsByPid[group[0].asker] ?? []).contains { interval in
                    interval.begin > first && interval.begin <= second + 1_000_000_000 && interval.writes.union(interval.reads).contains(group[0].item)
                        && interval.begin < second
                }
                if !ran { problems.append("presenter \(group[0].presenter) of \(group[0].item) asked twice by \(group[0].asker) for one coordination (at \(first) and \(second))") }
            }
        }
        let summary = "seed \(options.seed): \(options.workers) workers, \(intervals.count) accesses, \(completedIncrements) increments, "
            + "\(asks.count) presenter requests, \(killed.count) killed, \(options.stops) stops"
        return (problems, summary)
    }
}

/// A worker process of ``CoordinationCheck`` (this test binary again, filtered to it).
@Suite struct CheckerWorker {
    static let spaceVariable = "FILECOORD_CHECK_SPACE"
    static let itemsVariable = "FILECOORD_CHECK_ITEMS"
    static let seedVariable = "FILECOORD_CHECK_WORKER_SEED"
    static let stepsVariable = "FILECOORD_CHECK_STEPS"
    static let logVariable = "FILECOORD_CHECK_LOG"
    static let barrierVariable = "FILECOORD_CHECK_BARRIER"
    static var inWorker: Bool { ProcessInfo.processInfo.environment[spaceVariable] != nil }

    /// Appends lines to the worker's log, one `write(2)` each (a kill loses no half line).
    final class Log: Sendable {
        let fd: Int32
        init(_ path: String) { fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644) }
        func line(_ text: String) {
            let bytes = Array((text + "\n").utf8)
            _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        }
    }

    final class LoggingPresenter: FilePresenter {
        let presentedItemURL: URL?
        let name: String
        let log: Log
        init(_ url: URL, name: String, log: Log) {
            presentedItemURL = url
            self.name = name
            self.log = log
        }
        func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
            log.line("A \(name) \(writer.processIdentifier) \(CoordinationCheck.now())")
            return nil
        }
        func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
            log.line("A \(name) \(reader.processIdentifier) \(CoordinationCheck.now())")
            return nil
        }
        let changes = Atomic<Int>(0)
        func presentedItemDidChange() async {
            log.line("C \(name) \(CoordinationCheck.now())")
            changes.add(1, ordering: .releasing)
        }
    }

    @Test("a checker worker", .enabled(if: inWorker))
    func work() async throws {
        let environment = ProcessInfo.processInfo.environment
        let items = environment[Self.itemsVariable]!
        let log = Log(environment[Self.logVariable]!)
        var random = SplitMix64(seed: UInt64(environment[Self.seedVariable]!)!)
        let steps = Int(environment[Self.stepsVariable]!)!
        _ = try await FileCoordinator.joinCoordinationSpace(at: FilePath(environment[Self.spaceVariable]!))
        let coordinator = FileCoordinator()
        coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .seconds(5), action: .proceed))
        let presented = "i\(random.next() % 4)"
        let presenter = LoggingPresenter(URL(fileURLWithPath: items + "/" + presented), name: presented, log: log)
        await FileCoordinator.addFilePresenter(presenter)
        func url(_ name: String) -> URL { URL(fileURLWithPath: items + "/" + name) }
        var sequence = 0
        /// Logs the accessor's interval around `body`.
        func access(_ operation: String, reads: [String], writes: [String], _ body: () throws -> Void) rethrows {
            sequence += 1
            let list: ([String]) -> String = { $0.isEmpty ? "-" : $0.joined(separator: ",") }
            log.line("B \(sequence) \(operation) \(list(reads)) \(list(writes)) \(CoordinationCheck.now())")
            try body()
            // The accessor's work: long enough for others to queue behind it.
            usleep(UInt32(500 + random.next() % 3000)) // ok: the accessor holds its claim a while
            log.line("E \(sequence) \(CoordinationCheck.now())")
        }
        for _ in 0 ..< steps {
            let (x, y) = ("i\(random.next() % 4)", "i\(random.next() % 4)")
            switch random.next() % 6 {
            case 0:
                try await coordinator.coordinate(readingItemAt: url(x)) { _ in access("read", reads: [x], writes: []) {} }
            case 1:
                try await coordinator.coordinate(writingItemAt: url(x)) { target in
                    try access("write", reads: [], writes: [x]) { try Data("\(sequence)".utf8).write(to: target) }
                }
            case 2 where x != y:
                try await coordinator.coordinate(readingItemAt: url(x), writingItemAt: url(y)) { _, target in
                    try access("crossed", reads: [x], writes: [y]) { try Data("\(sequence)".utf8).write(to: target) }
                }
            case 3 where x != y:
                try await coordinator.coordinate(readingItemAt: url(y), writingItemAt: url(x)) { _, target in
                    try access("crossed", reads: [y], writes: [x]) { try Data("\(sequence)".utf8).write(to: target) }
                }
            case 4:
                try await coordinator.coordinate(writingItemAt: url("counter")) { target in
                    try access("increment", reads: [], writes: ["counter"]) {
                        let value = Int(try String(contentsOf: target, encoding: .utf8)) ?? 0
                        try Data("\(value + 1)".utf8).write(to: target, options: .atomic)
                    }
                }
            default:
                // A move back and forth between two directories, claimed as Apple's move is.
                // Which way it goes is decided under the claims: another worker may move it first.
                try await coordinator.coordinate(writingItemAt: url("a/m"), options: .forMoving, writingItemAt: url("b/m"), options: .forReplacing) { a, b in
                    let (source, destination) = FileManager.default.fileExists(atPath: a.path) ? (a, b) : (b, a)
                    try access("move", reads: [], writes: ["m"]) { try FileManager.default.moveItem(at: source, to: destination) }
                    await coordinator.item(at: source, didMoveTo: destination)
                }
            }
        }
        // Not deaf: once every worker is done (the parent's barrier), a change made
        // outside coordination reaches this presenter within 1 s.
        log.line("W \(CoordinationCheck.now())")
        let barrier = environment[Self.barrierVariable]!
        let barrierDeadline = ContinuousClock.now + .seconds(600)
        while Glibc.access(barrier, F_OK) != 0 { // ok: waiting for the parent's barrier file, bounded
            guard ContinuousClock.now < barrierDeadline else {
                Issue.record("no barrier file \(barrier) after 600 s")
                return
            }
            usleep(5000)
        }
        let before = presenter.changes.load(ordering: .acquiring)
        log.line("U \(CoordinationCheck.now())")
        let handle = try FileHandle(forWritingTo: url(presented))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("+".utf8))
        try handle.close()
        let deadline = ContinuousClock.now + .seconds(5)
        while presenter.changes.load(ordering: .acquiring) == before, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2)) // ok: polling the presenter's own count
        }
        if presenter.changes.load(ordering: .acquiring) != before { log.line("H \(CoordinationCheck.now())") }
        await FileCoordinator.removeFilePresenter(presenter)
        await FileCoordinator.leaveCoordinationSpace()
    }
}

@Suite("randomized checker across processes", .serialized)
struct CoordinationCheckTests {
    /// `make soak`: rounds with fresh seeds for this many minutes (`FILECOORD_CHECK_SOAK_MINUTES`),
    /// each with SIGKILLs and SIGSTOPs; a summary line per round, totals at the end.
    @Test("soak: rounds until the time is up", .enabled(if: ProcessInfo.processInfo.environment["FILECOORD_CHECK_SOAK_MINUTES"] != nil),
          .timeLimit(.minutes(60)))
    func soak() async throws {
        let environment = ProcessInfo.processInfo.environment
        let minutes = Double(environment["FILECOORD_CHECK_SOAK_MINUTES"] ?? "") ?? 10
        var seed = UInt64(environment["FILECOORD_CHECK_SEED"] ?? "") ?? UInt64(time(nil))
        let end = ContinuousClock.now + .seconds(minutes * 60)
        var (rounds, failures) = (0, 0)
        while ContinuousClock.now < end {
            let scratch = Scratch()
            let options = CoordinationCheck.Options(seed: seed, workers: 5, steps: 300, kills: 2, stops: 2)
            let (problems, summary) = try await CoordinationCheck.run(options, in: scratch.path)
            print("soak round \(rounds): \(summary)\(problems.isEmpty ? "" : "; FAILED")")
            #expect(problems.isEmpty, Comment(rawValue: "\(summary); replay with FILECOORD_CHECK_SEED=\(seed):\n" + problems.prefix(10).joined(separator: "\n")))
            if !problems.isEmpty { failures += 1 }
            rounds += 1
            seed &+= 1
        }
        print("soak: \(rounds) rounds in \(minutes) minutes, \(failures) failed")
    }

    @Test("seeded rounds of 6 worker processes with crossed claims, moves, presenters and SIGKILLs: no writer overlaps, no update lost, no hang, no presenter asked twice",
          .timeLimit(.minutes(5)))
    func rounds() async throws {
        let environment = ProcessInfo.processInfo.environment
        let seeds: [UInt64] = environment["FILECOORD_CHECK_SEED"].flatMap(UInt64.init).map { [$0] } ?? [1, 2, 3]
        for seed in seeds {
            let scratch = Scratch()
            let (problems, summary) = try await CoordinationCheck.run(.init(seed: seed), in: scratch.path)
            #expect(problems.isEmpty, Comment(rawValue: "\(summary); replay with FILECOORD_CHECK_SEED=\(seed):\n" + problems.prefix(10).joined(separator: "\n")))
        }
    }
}
