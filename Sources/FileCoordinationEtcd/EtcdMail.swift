import FileCoordination
import AsyncFileIO
import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Presenters across hosts: each process publishes its presenters under its lease, keeps
/// the others' current through the process's watch stream, and carries the presenter messages of the local
/// space's protocol (``SpaceProtocol``, encoded as in a mailbox file) through keys:
///
/// ```
/// <prefix>/presenters/<lease>/<n>        a presenter: host, pid, the item's name in the space
/// <prefix>/mail/<lease>/<sender>-<id>    a message to the process of <lease> (under the sender's lease)
/// ```
///
/// A process follows its own `mail/` folder (a route of its watch stream,
/// ``EtcdWatchHub``): replies resume the tasks that wait for them at once, on the
/// stream's thread; presenter requests are served one by one, in the
/// order etcd committed them. Paths in messages are names in the space, translated from
/// and to each host's root.
final class EtcdMail: PresenterMailbox {
    let client: EtcdClient
    let hub: EtcdWatchHub
    let keys: EtcdKeys
    let names: EtcdNames
    let leaseID: Int64
    let host: String

    struct Proxy {
        let presenter: RemotePresenter
        let member: String
    }

    struct State {
        var nextMessage: UInt64 = 1
        /// Other processes' presenters, by their key.
        var remote = PresenterRegistry()
        var proxies: [[UInt8]: Proxy] = [:]
        /// The route that follows `presenters/`, and the events it brought while the
        /// first read of them was under way (applied after it).
        var presenterRoute: UInt64?
        var presenterEvents: [[EtcdJSON.WatchResponse.Event]]?
        var current = false
        var refreshing = false
        /// Mail keys already served (a put retried after a lost answer arrives twice).
        var seen: Set<[UInt8]> = []
        /// The routes that follow this process's `mail/` folder and `members/`.
        var mailRoute: UInt64?
        var membersRoute: UInt64?
    }

    let state = Locked(State())
    /// The requests sent whose replies are awaited.
    let replies = AwaitedReplies()
    /// This process's presenters, and the requests of other processes it serves for them.
    let server: PresenterServer

    init(client: EtcdClient, hub: EtcdWatchHub, keys: EtcdKeys, names: EtcdNames, leaseID: Int64, host: String, hooks: SpaceHooks) {
        server = PresenterServer(hooks: hooks)
        self.client = client
        self.hub = hub
        self.keys = keys
        self.names = names
        self.leaseID = leaseID
        self.host = host
    }

    var presentersFolder: [UInt8] { keys.base + Array("presenters/".utf8) }
    var mailFolder: [UInt8] { keys.base + Array("mail/".utf8) }
    func mailbox(of member: String) -> [UInt8] { mailFolder + Array("\(member)/".utf8) }

    struct PresenterRecord: Codable, Sendable {
        var host: String
        var pid: Int32
        /// base64 of the item's name in the space.
        var path: String
    }

    // MARK: This process's presenters

    /// Publishes a presenter: its key under the lease, once this process reads its mail.
    func register(_ presenter: any FilePresenter, at path: FilePath) async -> Bool {
        guard let name = names.shared(path.platformBytes) else {
            FileCoordinator.logger.warning("a presenter outside the etcd space's root is not published",
                                              metadata: ["path": "\(path)", "root": "\(names.root)"])
            return false
        }
        guard await startMail() else { return false }
        // Published again under the same key: other processes follow every change of it.
        let number = server.add(presenter, at: path, renumbering: false).number
        let record = PresenterRecord(host: host, pid: getpid(), path: EtcdJSON.base64(name))
        let key = presenterKey(number)
        do {
            _ = try await client.call("/v3/kv/put", EtcdJSON.PutRequest(key: key, value: try EtcdJSON.encode(record), lease: leaseID),
                                      as: EtcdJSON.Empty.self)
            return true
        } catch {
            FileCoordinator.logger.warning("a presenter could not be published in the etcd space",
                                              metadata: ["path": "\(path)", "error": "\(error)"])
            return false
        }
    }

    func unregister(_ presenter: any FilePresenter) async {
        guard let number = server.remove(presenter) else { return }
        _ = try? await client.call("/v3/kv/deleterange", EtcdJSON.DeleteRangeRequest(key: presenterKey(number)), as: EtcdJSON.Empty.self)
    }

    private func presenterKey(_ number: UInt64) -> [UInt8] {
        presentersFolder + Array("\(keys.memberName)/\(EtcdKeys.hex(number))".utf8)
    }

    // MARK: Sending

