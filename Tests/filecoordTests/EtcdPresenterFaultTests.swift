import Foundation
import Testing
import TestSupport

/// Presenters of the etcd space under faults: a writer on another host that dies while
/// it waits for them.
@Suite("etcd space: presenters under faults", .serialized)
struct EtcdPresenterFaultTests {
    /// The presenter's next line; past `limit` the presenter is ended (SIGTERM ends its
    /// lines) and nil comes back.
    func nextLine(of presenter: LineProcess, _ lines: inout AsyncStream<String>.Iterator, within limit: Duration) async -> String? {
        let watchdog = Task {
            try await Task.sleep(for: limit) // ok: the bound of a hang
            presenter.signal(SIGTERM)
        }
        defer { watchdog.cancel() }
        return await lines.next()
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
}
