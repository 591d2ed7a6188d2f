import Foundation
import Synchronization
import Testing
import TestSupport

/// Presenters of the etcd space under faults: a writer on another host that dies while
/// it waits for them.
@Suite("etcd space: presenters under faults", .serialized)
struct EtcdPresenterFaultTests {
    /// The presenter's next line; past `limit` the presenter is ended (SIGTERM ends its
    /// lines), and what its leaving prints (the reacquirers it gives back) comes marked
    /// `late: `; nil once its lines end.
    func nextLine(of presenter: LineProcess, _ lines: inout AsyncStream<String>.Iterator, within limit: Duration) async -> String? {
        let ended = Mutex(false)
        let watchdog = Task {
            try await Task.sleep(for: limit) // ok: the bound of a hang
            ended.withLock { $0 = true }
            presenter.signal(SIGTERM)
        }
        defer { watchdog.cancel() }
        guard let line = await lines.next() else { return nil }
        return ended.withLock { $0 } ? "late: \(line)" : line
    }

    @Test("a writer on another host killed while the presenter is still relinquishing: once its lease ends the presenter gets its item back, is not asked to save, and hears changes again",
          .timeLimit(.minutes(1)))
    func writerDeathDuringRelinquish() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("dying-writer")
        try writeFixture(Data("v0".utf8), toPath: volume.shared.path + "/doc")
        let doc = volume.roots[0] + "/doc"
        // The relinquish takes 6 s to answer: the writer's lease (2 s) ends in the middle of it.
        let presenter = try LineProcess(["present", "--space", space, "--root", volume.roots[0], "--ack-delay", "6s", doc])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready \(doc)")
        let writer = try LineProcess(["exec", "--space", space, "--root", volume.roots[1], "--lease-ttl", "2",
                                      "--write", volume.roots[1] + "/doc", "--", "true"])
        let asked = await nextLine(of: presenter, &lines, within: .seconds(20))
        #expect(asked == "relinquishToWriter \(doc)")
        writer.signal(SIGKILL)
        _ = await writer.wait()
        // Its reacquirer runs once the relinquish is done, the asker being gone (and the
        // save the request asked for is not made: nobody is going to write).
        let givenBack = await nextLine(of: presenter, &lines, within: .seconds(20))
        #expect(givenBack == "reacquire \(doc)")
        // Not coordinated: heard through the presenter's watch, which suppresses nothing
        // once the item is given back.
        try await offThePool { try Data("changed outside".utf8).write(to: URL(fileURLWithPath: doc), options: .atomic) }
        let heard = await nextLine(of: presenter, &lines, within: .seconds(20))
        #expect(heard == "didChange \(doc)")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
        await server.stop()
    }

    @Test("a presenter whose etcd stream goes down (its host cut off past the connect timeout, within its lease) answers the writer that asked it meanwhile once the host is back",
          .timeLimit(.minutes(1)))
    func presenterHearsAfterOutage() async throws {
        try await writeDuringOutage(compacting: false)
    }

    @Test("a presenter whose etcd stream was down while a writer asked it, and etcd compacted past that request: once back, the presenter reads its mail again and answers",
          .timeLimit(.minutes(1)))
    func presenterReadsMailAfterCompaction() async throws {
        try await writeDuringOutage(compacting: true)
    }

    /// A writer on another host asks the presenter while the presenter's host is cut off;
    /// when `compacting`, etcd compacts its history past the request before the host is back.
    func writeDuringOutage(compacting: Bool) async throws {
        var fixture = try await OutageFixture(nextLine: nextLine)
        try await fixture.cutUntilDown()
        let started = ContinuousClock.now
        let (space, root) = (fixture.server.address("outage"), fixture.volume.roots[1])
        let writing = Task {
            try await run(filecoordBinary, ["write", "--space", space, "--root", root, "--presenter-timeout", "25", root + "/doc"],
                          stdin: Data("v1".utf8))
        }
        if compacting {
            #expect(try await fixture.waitForKeys("outage/mail/", count: 1), "the writer's request never reached the presenter's mailbox")
            try await fixture.compact()
        }
        try await fixture.network.restore()
        let writer = try await writing.value
        let took = ContinuousClock.now - started
        #expect(writer.status == 0, "\(writer.errorText)")
        #expect(took < .seconds(25), "the presenter was not heard from: the writer waited its whole presenter timeout (\(took))")
        let doc = fixture.doc
        #expect(await fixture.events(4) == ["relinquishToWriter \(doc)", "save \(doc)", "didChange \(doc)", "reacquire \(doc)"])
        await fixture.end()
    }

    @Test("a writer on another host killed while a presenter's etcd stream is down, etcd compacting past its lease's end: once back, the presenter gets its item back",
          .timeLimit(.minutes(1)))
    func presenterGetsItemBackAfterCompaction() async throws {
        var fixture = try await OutageFixture(nextLine: nextLine)
        let doc = fixture.doc
        let writer = try LineProcess(["exec", "--space", fixture.server.address("outage"), "--root", fixture.volume.roots[1], "--lease-ttl", "2",
                                      "--write", fixture.volume.roots[1] + "/doc", "--", "sh", "-c", "echo held $$; exec sleep 50"])
        var held = writer.lines.makeAsyncIterator()
        // The command (its shell, then `sleep`), which outlives the writer killed.
        let command = try #require(await held.next()?.split(separator: " ").last.flatMap { Int32($0) })
        defer { kill(command, SIGKILL) }
        #expect(await fixture.events(2) == ["relinquishToWriter \(doc)", "save \(doc)"])
        try await fixture.cutUntilDown()
        writer.signal(SIGKILL)
        try await writer.waitUntilEnded()
        // Its lease ends (2 s), and its member key with it: only the presenter is left.
        #expect(try await fixture.waitForKeys("outage/members/", count: 1), "the killed writer's member key did not go")
        try await fixture.compact()
        try await fixture.network.restore()
        #expect(await fixture.events(1) == ["reacquire \(doc)"])
        await fixture.end()
    }

    @Test("a presenter whose host is cut off from etcd past its lease's TTL: once back, it joins again with a new lease, publishes its presenter again, and is asked by the next writer",
          .timeLimit(.minutes(1)))
    func presenterRejoinsAfterLostLease() async throws {
        var fixture = try await OutageFixture(leaseTTL: 2, nextLine: nextLine)
        let doc = fixture.doc
        #expect(try await fixture.waitForKeys("outage/presenters/", count: 1), "the presenter was not published")
        try await fixture.network.cut()
        let lost = await fixture.presenter.waitForLines(within: .seconds(20)) { $0.contains("lease of this process is lost") }
        #expect(lost, "the presenter did not report its lease lost")
        #expect(try await fixture.waitForKeys("outage/presenters/", count: 0), "the lost lease's presenter key did not go")
        try await fixture.network.restore()
        #expect(try await fixture.waitForKeys("outage/presenters/", count: 1), "the presenter was not published again")
        let writer = try await run(filecoordBinary, ["write", "--space", fixture.server.address("outage"), "--root", fixture.volume.roots[1],
                                                     "--presenter-timeout", "25", fixture.volume.roots[1] + "/doc"], stdin: Data("v1".utf8))
        #expect(writer.status == 0, "\(writer.errorText)")
        #expect(await fixture.events(4) == ["relinquishToWriter \(doc)", "save \(doc)", "didChange \(doc)", "reacquire \(doc)"])
        await fixture.end()
    }
}

