// Many processes on one item: N shell loops at once, each running K increments of one
// counter under `filecoord exec --write`, beside the same loops under `flock(1)`, as
// `make -j`, `xargs -P` and CI jobs wrap their steps.
import CPeers
import FileCoordination
import Foundation
import Glibc

/// N x K increments of one counter (`v=$(cat c); echo $((v+1)) > c`), each a process
/// under `flock c` and under `filecoord exec --write c`, the two alternating in each
/// round; every counter is checked. The binary is the one `make bench` builds as
/// `make install` does (`FILECOORD_BIN`).
func runContention() throws {
    let binary = ProcessInfo.processInfo.environment["FILECOORD_BIN"] ?? FileManager.default.currentDirectoryPath + "/.build/release/filecoord"
    guard FileManager.default.isExecutableFile(atPath: binary), let flock = ["/usr/bin/flock", "/bin/flock"].first(where: FileManager.default.isExecutableFile) else {
        print("\ncontention: skipped (no \(binary) or no flock)")
        return
    }
    let directory = NSTemporaryDirectory() + "filecoord-bench-contention-\(getpid())"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    setenv("FILECOORD_SPACE", directory + "/space", 1)
    let counter = directory + "/c"
    let script = "v=$(cat '\(counter)'); echo $((v+1)) > '\(counter)'"

    /// One run of `workers` x `each`: seconds, the longest single command (its wait
    /// included) in ms, and whether the counter came out right and every command exited 0.
    func measure(_ command: [String], workers: Int, each: Int) -> (seconds: Double, longest: Double, right: Bool) {
        _ = FileManager.default.createFile(atPath: counter, contents: Data("0\n".utf8))
        let argv = command.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var seconds = 0.0, longest = 0.0
        let failures = argv.withUnsafeBufferPointer { peer_run_concurrently($0.baseAddress, Int32(workers), Int32(each), &seconds, &longest) }
        let value = (try? String(contentsOfFile: counter, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        return (seconds, longest / 1000, failures == 0 && value == "\(workers * each)")
    }

    let flockCommand = [flock, counter, "sh", "-c", script]
    let execCommand = [binary, "exec", "--write", counter, "--", "sh", "-c", script]
    _ = measure(flockCommand, workers: 2, each: 5) // warm
    _ = measure(execCommand, workers: 2, each: 5)
    // 1,000 at once: the goal there is 3x (issue's "1,000 waiters"); the others, 2x.
    let shapes = [(1000, 1), (100, 2), (20, 10), (2, 100)]
    let contentionRounds = min(rounds, 3)
    print("\ncontention (N processes at once, each K increments of one counter, each a process; median of \(contentionRounds) rounds; \(binary))")
    print("  N x K      flock c sh -c   filecoord exec --write c   ratio (range)        longest command: flock / filecoord   goal")
    for (workers, each) in shapes {
        var flocks: [Double] = [], execs: [Double] = [], ratios: [Double] = []
        var flockLongest = 0.0, execLongest = 0.0
        var wrong: [String] = []
        for _ in 0 ..< contentionRounds {
            let f = measure(flockCommand, workers: workers, each: each)
            let e = measure(execCommand, workers: workers, each: each)
            if !f.right { wrong.append("flock") }
            if !e.right { wrong.append("filecoord") }
            flocks.append(f.seconds)
            execs.append(e.seconds)
            ratios.append(e.seconds / f.seconds)
            flockLongest = max(flockLongest, f.longest)
            execLongest = max(execLongest, e.longest)
        }
        let ratio = percentile(ratios, 0.5)
        let goal = workers >= 1000 ? 3.0 : 2.0
        let shape = "\(workers) x \(each)".padding(toLength: 9, withPad: " ", startingAt: 0)
        print(String(format: "  %@  %10.2f s  %19.2f s        %5.2fx (%.2f-%.2f)   %8.0f ms / %6.0f ms          %@", shape,
                     percentile(flocks, 0.5), percentile(execs, 0.5), ratio, ratios.min()!, ratios.max()!, flockLongest, execLongest,
                     wrong.isEmpty ? (ratio <= goal ? "<= \(Int(goal))x met" : "<= \(Int(goal))x NOT MET") : "FAILED: a counter was wrong or a command failed (\(Set(wrong).sorted().joined(separator: ", ")))"))
    }
}

/// In-library contention: `processes` processes of this binary (`--contend-tasks`), each
/// with `tasks` tasks making `each` coordinated writes of one counter (read it, write the
/// next value, in the accessor), beside C processes of as many threads each making as
/// many increments under flock(2) (`peer_flock_threads`). Each side's time runs from the
/// moment its processes may start to the last one's end (ours are started and have joined
/// the space before: their start-up is `cli`'s figure); every counter is checked.
func runTaskContention() async throws {
    let directory = NSTemporaryDirectory() + "filecoord-bench-tasks-\(getpid())"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let counter = directory + "/c", space = directory + "/space"
    // FILECOORD_BENCH_TASK_SHAPES=PxTxK,...: other shapes.
    let shapes = ProcessInfo.processInfo.environment["FILECOORD_BENCH_TASK_SHAPES"].map { list in
        list.split(separator: ",").compactMap { shape -> (Int, Int, Int)? in
            let numbers = shape.split(separator: "x").compactMap { Int($0) }
            return numbers.count == 3 ? (numbers[0], numbers[1], numbers[2]) : nil
        }
    } ?? [(10, 100, 2), (10, 10, 20), (2, 1, 500)]
    let contentionRounds = min(rounds, 3)
    print("\ncontention in the library (P processes x T tasks, each K coordinated increments of one counter; C: as many threads under flock(2); median of \(contentionRounds) rounds)")
    print("  P x T x K        flock(2) threads   coordinate(writingItemAt:)   ratio (range)        longest wait: flock / ours   goal")
    for (processes, tasks, each) in shapes {
        var flocks: [Double] = [], ours: [Double] = [], ratios: [Double] = []
        var flockLongest = 0.0, ourLongest = 0.0
        var wrong: [String] = []
        func value() -> Int? { Int((try? String(contentsOfFile: counter, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") }
        for _ in 0 ..< contentionRounds {
            _ = FileManager.default.createFile(atPath: counter, contents: Data("0\n".utf8))
            var seconds = 0.0, longest = 0.0
            let failures = peer_flock_threads(counter, Int32(processes), Int32(tasks), Int32(each), &seconds, &longest)
            if failures != 0 || value() != processes * tasks * each { wrong.append("flock: \(failures) failed, the counter at \(value() ?? -1)") }
            flocks.append(seconds)
            flockLongest = max(flockLongest, longest / 1000)

            _ = FileManager.default.createFile(atPath: counter, contents: Data("0\n".utf8))
            let children = try (0 ..< processes).map { _ in try startChild(["--contend-tasks", space, counter, "\(tasks)", "\(each)"]) }
            let start = DispatchTime.now().uptimeNanoseconds
            for (_, input) in children { input.fileHandleForWriting.write(Data("go\n".utf8)) }
            var longestHere = 0.0
            for (child, input) in children {
                let report = child.standardOutput.flatMap { ($0 as? Pipe)?.fileHandleForReading.readDataToEndOfFile() } ?? Data()
                child.waitUntilExit()
                try? input.fileHandleForWriting.close()
                let fields = String(decoding: report, as: UTF8.self).split(whereSeparator: \.isWhitespace)
                if child.terminationStatus != 0 || fields.first != "done" {
                    wrong.append("filecoord: a process exited \(child.terminationStatus) after \(String(decoding: report, as: UTF8.self).debugDescription)")
                }
                longestHere = max(longestHere, fields.count > 1 ? Double(fields[1]) ?? 0 : 0)
            }
            ours.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9)
            if let got = value(), got != processes * tasks * each { wrong.append("filecoord: the counter at \(got)") }
            ourLongest = max(ourLongest, longestHere / 1000)
            ratios.append(ours.last! / flocks.last!)
        }
        let ratio = percentile(ratios, 0.5)
        let shape = "\(processes) x \(tasks) x \(each)".padding(toLength: 15, withPad: " ", startingAt: 0)
        print(String(format: "  %@  %10.3f s  %21.3f s        %5.2fx (%.2f-%.2f)   %8.1f ms / %6.1f ms          %@", shape,
                     percentile(flocks, 0.5), percentile(ours, 0.5), ratio, ratios.min()!, ratios.max()!, flockLongest, ourLongest,
                     wrong.isEmpty ? (ratio <= 2 ? "<= 2x met" : "<= 2x NOT MET") : "FAILED: a counter was wrong or a process failed (\(Set(wrong).sorted().joined(separator: ", ")))"))
    }
}

/// The child of ``runTaskContention()``: joins the space, says `ready`, and at `go` runs
/// its tasks; prints `done` and the longest wait for a claim (microseconds).
func runTaskContentionChild(_ arguments: [String]) async throws -> Never {
    let space = FilePath(arguments[0]), url = URL(fileURLWithPath: arguments[1])
    let tasks = Int(arguments[2]) ?? 1, each = Int(arguments[3]) ?? 1
    try await FileCoordinator.joinCoordinationSpace(at: space)
    FileHandle.standardOutput.write(Data("ready\n".utf8))
    // The go line, read on a thread of our own (the cooperative pool is never blocked).
    await withCheckedContinuation { (going: CheckedContinuation<Void, Never>) in
        Thread { _ = readLine(); going.resume() }.start()
    }
    let longest = try await withThrowingTaskGroup(of: UInt64.self) { group in
        for _ in 0 ..< tasks {
            group.addTask {
                var longest: UInt64 = 0
                for _ in 0 ..< each {
                    let asked = DispatchTime.now().uptimeNanoseconds
                    // A coordinator per operation: coordinators with one purpose (one
                    // coordinator shared by the tasks) never block each other.
                    let waited = try await FileCoordinator().coordinate(writingItemAt: url) { url in
                        let waited = DispatchTime.now().uptimeNanoseconds - asked
                        let text = String(decoding: try await Data(asyncContentsOf: url), as: UTF8.self)
                        guard let value = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                            FileHandle.standardError.write(Data("filecoord-bench: the counter read \(text.debugDescription) under the claim\n".utf8))
                            exit(1)
                        }
                        let next = value + 1
                        try await Data("\(next)\n".utf8).asyncWrite(to: url, options: .skipSync)
                        return waited
                    }
                    longest = max(longest, waited)
                }
                return longest
            }
        }
        return try await group.reduce(0) { max($0, $1) }
    }
    FileHandle.standardOutput.write(Data("done \(longest / 1000)\n".utf8))
    exit(0)
}