    func nextID() -> UInt64 {
        state.withLock { state in
            defer { state.nextMessage += 1 }
            return state.nextMessage
        }
    }

    /// The message as it travels: paths named in the space, the header stamped.
    private func wire(_ body: SpaceProtocol.Body, id: UInt64) -> [UInt8]? {
        guard let shared = Self.mapPaths(body, names.shared) else { return nil }
        var message = shared.encoded()
        SpaceProtocol.Header(from: keys.memberName, id: id, pid: getpid()).stamp(&message)
        return message.encoded()
    }

    private func put(_ bytes: [UInt8], to target: String, id: UInt64) {
        let key = mailbox(of: target) + Array("\(keys.memberName)-\(EtcdKeys.hex(id))".utf8)
        client.send("/v3/kv/put", EtcdJSON.PutRequest(key: key, value: bytes, lease: leaseID))
    }

    func tell(_ message: SpaceProtocol.Body, to target: String) {
        let id = nextID()
        guard let bytes = wire(message, id: id) else { return }
        put(bytes, to: target, id: id)
    }

    func request(_ message: SpaceProtocol.Body, to target: String, timeout: Duration?, ending: CancelSignal?) async throws -> SpaceProtocol.Body? {
        guard await startMail() else { return nil }
        let id = nextID()
        guard let bytes = wire(message, id: id) else { return nil }
        return try await replies.request(id, to: target, timeout: timeout, ending: ending) {
            put(bytes, to: target, id: id)
        }
    }

    /// A process left (its member key went): its requests' waits end (its presenters are
    /// gone), and what it is owed is given back (``ProcessEnding``). Its member key is gone,
    /// so it is (no look needed); its keys go with its lease (nothing to clean up).
    func memberGone(_ member: String) {
        let outcome = ProcessEnding.decide(waiting: replies.awaiting(member), owes: server.owes(member)) { false }
        if outcome.givesBack { server.senderDied(member) }
        for id in outcome.unanswered { replies.resolve(id, with: .success(nil)) }
    }

    // MARK: Receiving

    /// Follows this process's mail (and the members, for those that go), once: two routes
    /// of the watch stream, kept for as long as the process is in the space. Whatever is
    /// sent after this returns is heard: through an outage of the stream too, which
    /// resumes from where it was (requests waiting for a reply meanwhile end by their
    /// deadline).
    func startMail() async -> Bool {
        if state.withLock({ $0.mailRoute != nil }) { return true }
        let mailbox = mailbox(of: keys.memberName)
        guard let mailRoute = hub.add(EtcdWatchHub.Route(prefix: mailbox, events: .puts) { [weak self] events in
            self?.mailArrived(events.compactMap(\.kv))
        } failed: { failure in
            FileCoordinator.logger.error("the watch on this process's etcd mail failed; it is heard again once the stream is back",
                                         metadata: ["error": "\(failure)"])
        } missed: { [weak self] in
            self?.catchUp()
        }) else { return false }
        guard let membersRoute = hub.add(EtcdWatchHub.Route(prefix: keys.members, events: .deletions) { [weak self] events in
            guard let self else { return }
            for event in events {
                if let key = event.kv?.keyBytes, let member = keys.memberName(of: key, under: keys.members) { memberGone(member) }
            }
        } failed: { _ in }) else {
            hub.remove(mailRoute)
            return false
        }
        let installed = state.withLock { state -> Bool in
            // Another caller may have been first.
            guard state.mailRoute == nil else { return false }
            (state.mailRoute, state.membersRoute) = (mailRoute, membersRoute)
            return true
        }
        if !installed {
            hub.remove(mailRoute)
            hub.remove(membersRoute)
        }
        // Served one by one, in order, by a task of their own: a presenter's callback may
        // take long, and replies to this process's own requests must not wait behind it.
        server.start { [weak self] body, target in self?.tell(body, to: target) }
        return true
    }

    /// On the stream's thread: messages put in this process's mailbox.
    private func mailArrived(_ messages: [EtcdJSON.KeyValue]) {
        for kv in messages {
            let key = kv.keyBytes
            let fresh = state.withLock { state -> Bool in
                if state.seen.count > 10_000 { state.seen.removeAll() }
                return state.seen.insert(key).inserted
            }
            if fresh { received(kv.valueBytes) }
            // Read: the key goes (it would go with the sender's lease in any case).
            client.send("/v3/kv/deleterange", EtcdJSON.DeleteRangeRequest(key: key))
        }
    }

