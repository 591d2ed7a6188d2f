import Foundation
import Testing
import TestSupport

/// A member cut off from the majority of its cluster keeps serving the clients that reach
/// it, with no leader: a watch on it hears nothing more (etcd-io/etcd#10819).
@Suite("etcd space: a member cut off from the majority")
struct EtcdLeaderlessTests {
    @Test("a claim waiting through a member that a partition cuts off from its peers: the watch moves to another member and the claim is granted after the release",
          .timeLimit(.minutes(2)))
    func waitMovesOffLeaderlessMember() async throws {
        // Link 0 carries the members' peer traffic, link 1 the clients' traffic to m2:
        // cutting link 0 leaves m2 alone, and still reachable.
        let network = try await NetworkHost(links: 2)
        let ports = try freePorts(6)
        let (peerOut, peerIn) = (network.outsides[0], network.insides[0])
        let cluster = "m0=http://\(peerOut):\(ports[0]),m1=http://\(peerOut):\(ports[1]),m2=http://\(peerIn):\(ports[2])"
        let members: [EtcdServer]
        do {
            members = try await withThrowingTaskGroup(of: EtcdServer.self) { group in
                group.addTask { try await EtcdServer(name: "m0", clientPort: ports[3], peerPort: ports[0], cluster: cluster, peerHost: peerOut) }
                group.addTask { try await EtcdServer(name: "m1", clientPort: ports[4], peerPort: ports[1], cluster: cluster, peerHost: peerOut) }
                group.addTask {
                    try await EtcdServer(name: "m2", clientPort: ports[5], peerPort: ports[2], cluster: cluster,
                                         clientHost: network.insides[1], peerHost: peerIn, network: network)
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
        } catch {
            await network.remove()
            throw error
        }
        let cut = members.first { $0.name == "m2" }!
        let majority = members.filter { $0.name != "m2" }.map(\.endpoint)
        let scratch = Scratch()
        let item = scratch.write("item", "x")
        let holder = try LineProcess(["exec", "--space", "etcd://\(majority[0])/leaderless", "--write", item, "--",
                                      "sh", "-c", "echo held; exec sleep 60"])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        // The waiter asks m2 first: its claim's transaction and its watch go there.
        let waiter = try LineProcess(["exec", "--space", "etcd://\(([cut.endpoint] + majority).joined(separator: ","))/leaderless",
                                      "--timeout", "60", "--write", item, "--", "echo", "granted"])
        var waiting = false
        for _ in 0..<200 where !waiting {
            let status = try await run(filecoordBinary, ["status", "--space", "etcd://\(majority[0])/leaderless", "--json"])
            waiting = status.outputText.contains("\"waiting\":[{")
            if !waiting { try await Task.sleep(for: .milliseconds(50)) } // ok: polling another process's state
        }
        #expect(waiting, "the waiter's claim never showed as waiting")
        try await network.cut(0)
        holder.signal(SIGTERM)
        _ = await holder.wait()
        let released = ContinuousClock.now
        var output = waiter.lines.makeAsyncIterator()
        let granted = await output.next()
        let took = ContinuousClock.now - released
        let (status, errors) = await waiter.wait()
        #expect(granted == "granted" && status == 0, "\(status): \(errors)")
        // Three election timeouts (1 s each) for m2 to end the watch, then a new one on m0.
        #expect(took < .seconds(10), "the waiter was granted \(took) after the release")
        for member in members { await member.stop() }
        await network.remove()
    }
}
