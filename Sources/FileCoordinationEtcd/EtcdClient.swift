import FileCoordination
import AsyncFileIO
import Foundation

/// etcd's v3 API through its JSON gateway: the calls the etcd space makes, run in order on
/// a thread of the client's own over one kept-open connection, failing over to the next
/// member when one does not answer. Keys and values travel base64-encoded, 64-bit numbers
/// as decimal strings (the gateway's JSON mapping of etcd's protobuf messages).
///
/// Calls run in the order they are made: a release (a delete) made before a claim (a put)
/// reaches etcd before it.
final class EtcdClient: Sendable {
    let endpoints: [EtcdEndpoint]
    /// How long one try of a call (connecting, sending, the whole answer) may take on one member.
    let connectTimeout: Duration
    /// How long a call keeps trying members (through a leader election, say) before it fails.
    let retryLimit: Duration
    /// The credentials and their current token, when etcd's authentication is on.
    let auth: EtcdAuth?
    /// TLS for every connection, when the space uses it.
    let tls: EtcdTLS?
    /// What the client accepts from the network, at most.
    let limits: EtcdLimits
    /// Where each call's time is recorded.
    let metrics: EtcdMetrics
    private let worker: EtcdWorker

    init(endpoints: [EtcdEndpoint], connectTimeout: Duration, retryLimit: Duration, auth: EtcdAuth? = nil, tls: EtcdTLS? = nil,
         limits: EtcdLimits = EtcdLimits(), metrics: EtcdMetrics = .standard) {
        self.metrics = metrics
        self.endpoints = endpoints
        self.connectTimeout = connectTimeout
        self.retryLimit = retryLimit
        self.auth = auth
        self.tls = tls
        self.limits = limits
        worker = EtcdWorker(name: "filecoord-etcd")
    }

    /// Calls `path` (`/v3/kv/txn`, ...) with `request`, and decodes the answer.
    func call<Answer: Decodable & Sendable>(_ path: String, _ request: some Encodable, as answer: Answer.Type) async throws -> Answer {
        let body = try EtcdJSON.encode(request)
        let bytes: [UInt8] = try await withCheckedThrowingContinuation { continuation in
            let queued = worker.enqueue { [self] in
                continuation.resume(with: Result { () throws(EtcdFailure) in try perform(path, body) })
            }
            if !queued { continuation.resume(throwing: EtcdFailure.connection(endpoints[0], "the client is closed")) }
        }
        return try EtcdJSON.decode(Answer.self, bytes)
    }

    /// Calls `path` without waiting for the answer. When no member answers, the call is
    /// made again after half a second for as long as `again` says so (a release, while
    /// the lease lives); else the failure is logged.
    func send(_ path: String, _ request: some Encodable, again: (@Sendable () -> Bool)? = nil) {
        guard let body = try? EtcdJSON.encode(request) else { return }
        send(path, body, again: again)
    }

    private func send(_ path: String, _ body: [UInt8], again: (@Sendable () -> Bool)?) {
        worker.enqueue { [self] in
            do { _ = try perform(path, body) } catch {
                if let again, let failure = error as? EtcdFailure, Self.worthAgain(failure), again() {
                    Thread.sleep(forTimeInterval: 0.5)
                    send(path, body, again: again)
                    return
                }
                FileCoordinator.logger.warning("etcd call failed", metadata: ["call": "\(path)", "error": "\(error)"])
            }
        }
    }

    /// Whether a call that failed so may succeed later: no member answered, every member
    /// said it has no leader, or none answered in a form the client accepts (a member may
    /// be replaced, a proxy fixed). A refusal (a bad request, no permission) will not.
    private static func worthAgain(_ error: EtcdFailure) -> Bool {
        switch error {
        case .connection, .invalid: true
        case .answer(let answer): answer.isUnavailable
        }
    }

