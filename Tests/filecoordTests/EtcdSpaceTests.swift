import Foundation
import Testing
import TestSupport

/// Coordination across hosts through a real etcd: each "host" is a set of processes
/// naming the shared volume by a root of its own (a bind mount), all in one etcd space.
@Suite("etcd space across hosts", .serialized)
struct EtcdSpaceTests {
    /// `filecoord` in an etcd space: `--space` and `--root` before the subcommand's own arguments.
    func filecoordIn(_ space: String, root: String?, _ arguments: [String], environment: [String: String] = [:]) async throws -> ProcessResult {
        let subcommand = arguments.first!
        var all = [subcommand, "--space", space]
        if let root { all += ["--root", root] }
        all += arguments.dropFirst()
        return try await run(filecoordBinary, all, environment: environment)
    }

    @Test("3 hosts x 4 processes x 50 read-modify-write increments of one counter: none lost",
          .timeLimit(.minutes(3)))
    func counterAcrossHosts() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 3)
        defer { volume.unmount() }
        let space = server.address("counter")
        try writeFixture(Data("0\n".utf8), toPath: volume.shared.path + "/counter")
        let increments = 50
        try await withThrowingTaskGroup(of: ProcessResult.self) { group in
            for root in volume.roots {
                for _ in 0..<4 {
                    // Each process reads the counter through its own host's root.
                    let script = """
                        for i in $(seq \(increments)); do
                          "$FILECOORD" exec --space "\(space)" --root "\(root)" --write "\(root)/counter" -- \
                            sh -c 'n=$(cat "\(root)/counter"); echo $((n+1)) > "\(root)/counter"' || exit 1
                        done
                        """
                    group.addTask { try await shell(script) }
                }
            }
            for try await result in group {
                #expect(result.status == 0, "\(result.errorText)")
            }
        }
        let final = try String(contentsOfFile: volume.shared.path + "/counter", encoding: .utf8)
        #expect(final == "\(3 * 4 * increments)\n")
        await server.stop()
    }

    @Test("a claim holder killed with SIGKILL: a waiter on another host proceeds within the lease TTL plus 1 s",
          .timeLimit(.minutes(2)))
    func killedHolderLetsGoWithinTTL() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("killed")
        try writeFixture(Data("x".utf8), toPath: volume.shared.path + "/item")
        let holder = try LineProcess(["exec", "--space", space, "--root", volume.roots[0], "--lease-ttl", "2",
                                      "--write", volume.roots[0] + "/item", "--", "sh", "-c", "echo $$; exec sleep 60"])
        var lines = holder.lines.makeAsyncIterator()
        let child = try #require(await lines.next().flatMap { Int32($0) }, "the holder's command did not start")
        let killed = ContinuousClock.now
        holder.signal(SIGKILL)
        kill(child, SIGKILL)
        _ = await holder.wait()
        let waiter = try await filecoordIn(space, root: volume.roots[1], ["exec", "--write", volume.roots[1] + "/item", "--", "true"])
        let waited = ContinuousClock.now - killed
        #expect(waiter.status == 0, "\(waiter.errorText)")
        #expect(waited <= .seconds(3), "the waiter proceeded \(waited) after the holder died (TTL 2 s)")
        await server.stop()
    }

    @Test("a claim waiting while etcd compacts its history past the claim's quiet watch: the watch starts again, the claims are read again, and the holder's release grants it",
          .timeLimit(.minutes(1)))
    func waitOutlivesCompaction() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("compacted")
        try writeFixture(Data("x".utf8), toPath: volume.shared.path + "/item")
        let scratch = Scratch()
        let fifo = scratch.path + "/release"
        #expect(mkfifo(fifo, 0o600) == 0)
        let holder = try LineProcess(["exec", "--space", space, "--root", volume.roots[0], "--write", volume.roots[0] + "/item", "--",
                                      "sh", "-c", "echo held; exec timeout 60 sh -c 'read x < \"$0\"' \"$0\"", fifo])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        let waiting = Task {
            try await filecoordIn(space, root: volume.roots[1], ["exec", "--write", volume.roots[1] + "/item", "--", "true"],
                                  environment: ["FILECOORD_ETCD_TIMEOUT": "1"])
        }
        #expect(try await waitForEtcdKeys(server, "compacted/claims/", count: 2), "the second claim never waited")
        try await compactEtcd(server)
        // The waiter's stream, quiet, starts again after four times the connect timeout
        // (1 s), from a revision etcd no longer has.
        try await Task.sleep(for: .seconds(6)) // ok: the stream's idle limit passes
        _ = try await run("/bin/sh", ["-c", "echo go > '\(fifo)'"])
        let waiter = try await waiting.value
        #expect(waiter.status == 0, "\(waiter.errorText)")
        _ = await holder.wait()
        await server.stop()
    }

    @Test("a claim held on another host: -n fails at once and --timeout 1 after a second, exit 3, as locally",
          .timeLimit(.minutes(1)))
    func claimTimeoutAcrossHosts() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("timeout")
        try writeFixture(Data("x".utf8), toPath: volume.shared.path + "/item")
        let holder = try LineProcess(["exec", "--space", space, "--root", volume.roots[0], "--write", volume.roots[0] + "/item",
                                      "--", "sh", "-c", "echo held; exec sleep 60"])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        // Well before the holder lets go (60 s). Not tighter: with the whole suite beside it
        // on two cores, etcd has taken 5 s (the connect timeout) to answer each of the
        // release and the lease's revoke at exit.
        for (option, bound) in [(["-n"], Duration.seconds(20)), (["--timeout", "1"], Duration.seconds(20))] {
            let started = ContinuousClock.now
            let waiter = try await filecoordIn(space, root: volume.roots[1], ["exec"] + option + ["--write", volume.roots[1] + "/item", "--", "true"])
            let took = ContinuousClock.now - started
            #expect(waiter.status == 3, "\(option): \(waiter.errorText)")
            #expect(took < bound, "\(option) took \(took)")
        }
        holder.signal(SIGTERM)
        _ = await holder.wait()
        await server.stop()
    }

    @Test("etcd unreachable at start: one clear line naming the endpoints, exit 1, within the connect timeout",
          .timeLimit(.minutes(1)))
    func unreachableAtStart() async throws {
        let port = try freePort()
        let scratch = Scratch()
        let item = scratch.write("item", "x")
        let started = ContinuousClock.now
        let result = try await filecoordIn("etcd://127.0.0.1:\(port)/x", root: nil, ["exec", "--write", item, "--", "true"],
                                           environment: ["FILECOORD_ETCD_TIMEOUT": "2"])
        let took = ContinuousClock.now - started
        #expect(result.status == 1)
        let lines = result.errorText.split(separator: "\n")
        #expect(lines.count == 1, "\(result.errorText)")
        #expect(result.errorText.contains("127.0.0.1:\(port)"), "\(result.errorText)")
        // The connect timeout, 2 s here; the process's own start and exit on top (which
        // the whole suite beside it on two cores has made 4 s).
        #expect(took < .seconds(7), "it took \(took)")
    }

    @Test("a path outside the root is refused with a clear error", .timeLimit(.minutes(1)))
    func outsideRootIsRefused() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 1)
        defer { volume.unmount() }
        let elsewhere = Scratch().write("elsewhere", "x")
        let result = try await filecoordIn(server.address("outside"), root: volume.roots[0], ["exec", "--write", elsewhere, "--", "true"])
        #expect(result.status == 1)
        #expect(result.errorText.contains(elsewhere) && result.errorText.contains("outside the coordination space's root"),
                "\(result.errorText)")
        await server.stop()
    }

    @Test("status lists the claims of every host, by this host's paths, with host and pid", .timeLimit(.minutes(1)))
    func statusListsEveryHost() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("status")
        try writeFixture(Data("x".utf8), toPath: volume.shared.path + "/item")
        let holder = try LineProcess(["exec", "--space", space, "--root", volume.roots[0], "--write", volume.roots[0] + "/item",
                                      "--", "sh", "-c", "echo held; exec sleep 60"])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        let status = try await filecoordIn(space, root: volume.roots[1], ["status", "--json"])
        #expect(status.status == 0, "\(status.errorText)")
        let host = ProcessInfo.processInfo.hostName
        #expect(status.outputText.contains("\"path\":\"\(volume.roots[1])/item\""), "\(status.outputText)")
        #expect(status.outputText.contains("\"pid\":\(holder.pid)") && status.outputText.contains("\"host\":\"\(host)\""),
                "\(status.outputText)")
        holder.signal(SIGTERM)
        _ = await holder.wait()
        await server.stop()
    }

    @Test("a writer on host B waits for a presenter on host A that takes 300 ms to acknowledge; the events come in Apple's order",
          .timeLimit(.minutes(1)))
    func presenterOnAnotherHost() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("presenters")
        try writeFixture(Data("v0".utf8), toPath: volume.shared.path + "/doc")
        let presenter = try LineProcess(["present", "--space", space, "--root", volume.roots[0], "--ack-delay", "300ms",
                                         "--count", "4", volume.roots[0] + "/doc"])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready \(volume.roots[0])/doc")
        let started = ContinuousClock.now
        let writer = try await run(filecoordBinary, ["write", "--space", space, "--root", volume.roots[1], volume.roots[1] + "/doc"],
                                   stdin: Data("v1".utf8))
        let took = ContinuousClock.now - started
        #expect(writer.status == 0, "\(writer.errorText)")
        #expect(took >= .milliseconds(300), "the write did not wait for the acknowledgement: \(took)")
        var events: [String] = []
        while let line = await lines.next() { events.append(line) }
        let doc = volume.roots[0] + "/doc"
        #expect(events == ["relinquishToWriter \(doc)", "save \(doc)", "didChange \(doc)", "reacquire \(doc)"])
        #expect(await presenter.wait().status == 0)
        await server.stop()
    }

    @Test("a presenter on host A refuses writers: the write on host B fails with the presenter's refusal, exit 1, and the file is unchanged",
          .timeLimit(.minutes(1)))
    func refusalAcrossHosts() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("refusal")
        try writeFixture(Data("v0".utf8), toPath: volume.shared.path + "/doc")
        let presenter = try LineProcess(["present", "--space", space, "--root", volume.roots[0], "--refuse-writers",
                                         volume.roots[0] + "/doc"])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready \(volume.roots[0])/doc")
        let writer = try await run(filecoordBinary, ["write", "--space", space, "--root", volume.roots[1], volume.roots[1] + "/doc"],
                                   stdin: Data("v1".utf8))
        #expect(writer.status == 1)
        #expect(writer.errorText.contains("refused"), "\(writer.errorText)")
        #expect(try String(contentsOfFile: volume.shared.path + "/doc", encoding: .utf8) == "v0")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
        await server.stop()
    }

    @Test("a holder stopped past its lease TTL: another host proceeds; resumed, its coordination fails with the fencing error, and its late write carries the lower token",
          .timeLimit(.minutes(1)))
    func stoppedHolderIsFenced() async throws {
        let server = try await EtcdServer()
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        let space = server.address("fenced")
        let log = volume.shared.path + "/log"
        try writeFixture(Data(), toPath: log)
        // The command ignores SIGTERM (what exec passes on when its claims are lost), so
        // that its write comes late, as a process's that is not told would.
        let a = volume.roots[0] + "/log"
        let holder = try LineProcess(["exec", "--space", space, "--root", volume.roots[0], "--lease-ttl", "2", "--write", a, "--",
                                      "sh", "-c", "trap '' TERM; echo token $FILECOORD_FENCING_TOKEN; sleep 5; echo \"late $FILECOORD_FENCING_TOKEN\" >> \(a)"])
        var lines = holder.lines.makeAsyncIterator()
        let first = try #require(await lines.next())
        #expect(first.hasPrefix("token "), "\(first)")
        holder.signal(SIGSTOP)
        let stopped = ContinuousClock.now
        let b = volume.roots[1] + "/log"
        let fresh = try await run(filecoordBinary, ["exec", "--space", space, "--root", volume.roots[1], "--write", b, "--",
                                                    "sh", "-c", "echo \"fresh $FILECOORD_FENCING_TOKEN\" >> \(b)"])
        let waited = ContinuousClock.now - stopped
        #expect(fresh.status == 0, "\(fresh.errorText)")
        #expect(waited <= .seconds(3), "the other host proceeded \(waited) after the holder stopped (TTL 2 s)")
        holder.signal(SIGCONT)
        let (status, errors) = await holder.wait()
        #expect(status == 1, "\(errors)")
        #expect(errors.contains("lease was lost") || errors.contains("stopped holding"), "\(errors)")
        // A store that keeps the highest token it accepted refuses the late write.
        let entries = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map { $0.split(separator: " ") }
        #expect(entries.map { $0.first.map(String.init) ?? "" } == ["fresh", "late"], "\(entries)")
        let tokens = entries.compactMap { $0.last.flatMap { Int64($0) } }
        #expect(tokens.count == 2 && tokens[1] < tokens[0], "\(entries)")
        await server.stop()
    }

    @Test("a host cut off from etcd (its veth link down) while it holds a claim: the other host proceeds within the TTL plus 1 s; the cut-off holder's command is told and its coordination fails with the fencing error",
          .timeLimit(.minutes(1)))
    func partitionedHolderIsFenced() async throws {
        let network = try await NetworkHost()
        let server: EtcdServer
        do {
            server = try await EtcdServer(alsoListeningOn: network.outside)
        } catch {
            await network.remove()
            throw error
        }
        let volume = try SharedVolume(hosts: 2)
        defer { volume.unmount() }
        try writeFixture(Data(), toPath: volume.shared.path + "/log")
        let a = volume.roots[0] + "/log"
        // The holder, in the other network, reaches etcd through the link only.
        let holder = try LineProcess(network.command([filecoordBinary, "exec", "--space", "etcd://\(network.outside):\(server.clientPort)/cut",
                                                      "--root", volume.roots[0], "--lease-ttl", "2", "--write", a, "--",
                                                      "sh", "-c", "trap 'echo told' TERM; echo held; sleep 5; echo late >> \(a)"]),
                                     executable: "/usr/sbin/ip")
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        try await network.cut()
        let cut = ContinuousClock.now
        let b = volume.roots[1] + "/log"
        let fresh = try await run(filecoordBinary, ["exec", "--space", server.address("cut"), "--root", volume.roots[1], "--write", b, "--",
                                                    "sh", "-c", "echo fresh >> \(b)"])
        let waited = ContinuousClock.now - cut
        #expect(fresh.status == 0, "\(fresh.errorText)")
        #expect(waited <= .seconds(3), "the other host proceeded \(waited) after the cut (TTL 2 s)")
        #expect(await lines.next() == "told", "the cut-off holder's command was not sent SIGTERM")
        let (status, errors) = await holder.wait()
        #expect(status == 1, "\(errors)")
        #expect(errors.contains("lease was lost") || errors.contains("stopped holding"), "\(errors)")
        await network.remove()
        await server.stop()
    }

    @Test("TLS with client certificates: a claim and status work; without the client certificate, or trusting another CA, one line naming the endpoint and the cause, exit 1",
          .timeLimit(.minutes(1)))
    func tlsWithClientCertificates() async throws {
        let certificates = try await TestCertificates()
        let server = try await EtcdServer(tls: certificates)
        let scratch = Scratch()
        let item = scratch.write("item", "x")
        let space = "etcds://\(server.endpoint)/tls"
        let tls = ["--etcd-cacert", certificates.ca, "--etcd-cert", certificates.clientCertificate, "--etcd-key", certificates.clientKey]
        let claimed = try await run(filecoordBinary, ["exec", "--space", space] + tls + ["--write", item, "--", "true"])
        #expect(claimed.status == 0, "\(claimed.errorText)")
        let listed = try await run(filecoordBinary, ["status", "--space", space] + tls)
        #expect(listed.status == 0 && listed.outputText.contains("no claims"), "\(listed.errorText)")
        // etcd checks clients: without a certificate it refuses the handshake.
        let anonymous = try await run(filecoordBinary, ["exec", "--space", space, "--etcd-cacert", certificates.ca, "--write", item, "--", "true"])
        #expect(anonymous.status == 1)
        #expect(anonymous.errorText.split(separator: "\n").count == 1 && anonymous.errorText.contains(server.endpoint), "\(anonymous.errorText)")
        // The system's CAs do not know this one.
        let untrusted = try await run(filecoordBinary, ["exec", "--space", space, "--etcd-cert", certificates.clientCertificate,
                                                        "--etcd-key", certificates.clientKey, "--write", item, "--", "true"])
        #expect(untrusted.status == 1)
        #expect(untrusted.errorText.contains("certificate"), "\(untrusted.errorText)")
        await server.stop()
    }

    @Test("etcd with authentication on: the credentials from the environment work; a wrong password is one line, exit 1",
          .timeLimit(.minutes(2)))
    func authentication() async throws {
        let server = try await EtcdServer()
        let unexpected = await server.enableAuthentication()
        #expect(unexpected.isEmpty, "\(unexpected)")
        let scratch = Scratch()
        let item = scratch.write("item", "x")
        let arguments = ["exec", "--space", server.address("auth"), "--write", item, "--", "true"]
        // etcd checks a password with bcrypt: on a loaded machine an answer can take more
        // than the default 5 s, and the test is about the answer.
        let patient = ["FILECOORD_ETCD_TIMEOUT": "30"]
        let anonymous = try await run(filecoordBinary, arguments, environment: patient)
        #expect(anonymous.status == 1, "\(anonymous.errorText)")
        let allowed = try await run(filecoordBinary, arguments, environment: patient.merging(["FILECOORD_ETCD_USER": "root", "FILECOORD_ETCD_PASSWORD": "secret"]) { $1 })
        #expect(allowed.status == 0, "\(allowed.errorText)")
        let refused = try await run(filecoordBinary, arguments, environment: patient.merging(["FILECOORD_ETCD_USER": "root", "FILECOORD_ETCD_PASSWORD": "wrong"]) { $1 })
        #expect(refused.status == 1)
        #expect(refused.errorText.split(separator: "\n").count == 1 && refused.errorText.contains("authentication failed"),
                "\(refused.errorText)")
        await server.stop()
    }

    @Test("a 3-member etcd cluster whose leader is killed during the increments: the run finishes after the election, nothing lost",
          .timeLimit(.minutes(3)))
    func leaderKilledDuringIncrements() async throws {
        let names = ["m0", "m1", "m2"]
        let ports = try freePorts(2 * names.count)
        let (peers, clients) = (Array(ports.prefix(names.count)), Array(ports.suffix(names.count)))
        let cluster = zip(names, peers).map { "\($0)=http://127.0.0.1:\($1)" }.joined(separator: ",")
        // A member serves clients once the cluster has a quorum: all three start together.
        let members = try await withThrowingTaskGroup(of: EtcdServer.self) { group in
            for index in names.indices {
                group.addTask {
                    try await EtcdServer(name: names[index], clientPort: clients[index], peerPort: peers[index], cluster: cluster)
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let volume = try SharedVolume(hosts: 3)
        defer { volume.unmount() }
        let space = "etcd://" + clients.map { "127.0.0.1:\($0)" }.joined(separator: ",") + "/election"
        try writeFixture(Data("0\n".utf8), toPath: volume.shared.path + "/counter")
        let increments = 25
        // A lease of 10 s: an election on a loaded machine (the rest of `make test` beside
        // it) has taken longer than the default 5 s, and this test is about what an
        // election does, not about how long a lease is.
        func script(_ root: String, signalAt mark: Int?) -> String {
            """
            i=0; while [ $i -lt \(increments) ]; do
              "$FILECOORD" exec --space "\(space)" --root "\(root)" --lease-ttl 10 --write "\(root)/counter" -- \
                sh -c 'n=$(cat "\(root)/counter"); echo $((n+1)) > "\(root)/counter"' || exit 1
              i=$((i+1)); \(mark.map { "if [ $i -eq \($0) ]; then echo marked; fi" } ?? "true")
            done
            """
        }
        // One process says when it is under way; the leader dies then.
        let marked = try LineProcess(["-c", script(volume.roots[0], signalAt: 5)], executable: "/bin/sh",
                                     environment: ["FILECOORD": filecoordBinary])
        let others = Task {
            try await withThrowingTaskGroup(of: ProcessResult.self) { group in
                for (index, root) in volume.roots.enumerated() {
                    for _ in 0..<(index == 0 ? 1 : 2) { group.addTask { try await shell(script(root, signalAt: nil)) } }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
        }
        var lines = marked.lines.makeAsyncIterator()
        #expect(await lines.next() == "marked")
        let leader = try #require(await Self.leader(of: members), "no member says it leads")
        leader.process.signal(SIGKILL)
        let (status, errors) = await marked.wait()
        #expect(status == 0, "\(errors)")
        for result in try await others.value { #expect(result.status == 0, "\(result.errorText)") }
        let final = try String(contentsOfFile: volume.shared.path + "/counter", encoding: .utf8)
        #expect(final == "\(6 * increments)\n")
        for member in members { await member.stop() }
    }

    /// The member that leads, as the members' status says.
    static func leader(of members: [EtcdServer]) async -> EtcdServer? {
        for member in members {
            struct Status: Decodable { struct Header: Decodable { var member_id: String }; var header: Header; var leader: String }
            guard let status = try? JSONDecoder().decode(Status.self, from: await post(member, "/v3/maintenance/status", "{}")) else { continue }
            if status.leader == status.header.member_id { return member }
        }
        return nil
    }
}

/// One POST to a member's JSON gateway, on a thread of its own: the body of the answer.
/// Waits, up to 20 s, until `member` holds `count` keys under `prefix`.
func waitForEtcdKeys(_ member: EtcdServer, _ prefix: String, count: Int) async throws -> Bool {
    var end = Array(prefix.utf8)
    end[end.count - 1] += 1
    let range = #"{"key":"\#(Data(prefix.utf8).base64EncodedString())","range_end":"\#(Data(end).base64EncodedString())","count_only":true}"#
    for _ in 0 ..< 2_000 {
        let answer = try JSONSerialization.jsonObject(with: await post(member, "/v3/kv/range", range)) as? [String: Any]
        if Int(answer?["count"] as? String ?? "0") == count { return true }
        try await Task.sleep(for: .milliseconds(10)) // ok: polling etcd's keys, bounded
    }
    return false
}

/// Two more revisions (a key outside every space, put twice), and `member`'s history
/// compacted up to the last: a stream that had seen every revision before them resumes
/// from one etcd no longer has.
func compactEtcd(_ member: EtcdServer) async throws {
    _ = await post(member, "/v3/kv/put", #"{"key":"\#(Data("elsewhere".utf8).base64EncodedString())","value":""}"#)
    let put = await post(member, "/v3/kv/put", #"{"key":"\#(Data("elsewhere".utf8).base64EncodedString())","value":""}"#)
    let answer = try #require(try JSONSerialization.jsonObject(with: put) as? [String: Any])
    let revision = try #require((answer["header"] as? [String: Any])?["revision"] as? String)
    let compacted = String(decoding: await post(member, "/v3/kv/compaction", #"{"revision":"\#(revision)","physical":true}"#), as: UTF8.self)
    #expect(compacted.contains("header"), "\(compacted)")
}

func post(_ member: EtcdServer, _ path: String, _ body: String) async -> Data {
    let request = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
    return await withCheckedContinuation { continuation in
        Thread {
            let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            defer { close(socket) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(member.clientPort).bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            guard connected else { return continuation.resume(returning: Data()) }
            _ = request.withCString { send(socket, $0, strlen($0), 0) }
            var answer = Data()
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = recv(socket, &buffer, buffer.count, 0)
                if count <= 0 { break }
                answer.append(contentsOf: buffer[..<count])
            }
            // The body follows the blank line (the gateway answers with Content-Length).
            if let end = answer.range(of: Data("\r\n\r\n".utf8)) { answer = answer[end.upperBound...] }
            continuation.resume(returning: Data(answer))
        }.start()
    }
}
