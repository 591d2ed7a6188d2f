import FileCoordination
import FileCoordinationEtcd
import Foundation
import Testing
import TestSupport

/// Many claims of one process waiting at once in an etcd space: what the process holds
/// meanwhile (threads, connections to etcd, memory), and how long after the release they
/// are all granted. `make test` runs 100; FILECOORD_ETCD_WAITERS=1000 gives the figures of
/// `docs/distributed.md`.
@Suite("etcd space: many waiting claims in one process")
struct EtcdManyWaitersTests {
    @Test("100 read claims of one process waiting behind another process's write: a few threads and connections, not one each; all granted after the release",
          .timeLimit(.minutes(5)))
    func manyWaiters() async throws {
        let count = ProcessInfo.processInfo.environment["FILECOORD_ETCD_WAITERS"].flatMap { Int($0) } ?? 100
        let server = try await EtcdServer()
        let item = Scratch().write("item", "x")
        let space = server.address("waiters")
        let holder = try LineProcess(["exec", "--space", space, "--write", item, "--", "sh", "-c", "echo held; exec sleep 300"])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        let worker = try LineProcess(["--testing-library", "swift-testing", "--filter", "EtcdWaitersWorker"], executable: binary,
                                     environment: [EtcdWaitersWorker.spaceVariable: space, EtcdWaitersWorker.itemVariable: item,
                                                   EtcdWaitersWorker.countVariable: "\(count)"])
        // Every claim waits once etcd lists it as waiting.
        var waiting = 0
        for _ in 0..<600 where waiting < count {
            let status = try await run(filecoordBinary, ["status", "--space", space, "--json"])
            let listed = (try? JSONSerialization.jsonObject(with: status.stdout)) as? [String: Any]
            waiting = (listed?["waiting"] as? [Any])?.count ?? 0
            if waiting < count { try await Task.sleep(for: .milliseconds(200)) } // ok: polling another process's state
        }
        #expect(waiting == count, "\(waiting) of \(count) claims waiting")
        let (threads, sockets, residentMiB) = Self.usage(of: worker.pid)
        let released = ContinuousClock.now
        holder.signal(SIGTERM)
        _ = await holder.wait()
        var output = worker.lines.makeAsyncIterator()
        var granted = false
        while let line = await output.next() {
            if line == "granted \(count)" {
                granted = true
                break
            }
        }
        let took = ContinuousClock.now - released
        let (status, errors) = await worker.wait()
        #expect(granted && status == 0, "\(status): \(errors.suffix(2000))")
        print("etcd waiters: \(count) waiting claims in one process: \(threads) threads, \(sockets) sockets, \(residentMiB) MiB resident; all granted \(took) after the release")
        // One watch stream for all the waits: the process's threads and connections do not
        // grow with them.
        #expect(threads > 0 && threads < 40, "\(threads) threads for \(count) waiting claims")
        #expect(sockets <= 6, "\(sockets) sockets for \(count) waiting claims")
        await server.stop()
    }

    /// A process's threads, sockets and resident memory (MiB), from `/proc`.
    static func usage(of pid: Int32) -> (threads: Int, sockets: Int, residentMiB: Int) {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        func field(_ name: String) -> Int {
            status.split(separator: "\n").first { $0.hasPrefix(name + ":") }?.split(whereSeparator: \.isWhitespace).compactMap { Int($0) }.first ?? -1
        }
        let sockets = openFiles(of: pid).filter { $0.hasPrefix("socket:") }.count
        return (field("Threads"), sockets, field("VmRSS") / 1024)
    }
}

/// The process of ``EtcdManyWaitersTests``: this test binary again, which joins the space
/// and starts that many read claims of the item at once; prints `granted N` when all ran.
@Suite struct EtcdWaitersWorker {
    static let spaceVariable = "FILECOORD_WAITERS_SPACE"
    static let itemVariable = "FILECOORD_WAITERS_ITEM"
    static let countVariable = "FILECOORD_WAITERS_COUNT"

    @Test func waiters() async throws {
        let environment = ProcessInfo.processInfo.environment
        guard let space = environment[Self.spaceVariable], let item = environment[Self.itemVariable],
              let count = environment[Self.countVariable].flatMap({ Int($0) }) else { return }
        _ = try await FileCoordinator.joinCoordinationSpace(try EtcdCoordinationSpace.Configuration(address: space))
        let coordinator = FileCoordinator()
        let url = URL(fileURLWithPath: item)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<count { group.addTask { try await coordinator.coordinate(readingItemAt: url) { _ in } } }
            try await group.waitForAll()
        }
        FileHandle.standardOutput.write(Data("granted \(count)\n".utf8))
    }
}
