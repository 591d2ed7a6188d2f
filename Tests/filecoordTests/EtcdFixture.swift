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

    var endpoint: String { "127.0.0.1:\(clientPort)" }
    /// A space address on this server, under `prefix`.
    func address(_ prefix: String) -> String { "etcd://\(endpoint)/\(prefix)" }

    /// Starts a single-member server, or member `name` of `cluster` (`NAME=http://127.0.0.1:PEER,...`),
    /// and returns once it serves clients (its log says so).
    init(name: String = "solo", clientPort: Int? = nil, peerPort: Int? = nil, cluster: String? = nil) async throws {
        self.name = name
        self.clientPort = try clientPort ?? freePort()
        self.peerPort = try peerPort ?? freePort()
        scratch = Scratch()
        let arguments = [
            "--name", name, "--data-dir", scratch.path + "/data",
            "--listen-client-urls", "http://127.0.0.1:\(self.clientPort)",
            "--advertise-client-urls", "http://127.0.0.1:\(self.clientPort)",
            "--listen-peer-urls", "http://127.0.0.1:\(self.peerPort)",
            "--initial-advertise-peer-urls", "http://127.0.0.1:\(self.peerPort)",
            "--initial-cluster", cluster ?? "\(name)=http://127.0.0.1:\(self.peerPort)",
            "--initial-cluster-state", "new", "--initial-cluster-token", "filecoord-test",
            "--logger", "zap", "--log-outputs", "stdout",
        ]
        process = try LineProcess(arguments, executable: Self.binary)
        // Its log's line once the client port serves (zap's wording in etcd 3.4).
        for await line in process.lines where line.contains("serving client traffic") { return }
        let (status, errors) = await process.wait()
        throw EtcdServerFailed(description: "etcd exited (\(status)) before serving: \(errors.suffix(400))")
    }

    struct EtcdServerFailed: Error, CustomStringConvertible { var description: String }

    static let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"].first { FileManager.default.isExecutableFile(atPath: $0) } ?? "etcd"

    /// Stops the server and waits for it.
    func stop() async {
        process.signal(SIGKILL)
        _ = await process.wait()
    }
}

/// A TCP port on loopback that nothing listens on now (the kernel's choice).
func freePort() throws -> Int {
    let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(socket) }
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
