import FileCoordination
import AsyncFileIO
import Foundation
import Synchronization

/// A watch on the keys under a prefix, from a revision on, on a thread and a connection
/// of its own (the gateway streams one watch per HTTP request). When a member goes away
/// the watch resumes on another from the revision after the last one it delivered, so no
/// event is lost to a failover; so it does after a message it cannot decode.
///
/// A dead connection or a member cut off from the majority is noticed: the watch asks
/// for a leader (a member without one ends the stream after three election timeouts,
/// and refuses new ones), TCP keep-alives probe a quiet connection, and a stream that
/// brings nothing (no event, no progress notification) for ``idleLimit`` is started
/// again from its last revision, which a member that no longer answers fails.
final class EtcdWatch: Sendable {
    private struct State {
        var connection: EtcdConnection?
        var cancelled = false
    }
    private let state = Locked(State())

    /// Which events a watch delivers.
    enum Events: Sendable { case all, deletions, puts }

    /// How long a stream may bring nothing before it is started again: four times the
    /// client's connect timeout.
    static func idleLimit(_ client: EtcdClient) -> Duration { client.connectTimeout * 4 }

    /// Watches the keys under `prefix` from `revision`; `handle` gets each batch of events
    /// on the watch's thread. `failed` is called once if the watch cannot go on (no member
    /// answers within the client's retry limit, or the revision was compacted).
    ///
    /// With `outage`, the watch never gives up: when no member serves it for the retry
    /// limit, or the revision it needs was compacted (it then goes on from the oldest one
    /// etcd has), `outage` is called once, and it keeps trying, once a second; `resumed` is
    /// called when a stream is in place again, saying whether events were lost to a
    /// compaction meanwhile. `failed` is then never called.
    init(client: EtcdClient, prefix: [UInt8], from revision: Int64, events: Events,
         handle: @escaping @Sendable ([EtcdJSON.WatchResponse.Event]) -> Void,
         failed: @escaping @Sendable (EtcdFailure) -> Void,
         outage: (@Sendable (EtcdFailure) -> Void)? = nil, resumed: (@Sendable (_ missed: Bool) -> Void)? = nil) {
        let thread = Thread { [self] in
            run(client: client, prefix: prefix, from: revision, events: events, handle: handle, failed: failed,
                outage: outage, resumed: resumed)
        }
        thread.name = "filecoord-etcd-watch"
        thread.start()
    }

    /// Ends the watch. A batch of events being handled on the watch's thread at that
    /// moment may still finish; none comes after it.
    func cancel() {
        let connection = state.withLock { state in
            state.cancelled = true
            return state.connection
        }
        connection?.shutdown()
    }

