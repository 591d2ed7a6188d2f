import AsyncFileIO
import Foundation

/// The kinds of coordination space a process can name by an address, beside the local
/// space's directory: the one point where another module (the etcd space's,
/// FileCoordinationEtcd) makes a kind of space known, so that this library never knows it.
/// `FILECOORD_SPACE` names one of them, or a directory.
package enum SpaceKinds {
    /// Joins the space at an address, with the settings the environment gives.
    package typealias Join = @Sendable (_ address: String, _ environment: [String: String], _ hooks: SpaceHooks) async throws
        -> any CoordinationTransport

    private struct Kind: Sendable {
        let scheme: String
        let join: Join
    }
    private static let kinds = Locked<[Kind]>([])

    /// Makes addresses that start with `scheme` (`etcd://`, say) join through `join`.
    package static func register(scheme: String, join: @escaping Join) {
        kinds.withLock { kinds in
            kinds.removeAll { $0.scheme == scheme }
            kinds.append(Kind(scheme: scheme, join: join))
        }
    }

    /// How to join `name`: nil for a directory.
    ///
    /// - Throws: `FileCoordinationError` with code `.invalidArgument` for an address of a
    ///   kind no module registered (`SCHEME://...`).
    static func joiner(for name: String) throws -> Join? {
        if let kind = kinds.withLock({ $0.first { name.hasPrefix($0.scheme) } }) { return kind.join }
        guard let separator = name.range(of: "://"), !name[..<separator.lowerBound].contains("/") else { return nil }
        throw FileCoordinationError(.join, code: .invalidArgument, path: nil, message: "\(name): no kind of space '\(name[..<separator.lowerBound])' is known to this program (an etcd space needs FileCoordinationEtcd and EtcdCoordinationSpace.register())")
    }
}
