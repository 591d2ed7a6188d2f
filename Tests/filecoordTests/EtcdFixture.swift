import Foundation
import Testing

/// A real etcd server (Debian's `etcd-server`) on loopback ports the kernel chose free,
/// with its data in a scratch directory; stopped and removed by ``stop()``.
final class EtcdServer: Sendable {
    let clientPort: Int
    let peerPort: Int
    let name: String
    let process: LineProcess
    let scratch: Scratch

    /// The address it serves clients at, and the one its peers reach it at.
    let clientHost: String
    var endpoint: String { "\(clientHost):\(clientPort)" }
    /// A space address on this server, under `prefix`.
    func address(_ prefix: String) -> String { "etcd://\(endpoint)/\(prefix)" }

    /// Starts a single-member server, or member `name` of `cluster` (`NAME=http://127.0.0.1:PEER,...`),
    /// and returns once it serves clients (its log says so). Ports chosen here are chosen
    /// again when another process took one first (a port is free when chosen, and the
    /// suites start servers in parallel).
    ///
    /// `clientHost` and `peerHost` are the addresses it listens at (loopback unless given);
    /// `network`, a network namespace it runs in; `options`, more of etcd's options.
    init(name: String = "solo", clientPort: Int? = nil, peerPort: Int? = nil, cluster: String? = nil,
         alsoListeningOn extra: String? = nil, tls: TestCertificates? = nil,
         clientHost: String = "127.0.0.1", peerHost: String = "127.0.0.1", network: NetworkHost? = nil,
         options: [String] = []) async throws {
        self.name = name
        self.clientHost = clientHost
        var attempt = 0
        while true {
            attempt += 1
            let chosen = try freePorts(3)
            let client = clientPort ?? chosen[0]
            // (A port given may be one just chosen: closed once chosen, it is free again.)
            let peer = peerPort ?? (chosen[1] == client ? chosen[2] : chosen[1])
            let ports = (client: client, peer: peer)
            // Its data in memory (tmpfs): etcd syncs every write to disk, and the counters make
            // thousands of writes while other suites use the same disk. What it keeps is thrown
            // away after the test in any case.
            let scratch = Scratch(in: FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm" : NSTemporaryDirectory())
            let process = try Self.start(name: name, ports: ports, hosts: (clientHost, peerHost), cluster: cluster, extra: extra, tls: tls,
                                         network: network, options: options, dataDirectory: scratch.path + "/data")
            var log: [String] = []
            var portTaken = false
            for await line in process.lines {
                if line.contains("serving client traffic") {
                    (self.clientPort, self.peerPort, self.process, self.scratch) = (ports.client, ports.peer, process, scratch)
                    return
                }
                portTaken = portTaken || line.contains("address already in use")
                log = Array((log + [line]).suffix(5))
            }
            let (status, errors) = await process.wait()
            portTaken = portTaken || errors.contains("address already in use")
            if portTaken, clientPort == nil, peerPort == nil, cluster == nil, attempt < 3 { continue }
            throw EtcdServerFailed(description: "etcd exited (\(status)) before serving: \(errors.suffix(400)) \(log.joined(separator: " | ").suffix(800))")
        }
    }

    private static func start(name: String, ports: (client: Int, peer: Int), hosts: (client: String, peer: String), cluster: String?,
                              extra: String?, tls: TestCertificates?, network: NetworkHost?, options: [String],
                              dataDirectory: String) throws -> LineProcess {
        let scheme = tls == nil ? "http" : "https"
        var arguments = [
            "--name", name, "--data-dir", dataDirectory,
            "--listen-client-urls", "\(scheme)://\(hosts.client):\(ports.client)" + (extra.map { ",\(scheme)://\($0):\(ports.client)" } ?? ""),
            "--advertise-client-urls", "\(scheme)://\(hosts.client):\(ports.client)",
            "--listen-peer-urls", "http://\(hosts.peer):\(ports.peer)",
            "--initial-advertise-peer-urls", "http://\(hosts.peer):\(ports.peer)",
            "--initial-cluster", cluster ?? "\(name)=http://\(hosts.peer):\(ports.peer)",
            "--initial-cluster-state", "new", "--initial-cluster-token", "filecoord-test",
            "--logger", "zap", "--log-outputs", "stdout",
            // The least bcrypt cost: the authentication test adds a user and checks its
            // password, and the default (10) costs 64 times the CPU on a loaded machine.
            "--bcrypt-cost", "4",
        ]
        if let tls {
            arguments += ["--cert-file", tls.serverCertificate, "--key-file", tls.serverKey,
                          "--trusted-ca-file", tls.ca, "--client-cert-auth"]
        }
        arguments += options
        if let network { return try LineProcess(network.command([binary] + arguments), executable: "/usr/sbin/ip") }
        return try LineProcess(arguments, executable: binary)
    }

    struct EtcdServerFailed: Error, CustomStringConvertible { var description: String }

    static let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"].first { FileManager.default.isExecutableFile(atPath: $0) } ?? "etcd"

    /// Stops the server and waits for it.
    func stop() async {
        process.signal(SIGKILL)
        _ = await process.wait()
    }

    /// Adds user `root` with password `secret` and turns authentication on; the answers
    /// that were not as expected, if any.
    func enableAuthentication() async -> [String] {
        var unexpected: [String] = []
        for (path, body) in [("/v3/auth/user/add", #"{"name":"root","password":"secret"}"#),
                             ("/v3/auth/user/grant", #"{"user":"root","role":"root"}"#),
                             ("/v3/auth/enable", "{}")] {
            // On a loaded machine etcd can answer "request timed out" (its limit is 7 s) and
            // still apply the request later: ask again, and take as done "already exists"
            // (a user added) and "user name is empty" (authentication enabled, so a request
            // without a user is refused; granting twice is no error).
            let done = ["already exists", "user name is empty"]
            var answer = "", retried = false
            for attempt in 1...4 {
                answer = String(decoding: await post(self, path, body), as: UTF8.self)
                retried = attempt > 1
                if answer.contains("header") || (retried && done.contains { answer.contains($0) }) { break }
                guard answer.contains("request timed out") else { break }
            }
            if !(answer.contains("header") || (retried && done.contains { answer.contains($0) })) { unexpected.append("\(path): \(answer)") }
        }
        return unexpected
    }
}

/// TCP ports on loopback that nothing listens on now (the kernel's choice), `count`
/// different ones: each stays bound until all are chosen. The sockets are close-on-exec,
/// as every descriptor a test opens must be: the suites run in parallel, and a descriptor
/// open when another test starts a process would be inherited by it (the
/// descriptor-exhaustion tests count every one).
func freePorts(_ count: Int) throws -> [Int] {
    var sockets: [Int32] = []
    defer { sockets.forEach { close($0) } }
    return try (0 ..< count).map { _ in
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard socket >= 0 else { throw POSIXError(.EMFILE) }
        sockets.append(socket)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socket, $0, length) == 0 && getsockname(socket, $0, &length) == 0 }
        }
        guard bound else { throw POSIXError(.EADDRINUSE) }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}

/// One such port.
func freePort() throws -> Int {
    try freePorts(1)[0]
}

/// Hosts sharing one volume, on one machine: a shared directory bind-mounted at a root of
/// each host's own, so that each names the same files by other paths.
final class SharedVolume: Sendable {
    let shared: Scratch
    let roots: [String]