    /// Returns once every call made so far is done.
    func barrier() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            if !worker.enqueue({ continuation.resume() }) { continuation.resume() }
        }
    }

    /// Ends the worker once the calls made so far are done.
    func close() { worker.finish() }

    /// On the worker thread: the call on the current member, then on the others, until
    /// one answers or ``retryLimit`` passes.
    private func perform(_ path: String, _ body: [UInt8]) throws(EtcdFailure) -> [UInt8] {
        try perform(path, body, on: &worker.connection)
    }

    /// A call on `connection` (made when nil, or when the last answer left it unfit for
    /// another), failing over among the members. Blocking. Each try, on one member, has
    /// `tryTimeout` (default: ``connectTimeout``) for all of it: connecting, sending, and
    /// the whole answer. A member whose answer is not one the client accepts is not
    /// asked again in this call. Past `retryLimit` it gives up once every member was
    /// tried; at `notAfter` (a lease's end, say), whatever was tried.
    func perform(_ path: String, _ body: [UInt8], on connection: inout EtcdConnection?, tryTimeout: Duration? = nil,
                 retryLimit: Duration? = nil, notAfter: ContinuousClock.Instant? = nil) throws(EtcdFailure) -> [UInt8] {
        let start = ContinuousClock.now
        defer { metrics.record(path, .now - start) }
        let deadline = start + (retryLimit ?? self.retryLimit)
        var next = connection.flatMap { endpoints.firstIndex(of: $0.endpoint) } ?? 0
        var refused: Set<EtcdEndpoint> = []
        var lastFailure: EtcdFailure?
        var tries = 0
        while true {
            do {
                if let open = connection, !open.isReusable { connection = nil }
                while refused.contains(endpoints[next % endpoints.count]) { next += 1 }
                let allowed = tryTimeout ?? connectTimeout
                let attempt = EtcdDeadline(notAfter.map { Swift.min(allowed, Swift.max(.zero, $0 - .now)) } ?? allowed)
                if connection == nil {
                    connection = try EtcdConnection(endpoints[next % endpoints.count], deadline: attempt, tls: tls, limits: limits)
                }
                let token = try auth?.token(on: connection!, deadline: attempt)
                return try connection!.post(path, body, token: token, deadline: attempt)
            } catch {
                tries += 1
                switch error {
                case .connection:
                    connection = nil
                    next += 1
                case .invalid(let endpoint, _):
                    connection = nil
                    refused.insert(endpoint)
                    next += 1
                    if refused.count == Set(endpoints).count { throw error }
                case .answer(let answer) where auth != nil && answer.isUnauthenticated:
                    // Tokens expire (5 min unused, by default): a new one, and the call again.
                    auth?.invalidate()
                case .answer(let answer):
                    // A member without a leader (an election under way, or cut off from
                    // the majority) says so; another member, or the same one shortly, will do.
                    guard answer.isUnavailable else { throw error }
                    connection = nil
                    next += 1
                }
                lastFailure = error
                let now = ContinuousClock.now
                if now >= deadline && tries >= endpoints.count || notAfter.map({ now >= $0 }) == true { throw lastFailure! }
                if tries % endpoints.count == 0 { Thread.sleep(forTimeInterval: 0.05) }
            }
        }
    }
}

/// etcd credentials and the token they last got (`/v3/auth/authenticate`), sent with every
/// call; a new one is asked for when etcd says the old one expired.
final class EtcdAuth: Sendable {
    let user: String
    let password: String
    private let current = Locked<String?>(nil)

    init(user: String, password: String) {
        self.user = user
        self.password = password
    }

    /// The token, authenticating on `connection` first when there is none.
    func token(on connection: EtcdConnection, deadline: EtcdDeadline) throws(EtcdFailure) -> String {
        if let token = current.withLock({ $0 }) { return token }
        struct Authenticate: Encodable { var name: String; var password: String }
        struct Answer: Decodable { var token: String? }
        let body = (try? EtcdJSON.encode(Authenticate(name: user, password: password))) ?? []
        let answer: [UInt8]
        do {
            answer = try connection.post("/v3/auth/authenticate", body, token: nil, deadline: deadline)
        } catch .answer(var refusal) where !refusal.isUnavailable {
            refusal.refusesCredentials = true
            throw .answer(refusal)
        }
        guard let token = (try? EtcdJSON.decode(Answer.self, answer))?.token else {
            throw .answer(EtcdAnswer(status: 200, code: nil, message: "etcd gave no token to user \(user)", refusesCredentials: true))
        }
        current.withLock { $0 = token }
        return token
    }

    func invalidate() { current.withLock { $0 = nil } }
}

/// A thread that runs the closures given to it one by one, in order, and owns the
/// client's connection.
final class EtcdWorker: @unchecked Sendable {
    // Guarded by `condition`.
    private var jobs: [@Sendable () -> Void] = []
    private var finished = false
    private let condition = NSCondition()
    /// Used only by the worker thread.
    var connection: EtcdConnection?

    init(name: String) {
        let thread = Thread { [self] in run() }
        thread.name = name
        thread.start()
    }

    /// Queues `job`; false (and `job` dropped) once the worker was told to finish.
    @discardableResult
    func enqueue(_ job: @escaping @Sendable () -> Void) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard !finished else { return false }
        jobs.append(job)
        condition.signal()
        return true
    }

    func finish() {
        condition.lock()
        finished = true
        condition.signal()
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while jobs.isEmpty && !finished { condition.wait() }
            if jobs.isEmpty {
                condition.unlock()
                connection = nil
                return
            }
            let batch = jobs
            jobs.removeAll()
            condition.unlock()
            for job in batch { job() }
        }
    }
}