/// A presenter (`filecoord present`) on a host of its own network, which reaches etcd
/// through one link that the test cuts and restores, and a shared volume with a second
/// host for writers. The space is `outage`.
struct OutageFixture {
    let network: NetworkHost
    let server: EtcdServer
    let volume: SharedVolume
    let presenter: LineProcess
    /// The presented item, by the presenter's host's path.
    let doc: String
    private var lines: AsyncStream<String>.Iterator
    private let nextLine: @Sendable (LineProcess, inout AsyncStream<String>.Iterator, Duration) async -> String?

    /// `leaseTTL`: the presenter's, in seconds.
    init(leaseTTL: Int = 30, nextLine: @escaping @Sendable (LineProcess, inout AsyncStream<String>.Iterator, Duration) async -> String?) async throws {
        network = try await NetworkHost()
        do {
            server = try await EtcdServer(alsoListeningOn: network.outside)
        } catch {
            await network.remove()
            throw error
        }
        volume = try SharedVolume(hosts: 2)
        try writeFixture(Data("v0".utf8), toPath: volume.shared.path + "/doc")
        doc = volume.roots[0] + "/doc"
        // Its warnings come with its lines (the outage is one of them). Connect timeout
        // 0.5 s: a silent stream is given up after 2 s, and the outage declared 0.5 s later.
        let command = "exec \"$0\" present --space etcd://\(network.outside):\(server.clientPort)/outage --root \(volume.roots[0]) --lease-ttl \(leaseTTL) \(doc) 2>&1"
        presenter = try LineProcess(network.command(["/bin/sh", "-c", command, filecoordBinary]), executable: "/usr/sbin/ip",
                                    environment: ["FILECOORD_ETCD_TIMEOUT": "0.5"])
        var iterator = presenter.lines.makeAsyncIterator()
        let ready = await nextLine(presenter, &iterator, .seconds(20))
        lines = iterator
        self.nextLine = nextLine
        #expect(ready == "ready \(doc)")
    }

    /// Cuts the presenter's host off, and waits until it reports its stream down.
    func cutUntilDown() async throws {
        try await network.cut()
        let down = await presenter.waitForLines(within: .seconds(20)) { $0.contains("etcd mail failed") }
        #expect(down, "the presenter did not report its stream down")
    }

    /// The presenter's next `count` event lines (its warnings left out), each within 20 s.
    mutating func events(_ count: Int) async -> [String] {
        var events: [String] = []
        while events.count < count, let line = await nextLine(presenter, &lines, .seconds(20)) {
            if !line.contains("etcd") && !line.contains("lease") { events.append(line) }
        }
        return events
    }

    /// Waits, up to 20 s, until etcd holds `count` keys under `prefix`.
    func waitForKeys(_ prefix: String, count: Int) async throws -> Bool {
        try await waitForEtcdKeys(server, prefix, count: count)
    }

    /// One more revision, and etcd's history compacted up to it.
    func compact() async throws {
        try await compactEtcd(server)
    }

    func end() async {
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
        volume.unmount()
        await network.remove()
        await server.stop()
    }
}