    init(hosts: Int) throws {
        shared = Scratch()
        let base = Scratch()
        var roots: [String] = []
        for index in 0..<hosts {
            let root = base.path + "/host\(index)"
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            let mounted = try Process.run(URL(fileURLWithPath: "/bin/mount"), arguments: ["--bind", shared.path, root])
            mounted.waitUntilExit()
            guard mounted.terminationStatus == 0 else { throw POSIXError(.EPERM) }
            roots.append(root)
        }
        self.roots = roots
        rootsBase = base
    }
    private let rootsBase: Scratch

    /// Unmounts the roots.
    func unmount() {
        for root in roots {
            let process = try? Process.run(URL(fileURLWithPath: "/bin/umount"), arguments: ["-l", root])
            process?.waitUntilExit()
        }
    }
}

/// A host with a network of its own: a network namespace joined to this one by veth
/// links (`ip`, from iproute2), each with addresses on a /30 of its own. Made and removed
/// by the test; ``cut(_:)`` takes a link down, a partition.
final class NetworkHost: Sendable {
    let name: String
    /// Each link's address on this side (where a server for the host listens), and the host's.
    let outsides: [String]
    let insides: [String]
    private let links: [String]
    /// The first link's addresses.
    var outside: String { outsides[0] }
    var inside: String { insides[0] }