    /// On the stream's thread, when the stream is back after etcd compacted events it had
    /// not brought: what they said is read instead. The messages still in the mailbox are
    /// taken in the order they were put, before anything the stream brings after them;
    /// the processes this one awaits or owes that are no longer members are gone. Blocking
    /// (the stream's own thread): the stream's next events wait for it.
    private func catchUp() {
        var connection: EtcdConnection?
        func range(_ prefix: [UInt8]) -> [EtcdJSON.KeyValue]? {
            guard let request = try? EtcdJSON.encode(EtcdJSON.RangeRequest(key: prefix, prefix: true)),
                  let bytes = try? client.perform("/v3/kv/range", request, on: &connection),
                  let answer = try? EtcdJSON.decode(EtcdJSON.RangeResponse.self, bytes)
            else {
                FileCoordinator.logger.error("after an outage of the etcd stream, this process's mail could not be read again",
                                             metadata: ["prefix": "\(String(decoding: prefix, as: UTF8.self))"])
                return nil
            }
            return answer.kvs ?? []
        }
        if let messages = range(mailbox(of: keys.memberName)) {
            mailArrived(messages.sorted { $0.createRevision < $1.createRevision })
        }
        let concerned = replies.targets.union(server.owedProcesses)
        guard !concerned.isEmpty, let members = range(keys.members) else { return }
        let present = Set(members.compactMap { keys.memberName(of: $0.keyBytes, under: keys.members) })
        for member in concerned.sorted() where !present.contains(member) { memberGone(member) }
    }

    /// On the stream's thread.
    private func received(_ bytes: [UInt8]) {
        guard case .success(let decoded) = SpaceMessage.decode(bytes),
              let message = try? SpaceProtocol.Message(decoding: decoded),
              let body = Self.mapPaths(message.body, { [names] in names.local($0).platformBytes })
        else {
            FileCoordinator.logger.warning("a malformed message in this process's etcd mail is ignored")
            return
        }
        let local = SpaceProtocol.Message(header: message.header, body: body)
        if case .reply(let reply) = body {
            replies.resolve(reply.re, from: message.header.from, with: .success(body))
            return
        }
        _ = server.received(local, onWatcherThread: false)
    }

    /// Leaves: the routes end (the keys go with the lease).
    func stop() {
        let routes = state.withLock { state in
            defer {
                (state.presenterRoute, state.mailRoute, state.membersRoute) = (nil, nil, nil)
                state.current = false
            }
            return [state.presenterRoute, state.mailRoute, state.membersRoute]
        }
        for route in routes { hub.remove(route) }
        server.finish()
    }

    /// `body` with every path mapped by `map` (nil: a path with no name there).
    static func mapPaths(_ body: SpaceProtocol.Body, _ map: ([UInt8]) -> [UInt8]?) -> SpaceProtocol.Body? {
        func mapped(_ path: FilePath) -> FilePath? { map(path.platformBytes).map { FilePath(platformBytes: $0) } }
        guard case .presenter(var message) = body else { return body }
        guard let path = mapped(message.path) else { return nil }
        message.path = path
        switch message.call {
        case .didMove(let to):
            guard let to = mapped(to) else { return nil }
            message.call = .didMove(to: to)
        case .subitemDidMove(let to):
            guard let to = mapped(to) else { return nil }
            message.call = .subitemDidMove(to: to)
        case .relinquish(var relinquish):
            let deletions = relinquish.subitemDeletions.compactMap(mapped)
            guard deletions.count == relinquish.subitemDeletions.count else { return nil }
            relinquish.subitemDeletions = deletions
            message.call = .relinquish(relinquish)
        default:
            break
        }
        return .presenter(message)
    }
}

/// A space's names for local paths: relative to the process's root, written as absolute
/// paths (`/` is the root itself), so that hosts mounting the volume at different paths
/// name one item alike.
struct EtcdNames: Sendable {
    let root: [UInt8]

    /// The name of a canonical local path; nil outside the root.
    func shared(_ path: [UInt8]) -> [UInt8]? {
        guard FilePath.isAtOrInside(path, root) else { return nil }
        if root == [UInt8(ascii: "/")] { return path }
        let rest = path.dropFirst(root.count)
        return rest.isEmpty ? [UInt8(ascii: "/")] : Array(rest)
    }

    /// The local path of a name.
    func local(_ name: [UInt8]) -> FilePath {
        if root == [UInt8(ascii: "/")] { return FilePath(platformBytes: name) }
        return FilePath(platformBytes: name == [UInt8(ascii: "/")] ? root : root + name)
    }
}
