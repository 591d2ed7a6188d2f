import Foundation
import Testing
import TestSupport

/// A claim that waits (a claim of another process stands before it) while the watch that
/// should tell it of the release is broken on the way: chunks cut and joined by a proxy,
/// a message that cannot be decoded, a member that stops answering mid-watch. The wait
/// ends with the grant in bounded time, or the claim timeout says it did not.
@Suite("etcd space: a hostile endpoint under a watch")
struct EtcdHostileWatchTests {
    /// An endpoint that answers as etcd, blocks the first claim behind another process's,
    /// and streams the process's watch (one, on the whole space) as `script` says, given
    /// the number of the watch request, from 0.
    func endpoint(_ etcd: FakeEtcd, script: @escaping @Sendable (Int, HostileEndpoint.Peer) -> Void) throws -> HostileEndpoint {
        let watches = Counter()
        return try HostileEndpoint { request, peer in
            guard request.path == "/v3/watch" else { return etcd.serve(request, peer) }
            peer.write(FakeEtcd.streamHead)
            let number = watches.next()
            // The stream starts when the process joins; the script is about the claim's wait.
            peer.chunk(Array((etcd.created() + "\n").utf8))
            etcd.waitForBlockedClaim()
            script(number, peer)
            peer.waitForClose(seconds: 60)
            return false
        }
    }

    /// `exec --timeout 15 --write ITEM -- true`: its status and stderr, and how long it took.
    func exec(against endpoint: HostileEndpoint, environment: [String: String] = [:]) async throws
        -> (status: Int32, errors: String, took: Duration) {
        let scratch = Scratch()
        let item = scratch.write("item", "x")
        let started = ContinuousClock.now
        let result = try await run(filecoordBinary, ["exec", "--space", "etcd://\(endpoint.endpoint)/watch", "--timeout", "15",
                                                     "--write", item, "--", "true"], environment: environment)
        return (result.status, result.errorText, ContinuousClock.now - started)
    }

    @Test("messages cut across chunks and joined in one (a proxy's doing): the release is seen, the claim granted",
          .timeLimit(.minutes(1)))
    func chunksSplitAndJoined() async throws {
        let etcd = FakeEtcd(blockFirstClaim: true)
        let endpoint = try endpoint(etcd) { _, peer in
            let progress = Array(#"{"result":{"header":{"revision":"1"}}}"#.utf8) + [10]
            let deleted = Array((etcd.blockerDeleted() + "\n").utf8)
            // A message and half of the next in one chunk, the rest a byte a chunk.
            let half = deleted.count / 2
            peer.chunk(progress + deleted[..<half])
            for byte in deleted[half...] { peer.chunk([byte]) }
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 0, "\(run.errors)")
        #expect(run.took < .seconds(10), "it took \(run.took)")
    }

    @Test("a progress message whose revision is out of range (Int64.max, which has no next; a negative one) is refused as malformed: the watch resumes and the release is seen",
          .timeLimit(.minutes(1)), arguments: [#"{"result":{"header":{"revision":"9223372036854775807"}}}"#,
                                               #"{"result":{"header":{"revision":"-5"}}}"#])
    func revisionOutOfRange(_ message: String) async throws {
        let etcd = FakeEtcd(blockFirstClaim: true)
        let endpoint = try endpoint(etcd) { number, peer in
            peer.chunk(number == 0 ? Array(message.utf8) + [10] : Array((etcd.blockerDeleted() + "\n").utf8))
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 0, "\(run.errors)")
        #expect(run.took < .seconds(10), "it took \(run.took)")
    }

    @Test("a message that cannot be decoded (while the stream stays busy): the watch resumes from the last revision seen and the release is seen",
          .timeLimit(.minutes(1)))
    func undecodableMessageResumes() async throws {
        let etcd = FakeEtcd(blockFirstClaim: true)
        let endpoint = try endpoint(etcd) { number, peer in
            if number == 0 {
                // The release, mangled; then messages that carry nothing, so that the
                // stream never goes quiet.
                peer.chunk(Array(#"{"result":{"events":[{"type":"DELETE","kv":{"key":#"#.utf8) + [0xff, 0xfe] + Array("\n".utf8))
                let idle = Array(#"{"result":{"header":{"revision":"1"}}}"#.utf8) + [10]
                for _ in 0..<150 {
                    Thread.sleep(forTimeInterval: 0.2) // ok: a stream that keeps talking
                    guard peer.chunk(idle) else { return }
                }
            } else {
                peer.chunk(Array((etcd.blockerDeleted() + "\n").utf8))
            }
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 0, "\(run.errors)")
        #expect(run.took < .seconds(10), "it took \(run.took)")
    }

    @Test("every watch is created, then sends a message that cannot be decoded: an outage after the retry limit (the connect timeout, 1 s here), and the waiting claim fails with a line naming the endpoint, well before its own timeout",
          .timeLimit(.minutes(1)))
    func createdThenBrokenEveryTime() async throws {
        let etcd = FakeEtcd(blockFirstClaim: true)
        let endpoint = try endpoint(etcd) { _, peer in
            peer.chunk(Array(#"{"result":{"events":[{"type":"DELETE","kv":{"key":#"#.utf8) + [0xff, 0xfe] + Array("\n".utf8))
        }
        let run = try await exec(against: endpoint, environment: ["FILECOORD_ETCD_TIMEOUT": "1"])
        endpoint.stop()
        #expect(run.status == 1, "\(run.status): \(run.errors)")
        #expect(run.errors.contains(endpoint.endpoint), "\(run.errors)")
        // The claim timeout (15 s) is the bound that says "for ever".
        #expect(run.took < .seconds(12), "it took \(run.took)")
    }

    @Test("a member that stops answering mid-watch: noticed within four times the connect timeout (1 s here), the watch resumes and the release is seen",
          .timeLimit(.minutes(1)))
    func silentMemberMidWatch() async throws {
        let etcd = FakeEtcd(blockFirstClaim: true)
        let endpoint = try endpoint(etcd) { number, peer in
            // The first watch hears nothing more; the next one hears the release.
            if number > 0 { peer.chunk(Array((etcd.blockerDeleted() + "\n").utf8)) }
        }
        let run = try await exec(against: endpoint, environment: ["FILECOORD_ETCD_TIMEOUT": "1"])
        endpoint.stop()
        #expect(run.status == 0, "\(run.errors)")
        // 4 s of silence, then a new watch; the claim timeout (15 s) is the bound that says "for ever".
        #expect(run.took < .seconds(14), "it took \(run.took)")
    }
}

/// A counter shared by a server's threads.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    /// The current value.
    var value: Int { lock.withLock { count } }

    /// The value, then one more.
    func next() -> Int {
        lock.withLock {
            defer { count += 1 }
            return count
        }
    }
}
