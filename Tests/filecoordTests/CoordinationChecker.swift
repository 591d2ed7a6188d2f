import AsyncFileIO
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
        /// A round in which no worker writes a line for this long is a hang.
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
        // Every worker ends, or the run is a hang: no worker wrote a line for `hangLimit`.
        let hung = Flag()
        let logPaths = workers.map(\.log)
        let watchdog = Task {
            var watch = ProgressWatch(limit: options.hangLimit)
            while true {
                let size = logPaths.reduce(0) { total, path in
                    var info = stat()
                    return total + (stat(path, &info) == 0 ? Int(info.st_size) : 0)
                }
                if watch.observe(size: size, at: .now) { break }
                try await Task.sleep(for: .seconds(1)) // ok: polling the workers' logs for progress
            }
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
        if hung.isSet { problems.append("hang: no worker wrote a line for \(options.hangLimit)") }
        let killed = killedAt.times.withLock { $0 }
        for (pid, status) in statuses where status != 0 && killed[pid] == nil && !hung.isSet {
            let output = workers.first { $0.pid == pid }.flatMap { try? String(contentsOfFile: $0.log + ".out", encoding: .utf8) } ?? ""
            let reason = output.split(separator: "\n").first { $0.contains("Caught error") || $0.contains("rror") } ?? ""
            problems.append("worker \(pid) exited with status \(status): \(reason)")
        }
        let counter = Int((try? String(contentsOfFile: items + "/counter", encoding: .utf8)) ?? "") ?? -1
        let logTexts = workers.map { (pid: $0.pid, text: (try? String(contentsOfFile: $0.log, encoding: .utf8)) ?? "") }
        let found = findings(logTexts, killed: killed, hung: hung.isSet, counter: counter)
        problems += found.problems
        let summary = "seed \(options.seed): \(options.workers) workers, \(found.accesses) accesses, \(found.increments) increments, "
            + "\(found.asks) presenter requests, \(killed.count) killed, \(options.stops) stops"
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
            asked(by: writer)
            return nil
        }
        func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
            asked(by: reader)
            return nil
        }
        /// The asking coordinator's purpose names the coordination (one coordinator each).
        private func asked(by request: FileAccessRequest) {
            let purpose = request.purposeIdentifier.isEmpty ? "-" : request.purposeIdentifier.replacingOccurrences(of: " ", with: "_")
            log.line("A \(name) \(request.processIdentifier) \(CoordinationCheck.now()) \(purpose)")
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
            // A coordinator per coordination: its purpose, unique, names the coordination
            // in the presenters' logs.
            let coordinator = FileCoordinator()
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .seconds(5), action: .proceed))
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
