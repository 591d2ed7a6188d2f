import FileCoordination

extension FileCoordinator {
    /// Joins a coordination space kept in etcd, shared by processes on several hosts
    /// (leaving the current space). Presenters already registered are published in it.
    /// A process whose lease is lost (cut off from etcd past the lease's TTL) joins the
    /// space again with a new lease once etcd answers, and publishes its presenters
    /// again: ``etcdCoordinationSpace`` is then the new space.
    ///
    /// - Throws: `FileCoordinationError` with code `.unreachable` naming the endpoints
    ///   when no etcd member answers within the configuration's connect timeout, or
    ///   `.invalidArgument` for a malformed endpoint or a relative root.
    @discardableResult
    public static func joinCoordinationSpace(_ configuration: EtcdCoordinationSpace.Configuration) async throws -> EtcdCoordinationSpace {
        EtcdCoordinationSpace.register()
        return try await CoordinationCenter.shared.join { hooks in try await EtcdCoordinationSpace.join(configuration, hooks: hooks) }
    }

    /// The etcd coordination space this process has joined, if any.
    public static var etcdCoordinationSpace: EtcdCoordinationSpace? {
        CoordinationCenter.shared.joinedTransport as? EtcdCoordinationSpace
    }
}

extension EtcdCoordinationSpace {
    /// Makes `etcd://` and `etcds://` addresses known to the library: a process whose
    /// `FILECOORD_SPACE` names one joins that etcd space on its first coordination, with
    /// the settings of ``Configuration/init(address:environment:)``. The library alone
    /// knows only local spaces (a directory); call this once at start. Joining an etcd
    /// space explicitly does it too.
    public static func register() {
        for scheme in ["etcd://", "etcds://"] {
            SpaceKinds.register(scheme: scheme) { address, environment, hooks in
                try await EtcdCoordinationSpace.join(try Configuration(address: address, environment: environment), hooks: hooks)
            }
        }
    }
}
