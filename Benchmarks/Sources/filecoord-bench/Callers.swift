// What a caller gets, called as users call it: a coordination from the main actor (where
// top-level code and apps run), and one `filecoord` command as a whole process beside
// `flock(1)`, the tool a script would otherwise use.
import Dispatch
import FileCoordination
import Foundation
import Glibc

/// The uncontended coordinated read with an empty accessor, from the main actor and from
/// a detached task (the global executor), alternating in each round: in this process
/// only, then with a coordination space joined (kernel claims).
@MainActor
func runMainActor(_ paths: [String]) async throws {
    await FileCoordinator.leaveCoordinationSpace()
    try await measureCallers(paths, label: "in process, no presenters", goal: 3)
    let space = NSTemporaryDirectory() + "filecoord-bench-callers-\(getpid())"
    try await FileCoordinator.joinCoordinationSpace(at: FilePath(space))
    try await measureCallers(paths, label: "a space joined: kernel claims, no presenters", goal: 5)
    await FileCoordinator.leaveCoordinationSpace()
    try? FileManager.default.removeItem(atPath: space)
}

@MainActor
private func measureCallers(_ paths: [String], label: String, goal: Double) async throws {
    let url = URL(fileURLWithPath: paths[0])
    let coordinator = FileCoordinator()
    let iterations = 100_000
    func mainActorRound() async throws -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        for _ in 0 ..< iterations { try await coordinator.coordinate(readingItemAt: url) { _ in } }
        return Double(DispatchTime.now().uptimeNanoseconds - start) / Double(iterations) / 1000
    }
    func detachedRound() async throws -> Double {
        try await Task.detached {
            let start = DispatchTime.now().uptimeNanoseconds
            for _ in 0 ..< iterations { try await coordinator.coordinate(readingItemAt: url) { _ in } }
            return Double(DispatchTime.now().uptimeNanoseconds - start) / Double(iterations) / 1000
        }.value
    }
    _ = try await mainActorRound() // warm
    _ = try await detachedRound()
    var main: [Double] = [], detached: [Double] = [], ratios: [Double] = []
    for _ in 0 ..< rounds {
        let m = try await mainActorRound(), d = try await detachedRound()
        main.append(m)
        detached.append(d)
        ratios.append(m / d)
    }
    let m = main.sorted()[main.count / 2], d = detached.sorted()[detached.count / 2], r = ratios.sorted()[ratios.count / 2]
    print("\ncallers (\(label); median of \(rounds) rounds of \(iterations))")
    print(String(format: "  uncontended coordinated read from the main actor   %6.2f us   from a detached task %6.2f us   %.2fx",
                 m, d, r))
    print(String(format: "    goals <= %.0f us: %@, <= 2x the detached figure: %@", goal, m <= goal ? "met" : "NOT MET", r <= 2 ? "met" : "NOT MET"))
}

/// One command as a whole process, paired with `flock(1)` in each round: `filecoord exec
/// --write F -- true` against `flock F true`, `filecoord read --cat F` against
/// `flock -s F cat F`, and `filecoord --version` (start-up alone) and `filecoord write F`
/// (a replacement made durable: written, synced and renamed) alone.
/// The binary is the release build `make bench` makes (`FILECOORD_BIN` to name another).
func runCommandLine() throws {
    let binary = ProcessInfo.processInfo.environment["FILECOORD_BIN"] ?? FileManager.default.currentDirectoryPath + "/.build/release/filecoord"
    guard FileManager.default.isExecutableFile(atPath: binary), let flock = ["/usr/bin/flock", "/bin/flock"].first(where: FileManager.default.isExecutableFile) else {
        print("\ncommand line: skipped (no \(binary) or no flock)")
        return
    }
    let directory = NSTemporaryDirectory() + "filecoord-bench-cli-\(getpid())"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let file = directory + "/lock"
    _ = FileManager.default.createFile(atPath: file, contents: nil)
    setenv("FILECOORD_SPACE", directory + "/space", 1)
    /// Microseconds from spawn to the end of `waitpid`; NaN when the command did not
    /// exit 0 (a crashing build must not pass for a fast one).
    func run(_ arguments: [String], stdin: String = "/dev/null") -> Double {
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let start = DispatchTime.now().uptimeNanoseconds
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        defer { posix_spawn_file_actions_destroy(&actions) }
        guard posix_spawn(&pid, arguments[0], &actions, nil, argv, environ) == 0 else { return .nan }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        guard status == 0 else { return .nan }
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1000
    }
    /// The resident size (KiB) of the process that runs `prefix`'s command, while it runs:
    /// the command reads its parent's. (Not `ru_maxrss`: a child of `posix_spawn` inherits
    /// the spawning process's high-water mark through the shared address space.)
    func resident(_ prefix: [String]) -> String {
        let output = Pipe(), process = Process()
        process.executableURL = URL(fileURLWithPath: prefix[0])
        process.arguments = Array(prefix.dropFirst()) + ["sh", "-c", "grep VmRSS /proc/$PPID/status"]
        process.standardOutput = output
        guard (try? process.run()) != nil else { return "?" }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return text.split(whereSeparator: \.isWhitespace).dropFirst().first.map(String.init) ?? "?"
    }
    let pairs = 60
    for _ in 0 ..< 5 { _ = run([flock, file, "true"]); _ = run([binary, "exec", "--write", file, "--", "true"]) } // warm
    let content = directory + "/content", written = directory + "/written"
    _ = FileManager.default.createFile(atPath: content, contents: Data(repeating: 0x61, count: 4096))
    var flocks: [Double] = [], execs: [Double] = [], versions: [Double] = [], ratios: [Double] = []
    var cats: [Double] = [], reads: [Double] = [], readRatios: [Double] = [], writes: [Double] = []
    for _ in 0 ..< pairs {
        let f = run([flock, file, "true"]), e = run([binary, "exec", "--write", file, "--", "true"])
        flocks.append(f)
        execs.append(e)
        ratios.append(e / f)
        versions.append(run([binary, "--version"]))
        let c = run([flock, "-s", content, "cat", content]), r = run([binary, "read", "--cat", content])
        cats.append(c)
        reads.append(r)
        readRatios.append(r / c)
        writes.append(run([binary, "write", written], stdin: content))
    }
    func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
    print("\ncommand line (one process each, \(pairs) pairs; \(binary))")
    guard !(execs + flocks + versions + cats + reads + writes).contains(where: \.isNaN) else {
        print("  FAILED: a command did not exit 0 (\(execs.filter(\.isNaN).count) of \(pairs) exec runs, \(versions.filter(\.isNaN).count) --version runs, "
              + "\(reads.filter(\.isNaN).count) read runs, \(writes.filter(\.isNaN).count) write runs)")
        return
    }
    print(String(format: "  filecoord exec --write F -- true   %7.0f us   flock F true %7.0f us   %.2fx (median of the pairs' ratios)   goal <= 3x: %@",
                 median(execs), median(flocks), median(ratios), median(ratios) <= 3 ? "met" : "NOT MET"))
    print(String(format: "  filecoord read --cat F (4 KiB)     %7.0f us   flock -s F cat F %7.0f us   %.2fx (median of the pairs' ratios)",
                 median(reads), median(cats), median(readRatios)))
    print(String(format: "  filecoord write F < 4 KiB          %7.0f us   (written beside F, synced, renamed over it)", median(writes)))
    print(String(format: "  filecoord --version (start-up)     %7.0f us", median(versions)))
    print("  resident while the command runs: filecoord exec --write F \(resident([binary, "exec", "--write", file, "--"])) KiB, flock F \(resident([flock, file])) KiB")
}