    private func run(client: EtcdClient, prefix: [UInt8], from revision: Int64, events: Events,
                     handle: @Sendable ([EtcdJSON.WatchResponse.Event]) -> Void, failed: @Sendable (EtcdFailure) -> Void,
                     outage: (@Sendable (EtcdFailure) -> Void)?, resumed: (@Sendable (_ missed: Bool) -> Void)?) {
        var next = revision
        var missed = false
        var member = 0
        var failingSince: ContinuousClock.Instant?
        var down = false
        let idle = Self.idleLimit(client)
        while !state.withLock({ $0.cancelled }) {
            // When this stream was created: one that then stays up for the idle limit is
            // sound, though nothing happened on it.
            var created: ContinuousClock.Instant?
            do {
                let started = EtcdDeadline(client.connectTimeout)
                let connection = try EtcdConnection(client.endpoints[member % client.endpoints.count], deadline: started,
                                                    tls: client.tls, limits: client.limits)
                guard state.withLock({ state in
                    state.connection = connection
                    return !state.cancelled
                }) else { return }
                let request = EtcdJSON.WatchCreate(create_request: .init(
                    key: EtcdJSON.base64(prefix), range_end: EtcdJSON.base64(EtcdJSON.prefixEnd(prefix)),
                    start_revision: String(next), filters: events == .deletions ? ["NOPUT"] : events == .puts ? ["NODELETE"] : nil,
                    progress_notify: true))
                try connection.startStream("/v3/watch", try EtcdJSON.encode(request), token: client.auth?.token(on: connection, deadline: started),
                                           deadline: started)
                while let messages = try connection.nextMessages(by: EtcdDeadline(idle)) {
                    for bytes in messages {
                        let message: EtcdWatchMessage
                        do {
                            message = try EtcdWatchMessage.decode(bytes)
                        } catch {
                            // Its events, if it had any, come again from `next`.
                            throw EtcdFailure.invalid(connection.endpoint, error.description)
                        }
                        switch message {
                        case .created:
                            // Not yet sound: a member that creates every watch and then
                            // sends what cannot be served would otherwise never be an
                            // outage, and the waits on this watch would never end.
                            created = .now
                            if down || missed {
                                down = false
                                resumed?(missed)
                                missed = false
                            }
                        case .progress(let revision):
                            failingSince = nil
                            next = max(next, revision + 1)
                        case .events(let batch, let last):
                            failingSince = nil
                            if let last { next = max(next, last + 1) }
                            if state.withLock({ $0.cancelled }) { return }
                            handle(batch)
                        case .canceled(let compacted?, let reason):
                            // Compacted past `next`: what was missed cannot be had. A watch
                            // that never gives up goes on from the oldest revision etcd has
                            // and says so once it is back (`resumed(missed: true)`): its
                            // routes read again what they follow. It is no outage: etcd
                            // answers (a shared etcd compacts while this stream is quiet).
                            let failure = EtcdFailure.answer(EtcdAnswer(status: 410, code: nil, message: reason))
                            guard outage != nil else {
                                failed(failure)
                                return
                            }
                            missed = missed || compacted > next
                            next = max(next, compacted)
                            failingSince = nil
                            throw failure // a new stream, from `next`
                        case .canceled(_, let reason):
                            // Refused (a token that expired unused while the watch ran): a
                            // new token, and the watch again.
                            client.auth?.invalidate()
                            throw EtcdFailure.answer(EtcdAnswer(status: 200, code: nil, message: reason))
                        case .failure(let code, let why):
                            throw EtcdFailure.answer(EtcdAnswer(status: 200, code: code, message: why))
                        }
                    }
                }
                throw EtcdFailure.connection(connection.endpoint, "the watch ended")
            } catch {
                if state.withLock({ $0.cancelled }) { return }
                if case .answer(let answer) = error as? EtcdFailure, answer.isUnauthenticated { client.auth?.invalidate() }
                let now = ContinuousClock.now
                if let created, now - created >= idle { failingSince = nil }
                if let since = failingSince, now - since > client.retryLimit {
                    let failure = error as? EtcdFailure ?? .connection(client.endpoints[0], "\(error)")
                    guard let outage else {
                        failed(failure)
                        return
                    }
                    if !down { outage(failure) }
                    down = true
                }
                if failingSince == nil { failingSince = now }
                member += 1
                if member % client.endpoints.count == 0 { Thread.sleep(forTimeInterval: down ? 1 : 0.05) }
            }
        }
    }
}

/// Keeps a lease alive from a thread of its own (its own connection, so that a slow call
/// of the client never delays a keep-alive): one keep-alive every third of the TTL. When
/// etcd says the lease is gone, or no member has answered for a whole TTL, the lease is
/// taken as lost (``lost`` is called once): every claim made under it may be another's
/// by now.
final class EtcdLeaseKeeper: Sendable {
    let id: Int64
    let ttl: Duration
    private let condition = NSCondition()
    private let stopped = Atomic<Bool>(false)
    /// Set once the lease is lost.
    let isLost = Atomic<Bool>(false)
    /// When the last keep-alive that etcd answered was sent (nanoseconds on the
    /// continuous clock's scale, from `epoch`): the lease holds until a TTL after it.
    private let renewedAt = Atomic<Int64>(0)
    private let epoch = ContinuousClock.now

    /// Whether the lease surely holds now: not lost, and renewed within its TTL.
    var holdsNow: Bool {
        guard !isLost.load(ordering: .acquiring) else { return false }
        let since = ContinuousClock.now - epoch - .nanoseconds(renewedAt.load(ordering: .acquiring))
        return since < ttl
    }

