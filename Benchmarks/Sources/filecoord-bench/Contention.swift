// Many processes on one item: N shell loops at once, each running K increments of one
// counter under `filecoord exec --write`, beside the same loops under `flock(1)`, as
// `make -j`, `xargs -P` and CI jobs wrap their steps.
import CPeers
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
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
        let ratio = median(ratios)
        let goal = workers >= 1000 ? 3.0 : 2.0
        let shape = "\(workers) x \(each)".padding(toLength: 9, withPad: " ", startingAt: 0)
        print(String(format: "  %@  %10.2f s  %19.2f s        %5.2fx (%.2f-%.2f)   %8.0f ms / %6.0f ms          %@", shape,
                     median(flocks), median(execs), ratio, ratios.min()!, ratios.max()!, flockLongest, execLongest,
                     wrong.isEmpty ? (ratio <= goal ? "<= \(Int(goal))x met" : "<= \(Int(goal))x NOT MET") : "FAILED: a counter was wrong or a command failed (\(Set(wrong).sorted().joined(separator: ", ")))"))
    }
}
