import FileCoordination
import SystemPackage

extension EtcdCoordinationSpace {
    /// Where the space is and how this process takes part in it.
    public struct Configuration: Sendable {
        /// etcd's client endpoints, `HOST:PORT` each.
        public var endpoints: [String]
        /// The key prefix that holds the space (several spaces can share one etcd).
        public var prefix: String
        /// The local path of the shared volume's root: items are named relative to it,
        /// and paths outside it cannot be coordinated in this space.
        public var root: FilePath
        /// How long the space keeps this process's claims after it stops answering.
        public var leaseTTL: Duration
        /// How long a call waits for an etcd member (joining, and through a failover).
        public var connectTimeout: Duration
        /// etcd credentials, when its authentication is on.
        public var user: String?
        /// The password for ``user``.
        public var password: String?
        /// TLS to etcd, when its client port serves TLS; nil for plain HTTP.
        public var tls: TLS?
        /// The largest answer, and the largest watch message, accepted from etcd (bytes;
        /// at least 64 KiB). A range over a space with tens of thousands of claims or
        /// presenters can need more than the default 16 MiB.
        public var maxAnswerBytes: Int

        /// TLS settings: the CA that signed the members' certificates (nil: the system's
        /// CAs), and this client's certificate and key when etcd checks clients
        /// (`--client-cert-auth`). PEM files. OpenSSL (`libssl3`) is loaded when the space
        /// is joined, not before.
        public struct TLS: Sendable {
            /// The CA bundle to trust; nil for the system's.
            public var caFile: FilePath?
            /// This client's certificate (chain), when etcd asks for one.
            public var certificateFile: FilePath?
            /// The certificate's private key.
            public var keyFile: FilePath?

            /// TLS settings.
            public init(caFile: FilePath? = nil, certificateFile: FilePath? = nil, keyFile: FilePath? = nil) {
                self.caFile = caFile
                self.certificateFile = certificateFile
                self.keyFile = keyFile
            }
        }

        /// A configuration; `leaseTTL` is rounded up to whole seconds (etcd's unit).
        public init(endpoints: [String], prefix: String = "filecoord", root: FilePath = "/",
                    leaseTTL: Duration = .seconds(5), connectTimeout: Duration = .seconds(5),
                    user: String? = nil, password: String? = nil, tls: TLS? = nil, maxAnswerBytes: Int = 16 << 20) {
            self.endpoints = endpoints
            self.prefix = prefix
            self.root = root
            self.leaseTTL = leaseTTL
            self.connectTimeout = connectTimeout
            self.user = user
            self.password = password
            self.tls = tls
            self.maxAnswerBytes = maxAnswerBytes
        }

        /// Parses a space address `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`; `etcds://` is
        /// the same over TLS, trusting the system's CAs (``tls`` chooses others).
        ///
        /// - Throws: `FileCoordinationError` with code `.invalidArgument` naming what is wrong.
        public init(address: String, root: FilePath = "/") throws {
            func invalid(_ why: String) -> FileCoordinationError {
                FileCoordinationError(.join, code: .invalidArgument, path: nil, message: "\(address): \(why); the form is etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS)")
            }
            let secure = address.hasPrefix("etcds://")
            guard address.hasPrefix("etcd://") || secure else { throw invalid("not an etcd address") }
            let rest = address.dropFirst(secure ? "etcds://".count : "etcd://".count)
            let slash = rest.firstIndex(of: "/") ?? rest.endIndex
            let hosts = rest[..<slash].split(separator: ",")
            guard !hosts.isEmpty else { throw invalid("no endpoint") }
            for host in hosts where EtcdEndpoint(host) == nil { throw invalid("'\(host)' is not HOST:PORT") }
            let prefix = slash < rest.endIndex ? rest[rest.index(after: slash)...] : ""
            self.init(endpoints: hosts.map(String.init), prefix: prefix.isEmpty ? "filecoord" : String(prefix), root: root,
                      tls: secure ? TLS() : nil)
        }

        /// `address` with what the environment sets: `FILECOORD_ROOT`; `FILECOORD_LEASE_TTL`
        /// and `FILECOORD_ETCD_TIMEOUT` (``connectTimeout``, which also bounds the retries
        /// through a failover), in seconds, each ignored unless above zero and at most a
        /// day; `FILECOORD_ETCD_CACERT`, `FILECOORD_ETCD_CERT` and `FILECOORD_ETCD_KEY` (any
        /// of them means TLS); `FILECOORD_ETCD_USER` and `FILECOORD_ETCD_PASSWORD`.
        public init(address: String, environment: [String: String]) throws {
            func value(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
            try self.init(address: address, root: value("FILECOORD_ROOT").map { FilePath($0) } ?? "/")
            // At most a day: `Duration` traps on a value it cannot hold (`inf`, `1e30`).
            func seconds(_ name: String) -> Duration? {
                value(name).flatMap(Double.init).flatMap { $0 > 0 && $0 <= 86_400 ? .seconds($0) : nil }
            }
            if let ttl = seconds("FILECOORD_LEASE_TTL") { leaseTTL = ttl }
            if let timeout = seconds("FILECOORD_ETCD_TIMEOUT") { connectTimeout = timeout }
            let (ca, certificate, key) = (value("FILECOORD_ETCD_CACERT"), value("FILECOORD_ETCD_CERT"), value("FILECOORD_ETCD_KEY"))
            if ca != nil || certificate != nil || key != nil {
                tls = TLS(caFile: ca.map { FilePath($0) }, certificateFile: certificate.map { FilePath($0) }, keyFile: key.map { FilePath($0) })
            }
            user = value("FILECOORD_ETCD_USER")
            password = value("FILECOORD_ETCD_PASSWORD")
        }

        /// Whether `address` names an etcd space (`etcd://` or `etcds://`).
        public static func isAddress(_ address: String) -> Bool { address.hasPrefix("etcd://") || address.hasPrefix("etcds://") }
    }
}

/// Printed, reflected or dumped, a configuration shows whether it has a password, never
/// the password: configurations end up in logs and error reports.
extension EtcdCoordinationSpace.Configuration: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// The settings, the password shown as `<redacted>`.
    public var description: String {
        "Configuration(endpoints: \(endpoints), prefix: \(prefix.debugDescription), root: \(root), leaseTTL: \(leaseTTL), "
            + "connectTimeout: \(connectTimeout), user: \(user?.debugDescription ?? "nil"), password: \(password == nil ? "nil" : "<redacted>"), "
            + "tls: \(tls.map { "\($0)" } ?? "nil"), maxAnswerBytes: \(maxAnswerBytes))"
    }

    /// The same as ``description``.
    public var debugDescription: String { description }

    /// The settings, the password as `<redacted>` (what `dump` shows).
    public var customMirror: Mirror {
        Mirror(self, children: [
            "endpoints": endpoints, "prefix": prefix, "root": root, "leaseTTL": leaseTTL, "connectTimeout": connectTimeout,
            "user": user as Any, "password": password == nil ? "nil" : "<redacted>", "tls": tls as Any, "maxAnswerBytes": maxAnswerBytes,
        ], displayStyle: .struct)
    }
}