    /// Whether the lease lives, asked of etcd now (when ``holdsNow`` cannot say: no
    /// renewal answered for a whole TTL, as through a slow leader election). A lease that
    /// etcd still knows was never revoked, so the keys under it held throughout; one it
    /// no longer knows is lost. Retries members for the client's retry limit.
    func confirm() async -> Bool {
        if isLost.load(ordering: .acquiring) { return false }
        let sent = ContinuousClock.now
        // The answer is a stream of one message: one JSON object and a newline.
        guard let answer = try? await client.call("/v3/lease/keepalive", EtcdJSON.LeaseRequest(ID: String(id)),
                                                  as: EtcdJSON.LeaseKeepAliveResponse.self),
              let result = answer.result else { return false }
        guard let ttlLeft = result.TTL.flatMap(Int64.init), ttlLeft > 0 else { return false }
        noteRenewal(sentAt: sent)
        return true
    }

    private func noteRenewal(sentAt instant: ContinuousClock.Instant) {
        let (seconds, attoseconds) = (instant - epoch).components
        renewedAt.store(seconds * 1_000_000_000 + attoseconds / 1_000_000_000, ordering: .releasing)
    }

    private let client: EtcdClient

    /// A keeper for lease `id`, granted by a call sent at `grantSentAt`.
    init(client: EtcdClient, id: Int64, ttl: Duration, grantSentAt: ContinuousClock.Instant) {
        self.client = client
        self.id = id
        self.ttl = ttl
        self.grantSentAt = grantSentAt
        noteRenewal(sentAt: grantSentAt)
    }

    /// When the lease's grant was sent: its TTL runs from there until the first renewal.
    private let grantSentAt: ContinuousClock.Instant

    /// Starts the keep-alives; `lost` is called once if the lease is lost.
    func start(lost: @escaping @Sendable (String) -> Void) {
        let thread = Thread { [self] in run(client: client, lost: lost) }
        thread.name = "filecoord-etcd-lease"
        thread.start()
    }

    /// Stops the keep-alives (before the lease is revoked).
    func stop() {
        condition.lock()
        stopped.store(true, ordering: .releasing)
        condition.signal()
        condition.unlock()
    }

    private func run(client: EtcdClient, lost: @Sendable (String) -> Void) {
        var connection: EtcdConnection?
        // From the grant, not from this thread's start (late under load): the lease ends
        // a TTL after the grant was sent.
        var lastRenewal = grantSentAt
        var failing = false
        let interval = Double(ttl.components.seconds) / 3 + Double(ttl.components.attoseconds) / 3e18
        let attempt = Duration.seconds(max(0.5, interval))
        let body = (try? EtcdJSON.encode(EtcdJSON.LeaseRequest(ID: String(id)))) ?? []
        while true {
            condition.lock()
            if !stopped.load(ordering: .acquiring) {
                // After a failed try, the next comes soon: the lease's time is running out.
                _ = condition.wait(until: Date(timeIntervalSinceNow: failing ? 0.1 : interval))
            }
            condition.unlock()
            if stopped.load(ordering: .acquiring) { return }
            let sent = ContinuousClock.now
            do {
                // Each keep-alive is its own streamed call: one request, one answer. A member
                // that holds it (a follower whose leader just died) is given a third of the
                // TTL, then the next one is tried; none past the lease's end, when the
                // lease is lost whichever members were tried.
                let answer = try client.perform("/v3/lease/keepalive", body, on: &connection, tryTimeout: attempt, retryLimit: attempt,
                                                 notAfter: lastRenewal + ttl)
                let message = try EtcdJSON.decode(EtcdJSON.LeaseKeepAliveResponse.self, Self.firstMessage(answer))
                // An error (no leader during an election, say) is not an answer about the
                // lease: tried again until the TTL runs out.
                guard let result = message.result else {
                    throw EtcdFailure.answer(EtcdAnswer(status: 200, code: message.error?.grpc_code,
                                                        message: message.error?.message ?? "no answer about the lease"))
                }
                guard let ttlLeft = result.TTL.flatMap(Int64.init), ttlLeft > 0 else {
                    isLost.store(true, ordering: .releasing)
                    lost("etcd says the lease has expired")
                    return
                }
                lastRenewal = sent
                failing = false
                noteRenewal(sentAt: sent)
            } catch {
                connection = nil
                failing = true
                if ContinuousClock.now - lastRenewal >= ttl {
                    isLost.store(true, ordering: .releasing)
                    lost("no etcd member renewed the lease within its TTL (\(error))")
                    return
                }
            }
        }
    }

    /// The keep-alive's answer is a stream of one message, newline-terminated.
    private static func firstMessage(_ bytes: [UInt8]) -> [UInt8] {
        Array(bytes.prefix { $0 != UInt8(ascii: "\n") })
    }
}
