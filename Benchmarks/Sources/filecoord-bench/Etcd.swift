// Coordination across hosts through etcd, beside the same client's bare calls.
import Dispatch
import FileCoordination
@_spi(Benchmarks) import FileCoordinationEtcd
import Foundation

/// A single-member etcd on loopback ports, its data in `directory`; nil without etcd.
func startEtcd(in directory: String) throws -> (process: Process, endpoint: String)? {
    let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"].first { FileManager.default.isExecutableFile(atPath: $0) }
    guard let binary else { return nil }
    let client = Int.random(in: 30_000 ..< 40_000), peer = client + 10_000
    let process = Process()
    process.executableURL = URL(fileURLWithPath: binary)
    process.arguments = ["--name", "bench", "--data-dir", directory + "/etcd",
                         "--listen-client-urls", "http://127.0.0.1:\(client)", "--advertise-client-urls", "http://127.0.0.1:\(client)",
                         "--listen-peer-urls", "http://127.0.0.1:\(peer)", "--initial-advertise-peer-urls", "http://127.0.0.1:\(peer)",
                         "--initial-cluster", "bench=http://127.0.0.1:\(peer)", "--logger", "zap", "--log-outputs", "stdout"]
    let output = Pipe()
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    try process.run()
    var seen = Data()
    while !String(decoding: seen, as: UTF8.self).contains("serving client traffic") {
        let chunk = output.fileHandleForReading.availableData
        if chunk.isEmpty { return nil }
        seen.append(chunk)
    }
    // Its log is not read any more: the pipe goes to nothing.
    Thread.detachNewThread { while !output.fileHandleForReading.availableData.isEmpty {} }
    return (process, "127.0.0.1:\(client)")
}

/// `filecoord-bench --etcd-child ADDRESS ROOT PATH`: presents PATH in the etcd space (an
/// acknowledging presenter), prints "ready", and lives until its stdin closes.
/// `filecoord-bench --etcd-echo ENDPOINT PREFIX`: answers each key put under PREFIX/ping/
/// with a put under PREFIX/pong/ (the bare watch round trip's other side).
func runEtcdChild(_ arguments: [String]) async throws -> Never {
    if arguments[0] == "--etcd-echo" {
        let client = EtcdBareClient(endpoints: [arguments[1]])
        let prefix = arguments[2]
        let revision = try await client.put(prefix + "/echo-ready", "1")
        let watch = client.watchPuts(prefix + "/ping/", from: revision + 1) { key, value in
            let pong = prefix + "/pong/" + (key.split(separator: "/").last.map(String.init) ?? "")
            Task { try? await client.put(pong, value) }
        }
        FileHandle.standardOutput.write(Data("ready\n".utf8))
        _ = FileHandle.standardInput.readDataToEndOfFile()
        watch.cancel()
        exit(0)
    }
    let configuration = try EtcdCoordinationSpace.Configuration(address: arguments[1], root: FilePath(arguments[2]))
    try await FileCoordinator.joinCoordinationSpace(configuration)
    final class Acknowledger: FilePresenter {
        let presentedItemURL: URL?
        init(_ url: URL) { presentedItemURL = url }
    }
    let presenter = Acknowledger(URL(fileURLWithPath: arguments[3]))
    await FileCoordinator.addFilePresenter(presenter)
    FileHandle.standardOutput.write(Data("ready\n".utf8))
    _ = FileHandle.standardInput.readDataToEndOfFile()
    withExtendedLifetime(presenter) {}
    await FileCoordinator.leaveCoordinationSpace()
    exit(0)
}

