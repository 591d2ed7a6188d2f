import Foundation
import Testing
import TestSupport

/// `filecoord exec` against an etcd endpoint that answers as an attacker on the path (or a
/// broken proxy) would: every run ends with one clear line and exit 1, or succeeds, in
/// bounded time and memory; none dies of a signal.
@Suite("etcd space: a hostile endpoint")
struct EtcdHostileTests {
    /// `exec --write ITEM -- true` in the endpoint's space: its status, stderr and the most
    /// memory it held (resident, MiB). (Bounds are on what the endpoint could send, not on
    /// the wall clock, which a loaded machine stretches.)
    func exec(against endpoint: HostileEndpoint, environment: [String: String] = [:]) async throws
        -> (status: Int32, errors: String, peakMiB: Int) {
        let scratch = Scratch()
        let item = scratch.write("item", "x")
        let process = try LineProcess(["exec", "--space", "etcd://\(endpoint.endpoint)/hostile", "--write", item, "--", "true"],
                                      environment: environment)
        let memory = PeakMemory(of: process.pid)
        let (status, errors) = await process.wait()
        return (status, errors, memory.stop())
    }

    @Test("a negative size (a chunk of size -1, a Content-Length of -5): one line naming the endpoint, exit 1, no crash",
          .timeLimit(.minutes(1)))
    func negativeSizes() async throws {
        let answers = [
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nxx\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nxx\r\n0\r\n\r\n",
        ]
        for answer in answers {
            let endpoint = try HostileEndpoint { _, peer in
                peer.write(answer)
                peer.waitForClose(seconds: 10)
                return false
            }
            let run = try await exec(against: endpoint)
            endpoint.stop()
            #expect(run.status == 1, "\(answer.debugDescription): \(run.status) \(run.errors)")
            #expect(run.errors.split(separator: "\n").count == 1 && run.errors.contains(endpoint.endpoint),
                    "\(answer.debugDescription): \(run.errors)")
        }
    }

    @Test("a Content-Length of 99999999999 then bytes for 20 s: refused at once, in bounded memory, exit 1",
          .timeLimit(.minutes(1)))
    func hugeDeclaredLength() async throws {
        let sent = Counter()
        let endpoint = try HostileEndpoint { _, peer in
            peer.write("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n")
            let filler = [UInt8](repeating: UInt8(ascii: "a"), count: 65_536)
            let end = Date(timeIntervalSinceNow: 20)
            while end.timeIntervalSinceNow > 0, peer.write(filler) { _ = sent.next() }
            return false
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 1, "\(run.errors)")
        #expect(run.errors.contains("larger than"), "\(run.errors)")
        // Refused once the head was read: what the server got into the socket before the
        // client closed it (kernel buffers), not 20 s of bytes.
        #expect(sent.value < 64 * 16, "the client took \(sent.value * 64) KiB")
        #expect(run.peakMiB < 128, "it held \(run.peakMiB) MiB")
    }

    @Test("an endless chunked answer: it stops at the answer limit, in bounded memory, exit 1", .timeLimit(.minutes(1)))
    func endlessChunkedAnswer() async throws {
        let sent = Counter()
        let endpoint = try HostileEndpoint { _, peer in
            peer.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            let filler = [UInt8](repeating: UInt8(ascii: "a"), count: 65_536)
            let end = Date(timeIntervalSinceNow: 20)
            while end.timeIntervalSinceNow > 0, peer.chunk(filler) { _ = sent.next() }
            return false
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 1, "\(run.errors)")
        #expect(run.errors.contains("larger than"), "\(run.errors)")
        // The answer limit (16 MiB) and kernel buffers, not 20 s of bytes.
        #expect(sent.value < 64 * 16, "the client took \(sent.value * 64) KiB")
        #expect(run.peakMiB < 128, "it held \(run.peakMiB) MiB")
    }

    @Test("an endless head (header lines, never a blank one): refused past the head limit, in bounded memory, exit 1",
          .timeLimit(.minutes(1)))
    func endlessHead() async throws {
        let sent = Counter()
        let endpoint = try HostileEndpoint { _, peer in
            peer.write("HTTP/1.1 200 OK\r\n")
            let line = Array(("X-Filler: " + String(repeating: "a", count: 1000) + "\r\n").utf8)
            let lines = Array([[UInt8]](repeating: line, count: 64).joined())
            let end = Date(timeIntervalSinceNow: 20)
            while end.timeIntervalSinceNow > 0, peer.write(lines) { _ = sent.next() }
            return false
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 1, "\(run.errors)")
        #expect(run.errors.contains("larger than"), "\(run.errors)")
        // The head limit (64 KiB) and kernel buffers, not 20 s of headers.
        #expect(sent.value < 1024, "the client took \(sent.value * 64) KiB")
        #expect(run.peakMiB < 128, "it held \(run.peakMiB) MiB")
    }

    @Test("headers trickled one every 0.5 s: the call fails within its deadline (the connect timeout, 2 s here), exit 1",
          .timeLimit(.minutes(1)))
    func trickledHead() async throws {
        let written = Counter()
        let endpoint = try HostileEndpoint { _, peer in
            peer.write("HTTP/1.1 200 OK\r\n")
            for index in 0..<60 {
                Thread.sleep(forTimeInterval: 0.5) // ok: the trickle is the test's subject
                guard peer.write("X-Slow-\(index): a\r\n") else { break }
                _ = written.next()
            }
            return false
        }
        let run = try await exec(against: endpoint, environment: ["FILECOORD_ETCD_TIMEOUT": "2"])
        endpoint.stop()
        #expect(run.status == 1, "\(run.errors)")
        #expect(run.errors.split(separator: "\n").count == 1 && run.errors.contains(endpoint.endpoint), "\(run.errors)")
        // Some 4 lines in the 2 s (and one more, written before the close is seen), not
        // the 60 of 30 s.
        #expect(written.value < 12, "the client waited for \(written.value) lines")
    }

    @Test("endless interim answers (100 Continue), or endless trailers after the last chunk, sent as fast as the client reads: refused, exit 1",
          .timeLimit(.minutes(1)), arguments: [false, true])
    func endlessInterimsOrTrailers(trailers: Bool) async throws {
        let sent = Counter()
        let endpoint = try HostileEndpoint { _, peer in
            let unit = trailers ? "X-Trailer: a\r\n" : "HTTP/1.1 100 Continue\r\n\r\n"
            let block = Array(String(repeating: unit, count: 65_536 / unit.utf8.count).utf8)
            if trailers { peer.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n") }
            let end = Date(timeIntervalSinceNow: 20)
            while end.timeIntervalSinceNow > 0, peer.write(block) { _ = sent.next() }
            return false
        }
        let run = try await exec(against: endpoint, environment: ["FILECOORD_ETCD_TIMEOUT": "2"])
        endpoint.stop()
        #expect(run.status == 1, "\(run.errors)")
        #expect(run.errors.split(separator: "\n").count == 1 && run.errors.contains(endpoint.endpoint), "\(run.errors)")
        // Refused past the head limit (64 KiB) and kernel buffers, not 20 s of bytes.
        #expect(sent.value < 64 * 16, "the client took \(sent.value * 64) KiB")
        #expect(run.peakMiB < 128, "it held \(run.peakMiB) MiB")
    }

    @Test("bytes after each answer (a forged second answer): never read as the next call's answer; the run succeeds",
          .timeLimit(.minutes(1)))
    func bytesAfterTheAnswer() async throws {
        let etcd = FakeEtcd()
        let endpoint = try HostileEndpoint { request, peer in
            guard let body = etcd.answer(request) else { return false }
            return peer.write(FakeEtcd.http(body) + FakeEtcd.http("{}"))
        }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 0, "\(run.errors)")
    }
}

/// The most resident memory a process held, sampled every 10 ms from `/proc` on a thread
/// of its own until ``stop()``.
final class PeakMemory: @unchecked Sendable {
    private let lock = NSLock()
    private var peak = 0
    private var done = false
    private let ended = DispatchSemaphore(value: 0)

    init(of pid: Int32) {
        Thread.detachNewThread { [self] in
            while !lock.withLock({ done }) {
                if let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
                   let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
                   let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) }) {
                    lock.withLock { peak = max(peak, kilobytes / 1024) }
                }
                usleep(10_000) // ok: a sampling period
            }
            ended.signal()
        }
    }

    /// Stops sampling; the peak in MiB.
    func stop() -> Int {
        lock.withLock { done = true }
        ended.wait()
        return lock.withLock { peak }
    }
}