    init(links count: Int = 1) async throws {
        let tag = String(UInt32.random(in: 0 ..< .max), radix: 16)
        name = "fc-\(tag)"
        let first = Int.random(in: 1 ..< 250 - count)
        var script = "set -e\nip netns add \(name)\nip netns exec \(name) ip link set lo up\n"
        var (outsides, insides, links) = ([String](), [String](), [String]())
        for index in 0..<count {
            let link = "fch\(tag.prefix(7))\(index)"
            let peer = "fcn\(tag.prefix(7))\(index)"
            let (outside, inside) = ("10.213.\(first + index).1", "10.213.\(first + index).2")
            script += """
                ip link add \(link) type veth peer name \(peer)
                ip link set \(peer) netns \(name)
                ip addr add \(outside)/30 dev \(link)
                ip link set \(link) up
                ip netns exec \(name) ip addr add \(inside)/30 dev \(peer)
                ip netns exec \(name) ip link set \(peer) up

                """
            outsides.append(outside)
            insides.append(inside)
            links.append(link)
        }
        (self.outsides, self.insides, self.links) = (outsides, insides, links)
        let made = try await run("/bin/sh", ["-c", script])
        guard made.status == 0 else {
            await remove()
            throw NetworkHostFailed(description: "cannot make a network namespace: \(made.errorText)")
        }
    }

    struct NetworkHostFailed: Error, CustomStringConvertible { var description: String }

    /// `arguments` as a command run in the host's network.
    func command(_ arguments: [String]) -> [String] { ["netns", "exec", name] + arguments }

    /// Takes link `index` down: the host can no longer reach this side through it.
    func cut(_ index: Int = 0) async throws {
        _ = try await run("/usr/sbin/ip", ["link", "set", links[index], "down"])
    }

    /// Takes link `index` up again: the partition ends.
    func restore(_ index: Int = 0) async throws {
        _ = try await run("/usr/sbin/ip", ["link", "set", links[index], "up"])
    }

    /// Removes the namespace (and with it the links).
    func remove() async {
        _ = try? await run("/usr/sbin/ip", ["netns", "del", name])
        for link in links { _ = try? await run("/usr/sbin/ip", ["link", "del", link]) }
    }
}

/// A CA, a server certificate (for 127.0.0.1 unless `serverNames` says otherwise, valid
/// for a day, or expired since yesterday when `expired`) and a client certificate, made by
/// `openssl` in a scratch directory for one test; also an RSA key that matches none of them.
struct TestCertificates: Sendable {
    let directory: Scratch
    var ca: String { directory.path + "/ca.crt" }
    var serverCertificate: String { directory.path + "/server.crt" }
    var serverKey: String { directory.path + "/server.key" }
    var clientCertificate: String { directory.path + "/client.crt" }
    var clientKey: String { directory.path + "/client.key" }
    var unrelatedKey: String { directory.path + "/unrelated.key" }

    init(serverNames: String = "IP:127.0.0.1", expired: Bool = false) async throws {
        directory = Scratch()
        let script = """
            set -e
            cd '\(directory.path)'
            key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
            key ca.key
            openssl req -x509 -new -key ca.key -out ca.crt -subj /CN=filecoord-test-ca -days 1
            for who in server client; do
              key $who.key
              openssl req -new -key $who.key -out $who.csr -subj /CN=$who
            done
            openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out unrelated.key 2>/dev/null
            # etcd's gateway calls its own gRPC server with the server's certificate, which
            # --client-cert-auth then checks as a client's.
            printf 'subjectAltName=\(serverNames)\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
            printf 'extendedKeyUsage=clientAuth\n' > client.ext
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days \(expired ? -1 : 1) -extfile server.ext 2>/dev/null
            openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1 -extfile client.ext 2>/dev/null
            """
        let made = try await run("/bin/sh", ["-c", script])
        guard made.status == 0 else { throw CertificatesFailed(description: "openssl: \(made.errorText)") }
    }

    struct CertificatesFailed: Error, CustomStringConvertible { var description: String }
}