func runEtcd() async throws {
    let root = NSTemporaryDirectory() + "filecoord-bench-etcd-\(getpid())"
    try FileManager.default.createDirectory(atPath: root + "/items", withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: root) }
    guard let (server, endpoint) = try startEtcd(in: root) else {
        print("etcd space: no etcd here (Debian: etcd-server); skipped")
        return
    }
    defer { server.terminate(); server.waitUntilExit() }
    let item = root + "/items/doc"
    _ = FileManager.default.createFile(atPath: item, contents: Data("x".utf8))
    let address = "etcd://\(endpoint)/bench"
    try await FileCoordinator.joinCoordinationSpace(try EtcdCoordinationSpace.Configuration(address: address, root: FilePath(root)))
    defer { Task { await FileCoordinator.leaveCoordinationSpace() } }
    let bare = EtcdBareClient(endpoints: [endpoint])
    let coordinator = FileCoordinator()
    let url = URL(fileURLWithPath: item)
    let count = 500

    func microseconds(_ body: () async throws -> Void) async rethrows -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        try await body()
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1000
    }

    print("etcd space (one etcd member on loopback, the JSON gateway over one kept-open connection):")
    // Alternated, so that both share the machine's state; the best round's p50 of each.
    var claims: [Double] = [], transactions: [Double] = []
    for round in 0 ..< rounds {
        var ours: [Double] = [], theirs: [Double] = []
        for index in 0 ..< count {
            ours.append(try await microseconds { try await coordinator.coordinate(writingItemAt: url) { _ in } })
            theirs.append(try await microseconds {
                try await bare.put("bench-bare/\(round)-\(index)", "x")
                try await bare.delete("bench-bare/\(round)-\(index)")
            })
        }
        claims.append(percentile(ours, 0.5))
        transactions.append(percentile(theirs, 0.5))
        print(String(format: "  uncontended write claim p50 %6.0f us (p99 %6.0f)   bare put + delete p50 %6.0f us (p99 %6.0f)",
                     percentile(ours, 0.5), percentile(ours, 0.99), percentile(theirs, 0.5), percentile(theirs, 0.99)))
    }
    let claimRatio = claims.min()! / transactions.min()!
    print(String(format: "  uncontended claim: %.2fx the bare transaction   goal <= 1.5x: %@", claimRatio, claimRatio <= 1.5 ? "met" : "NOT MET"))

    // A presenter in another process ("host": its own root, the same directory here).
    let (child, childInput) = try startChild(["--etcd-child", address, root, item])
    let (echo, echoInput) = try startChild(["--etcd-echo", endpoint, "bench-echo"])
    defer {
        try? childInput.fileHandleForWriting.close()
        try? echoInput.fileHandleForWriting.close()
        child.waitUntilExit()
        echo.waitUntilExit()
    }
    final class Pongs: @unchecked Sendable {
        let lock = NSLock()
        var waiting: [String: CheckedContinuation<Void, Never>] = [:]
        var arrived: Set<String> = []
        func arrive(_ name: String) {
            lock.lock()
            let continuation = waiting.removeValue(forKey: name)
            if continuation == nil { arrived.insert(name) }
            lock.unlock()
            continuation?.resume()
        }
        func wait(_ name: String) async {
            await withCheckedContinuation { continuation in
                lock.lock()
                if arrived.remove(name) != nil {
                    lock.unlock()
                    continuation.resume()
                } else {
                    waiting[name] = continuation
                    lock.unlock()
                }
            }
        }
    }
    let pongs = Pongs()
    let start = try await bare.put("bench-echo/start", "1")
    let watch = bare.watchPuts("bench-echo/pong/", from: start + 1) { key, _ in
        pongs.arrive(String(key.split(separator: "/").last ?? ""))
    }
    defer { watch.cancel() }
    var acks: [Double] = [], trips: [Double] = []
    var sequence = 0
    for _ in 0 ..< rounds {
        var ours: [Double] = [], theirs: [Double] = []
        for _ in 0 ..< count / 2 {
            let began = DispatchTime.now().uptimeNanoseconds
            var granted: UInt64 = 0
            try await coordinator.coordinate(writingItemAt: url) { _ in granted = DispatchTime.now().uptimeNanoseconds }
            ours.append(Double(granted - began) / 1000)
            theirs.append(try await microseconds {
                for _ in 0 ..< 2 {
                    sequence += 1
                    try await bare.put("bench-echo/ping/\(sequence)", "x")
                    await pongs.wait("\(sequence)")
                }
            })
        }
        acks.append(percentile(ours, 0.5))
        trips.append(percentile(theirs, 0.5))
        print(String(format: "  write, presenter in another process: to the accessor p50 %6.0f us (p99 %6.0f)   two bare watch round trips p50 %6.0f us (p99 %6.0f)",
                     percentile(ours, 0.5), percentile(ours, 0.99), percentile(theirs, 0.5), percentile(theirs, 0.99)))
    }
    let ackRatio = acks.min()! / trips.min()!
    print(String(format: "  remote acknowledgement: %.2fx two bare watch round trips   goal <= 1.5x: %@", ackRatio, ackRatio <= 1.5 ? "met" : "NOT MET"))
}
