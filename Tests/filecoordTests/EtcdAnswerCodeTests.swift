import Foundation
import Testing
import TestSupport

/// etcd's errors told apart by the gateway's `code` (the gRPC status), not by words in
/// their messages: an expired token (16) is renewed, a member without a leader (14) is
/// passed over, anything else fails the call at once.
@Suite("etcd space: errors by their code")
struct EtcdAnswerCodeTests {
    /// `exec --write ITEM -- true` against `endpoint`: its status, stderr and how long it took.
    func exec(against endpoint: HostileEndpoint, environment: [String: String] = [:]) async throws
        -> (status: Int32, errors: String, took: Duration) {
        let item = Scratch().write("item", "x")
        let started = ContinuousClock.now
        let result = try await run(filecoordBinary, ["exec", "--space", "etcd://\(endpoint.endpoint)/codes", "--write", item, "--", "true"],
                                   environment: environment)
        return (result.status, result.errorText, ContinuousClock.now - started)
    }

    @Test("an error whose message speaks of the leader but whose code is not Unavailable fails the call at once", .timeLimit(.minutes(1)))
    func leaderInMessageIsNotRetried() async throws {
        let body = #"{"error":"etcdserver: requested lease not found on the leader","message":"etcdserver: requested lease not found on the leader","code":5}"#
        let endpoint = try HostileEndpoint { _, peer in peer.write(FakeEtcd.http(body, status: "404 Not Found")) }
        let run = try await exec(against: endpoint)
        endpoint.stop()
        #expect(run.status == 1 && run.errors.contains("requested lease not found"), "\(run.errors)")
        // Asked once, not again and again for the connect timeout (5 s).
        #expect(endpoint.requests == ["/v3/lease/grant"], "\(endpoint.requests)")
    }

    @Test("a token refused with code 16, whatever its message says: a new token, and the call again", .timeLimit(.minutes(1)))
    func unauthenticatedCodeRenewsToken() async throws {
        let etcd = FakeEtcd()
        let tokens = Counter()
        let endpoint = try HostileEndpoint { request, peer in
            if request.path == "/v3/auth/authenticate" {
                return peer.write(FakeEtcd.http(#"{"header":{},"token":"token\#(tokens.next())"}"#))
            }
            if request.headers["authorization"] == "token0" {
                let refused = #"{"error":"etcdserver: token has expired","message":"etcdserver: token has expired","code":16}"#
                return peer.write(FakeEtcd.http(refused, status: "401 Unauthorized"))
            }
            return etcd.serve(request, peer)
        }
        let run = try await exec(against: endpoint, environment: ["FILECOORD_ETCD_USER": "root", "FILECOORD_ETCD_PASSWORD": "secret"])
        endpoint.stop()
        #expect(run.status == 0, "\(run.errors)")
        #expect(endpoint.requests.prefix(3) == ["/v3/auth/authenticate", "/v3/lease/grant", "/v3/auth/authenticate"], "\(endpoint.requests)")
    }

    @Test("a waiting claim whose watch starts again after its token expired (etcd's token TTL 2 s, the watch quiet past four times a 1 s connect timeout): etcd cancels the watch, a new token is asked for, and the claim is granted after the release",
          .timeLimit(.minutes(2)))
    func watchRenewsExpiredToken() async throws {
        let server = try await EtcdServer(options: ["--auth-token-ttl", "2"])
        let unexpected = await server.enableAuthentication()
        #expect(unexpected.isEmpty, "\(unexpected)")
        let credentials = ["FILECOORD_ETCD_USER": "root", "FILECOORD_ETCD_PASSWORD": "secret"]
        let space = server.address("expiry")
        let item = Scratch().write("item", "x")
        let holder = try LineProcess(["exec", "--space", space, "--write", item, "--", "sh", "-c", "echo held; exec sleep 60"],
                                     environment: credentials)
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        let waiter = try LineProcess(["exec", "--space", space, "--timeout", "60", "--write", item, "--", "echo", "granted"],
                                     environment: credentials.merging(["FILECOORD_ETCD_TIMEOUT": "1"]) { $1 })
        // The waiter's token expires unused, and its quiet watch starts again after 4 s.
        try await Task.sleep(for: .seconds(7)) // ok: time for the token to expire and the watch to start again
        holder.signal(SIGTERM)
        _ = await holder.wait()
        var output = waiter.lines.makeAsyncIterator()
        let granted = await output.next()
        let (status, errors) = await waiter.wait()
        #expect(granted == "granted" && status == 0, "\(status): \(errors)")
        await server.stop()
    }
}

/// The etcd password stays with `filecoord`.
@Suite("etcd space: credentials")
struct EtcdCredentialTests {
    @Test("exec does not pass FILECOORD_ETCD_PASSWORD on to its command (the user, and the rest of the environment, it does)",
          .timeLimit(.minutes(1)))
    func passwordNotPassedOn() async throws {
        let etcd = FakeEtcd()
        let endpoint = try HostileEndpoint { request, peer in
            if request.path == "/v3/auth/authenticate" { return peer.write(FakeEtcd.http(#"{"header":{},"token":"t"}"#)) }
            return etcd.serve(request, peer)
        }
        let item = Scratch().write("item", "x")
        let result = try await run(filecoordBinary, ["exec", "--space", "etcd://\(endpoint.endpoint)/credentials", "--write", item, "--",
                                                     "sh", "-c", "echo \"[$FILECOORD_ETCD_PASSWORD] [$FILECOORD_ETCD_USER] [$OTHER]\""],
                                   environment: ["FILECOORD_ETCD_USER": "root", "FILECOORD_ETCD_PASSWORD": "s3cret", "OTHER": "kept"])
        endpoint.stop()
        #expect(result.status == 0, "\(result.errorText)")
        #expect(result.outputText == "[] [root] [kept]\n")
    }
}
