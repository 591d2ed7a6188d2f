import FileCoordination
import FileCoordinationEtcd
import Foundation
import MetricsTestKit
import Testing
import TestSupport

/// The etcd space's metrics, counted into a factory of the test's own.
@Suite("etcd space: metrics")
struct EtcdMetricsTests {
    @Test("each call to etcd is timed by call; a lease lost when etcd stops answering is counted once",
          .timeLimit(.minutes(2)))
    func callsAndLostLease() async throws {
        let server = try await EtcdServer()
        let metrics = TestMetrics()
        // A TTL of 3 s: a loaded machine (the suites in parallel) can take over a second to
        // renew a lease, and 1 s lost it before the test began.
        let configuration = EtcdCoordinationSpace.Configuration(endpoints: [server.endpoint], prefix: "metrics",
                                                                leaseTTL: .seconds(3), connectTimeout: .seconds(1))
        let space = try await EtcdCoordinationSpace.join(configuration, metrics: EtcdMetrics(factory: metrics), hooks: CoordinationCenter.spaceHooks)
        func calls(_ call: String) -> [Int64] {
            metrics.timers(label: EtcdMetrics.callLabel, dimensions: [("call", call)]).flatMap(\.values)
        }
        func lost() -> Int64 { metrics.counterTotal(label: EtcdMetrics.lostLeasesLabel) }
        #expect(calls("lease/grant").count == 1)
        #expect(calls("kv/put").count >= 1, "the member's key")
        #expect(calls("lease/grant").allSatisfy { $0 > 0 })
        #expect(lost() == 0)

        await server.stop()
        // Lost after a TTL (3 s) without an answer; bounded at 30 s.
        let deadline = ContinuousClock.now + .seconds(30)
        while lost() == 0 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50)) // ok: polling the lease keeper's thread, bounded
        }
        #expect(lost() == 1)
        #expect(!calls("lease/keepalive").isEmpty, "the keep-alives that failed were timed too")
        await space.leave()
        #expect(lost() == 1, "leaving after the loss is not another loss")
    }

    @Test("a lease whose keep-alives none of five members answers is lost one TTL after its last renewal, not after a try on each member",
          .timeLimit(.minutes(1)))
    func keepAlivesUnansweredByEveryMember() async throws {
        let etcd = FakeEtcd()
        let members = try (0 ..< 5).map { _ in
            try HostileEndpoint { request, peer in
                switch request.path {
                case "/v3/lease/keepalive":
                    peer.waitForClose(seconds: 60) // never answered
                case "/v3/watch":
                    peer.write(FakeEtcd.streamHead)
                    peer.chunk(Array((etcd.created() + "\n").utf8))
                    peer.waitForClose(seconds: 60)
                default:
                    return etcd.serve(request, peer)
                }
                return false
            }
        }
        defer { for member in members { member.stop() } }
        let metrics = TestMetrics()
        let configuration = EtcdCoordinationSpace.Configuration(endpoints: members.map(\.endpoint), prefix: "keep",
                                                                leaseTTL: .seconds(3), connectTimeout: .seconds(1))
        let space = try await EtcdCoordinationSpace.join(configuration, metrics: EtcdMetrics(factory: metrics), hooks: CoordinationCenter.spaceHooks)
        let joined = ContinuousClock.now
        func lost() -> Int64 { metrics.counterTotal(label: EtcdMetrics.lostLeasesLabel) }
        while lost() == 0 && ContinuousClock.now - joined < .seconds(30) {
            try await Task.sleep(for: .milliseconds(20)) // ok: polling the lease keeper's thread, bounded
        }
        let took = ContinuousClock.now - joined
        #expect(lost() == 1)
        // The TTL is 3 s from the grant, sent before `join` returned; a third of it on each of
        // five silent members would be 5 s after the first keep-alive, at 1 s: 6 s. Halfway,
        // for a loaded machine's late wake-ups.
        #expect(took < .milliseconds(4500), "the lease was found lost \(took) after joining")
        await space.leave()
    }
}
