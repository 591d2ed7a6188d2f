import AsyncFileIO
import SystemPackage
@testable import FileCoordination

/// A seeded generator (SplitMix64): the same seed gives the same run, on any machine.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Several processes sharing a coordination space, run step by step by a seeded
/// scheduler, with processes killed or stopped and sends failing at any step.
///
/// What is the library's own code: each coordination is the production machine
/// (``CoordinationMachine``, with ``PresenterPlan`` and the order it keeps), whose actions
/// `Simulation+Coordinating` carries out one per step; the center's requests and the
/// in-process rules (``CenterRequests``, ``CoordinationRules``); the presenter lookup
/// (``PresenterRegistry``); each claim's bytes and its tries across processes
/// (``SpaceLocks/plan(for:)``, ``SpaceLocks/attempt(_:queued:calls:)``); how each
/// request for a presenter is served (``ServingMachine``, whose actions `serve(in:)`
/// carries out as `PresenterServer` does, with the ledger of what a process owes other
/// processes' coordinators, ``ServingLedger``); each request's wait for its outcome (the
/// table of ``AwaitedReplies``, ``ReplyTable``), and what a process does when another
/// may have ended (``ProcessEnding``); and the protocol's codec (``SpaceProtocol``, every
/// message is encoded and decoded). What is simulated: the
/// kernel (byte locks that die with their process, ``MemoryLocks``; one ordered inotify
/// queue per process), the space's files (records, mailboxes, presenter records), the
/// presenters' callbacks (which take a step, and may refuse).
///
/// The invariants of `docs/reliability.md` are checked after every step, and once the
/// run has settled.
final class Simulation {
    struct Options {
        var processes = 3
        /// Steps with faults and new coordinations; the run then settles without them.
        var steps = 160
        var coordinations = 16
        var presenterTimeout = 12
        var claimTimeout = 80
        var killPercent = 1
        var stopPercent = 1
        var failedSendPercent = 2
        /// A process's inotify queue overflows: its queued events are lost.
        var overflowPercent = 1
        var refusePercent = 5
        /// A coordinator's `cancel()` while one of its coordinations holds its claims.
        var cancelPercent = 1
        /// Leaves out giving back what a dead asker left relinquished (the driver's half
        /// of the deaf-presenter fix): the simulator must find that.
        var forgetsDeadAskers = false
    }

    struct Failure: Error, CustomStringConvertible {
        var seed: UInt64
        var step: Int
        var invariant: String
        var trace: [String]
        var description: String {
            "simulation seed \(seed) failed at step \(step): \(invariant)\n"
                + "replay: make simulate SEED=\(seed)\nlast steps:\n" + trace.suffix(40).map { "  " + $0 }.joined(separator: "\n")
        }
    }

    static let items = ["/d", "/d/a", "/d/b", "/e"]

    // MARK: State

    struct Presenter {
        var process: Int
        var number: UInt64
        var path: String
        /// Relinquishes not yet given back: the presenter has its item when zero.
        var relinquished = 0
        var heardChanges = 0
    }

    enum Target: Hashable {
        case local(Int)
        case remote(process: String, number: UInt64, path: String)
    }

    /// Where the driver of a coordination is: taking its claims (the center's rules, then
    /// the kernel's bytes), carrying out its machine's next action, waiting for its
    /// presenters' answers, in its accessor, or done.
    enum Phase: Equatable { case rules, kernel, driving, asking, accessing, done(String) }

    struct Coordinator {
        var id: Int
        var paths: [String]
        var write: Bool
        /// The production machine of this coordination, and its next action.
        var machine: CoordinationMachine
        var action: CoordinationMachine.Action
        var phase: Phase = .driving
        var since = 0
        var rulesID: CoordinationRules.RequestID?
        /// Writers' queue bytes kept between tries, then the claim's bytes once taken.
        var queued: [SpaceLocks.Byte] = []
        var held: SpaceLocks.Held?
        /// Its claims are held (from the kernel's grant to their release).
        var holds = false
        var cancelled = false
        /// Whether it was cancelled when the driver last checked.
        var cancelledAtCheck = false
        /// The presenters it looked up (kept alive: the machine knows them by identity).
        var stubs: [SimulatedPresenter] = []
        /// The asks of the current `ask` action, answered one by one.
        var asks: [Ask] = []
        /// How many times each presenter was asked.
        var asked: [Target: Int] = [:]
        /// Presenters that relinquished and have not got their item back yet.
        var owed: Set<Target> = []
        /// Each remote presenter's relinquish number, for its `reacquire`.
        var relinquishes: [Target: UInt64] = [:]
        /// The presenters of the items themselves, and those of them still to hear `didChange`.
        var itemPresenters: Set<Target> = []
        var toTell: Set<Target> = []

        init(id: Int, paths: [String], write: Bool, machine: CoordinationMachine, action: CoordinationMachine.Action, since: Int) {
            (self.id, self.paths, self.write, self.machine, self.action, self.since) = (id, paths, write, machine, action, since)
        }

        var claims: [CoordinationRules.Claim] { machine.items.map(\.claim) }
    }

    /// One entry of a process's inotify queue: a message closed in its mailbox, or a
    /// process's record closed (it died or left).
    enum Event { case mail, ended(String), overflow }

    enum Serving { case message(SpaceProtocol.Message), senderGone(String) }

    /// An item the serving task took up: the production ``ServingMachine`` (what a
    /// relinquish keeps is the presenter's index), its current action, and the message
    /// and presenter it serves.
    struct Served {
        var machine: ServingMachine<Int>
        var action: ServingMachine<Int>.Action
        var message: SpaceProtocol.Message?
        var presenter: Int?
    }

    struct Process {
        var name: String
        var alive = true
        var stoppedUntil = 0
        var requests = CenterRequests<Int>()
        var ledger = ServingLedger<Int>()
        /// The requests this process's coordinations sent whose outcome they await: the
        /// production table of ``AwaitedReplies``.
        var replies = ReplyTable<AskRef>()
        var events: [Event] = []
        var serving: [Serving] = []
        /// The item being served while its presenter's callback runs (it takes time: other
        /// events are handled meanwhile).
        var running: Served?
        var coordinators: [Coordinator] = []
        var nextID: UInt64 = 1
        mutating func newID() -> UInt64 {
            defer { nextID += 1 }
            return nextID
        }
    }

    /// The coordination space's files, as other processes see them.
    struct Space {
        var records: Set<String> = []
        /// Message files (encoded), per mailbox, in the order they were closed.
        var mailboxes: [String: [[UInt8]]] = [:]
        var presenterRecords: [(process: String, number: UInt64, path: String)] = []
    }

    let seed: UInt64
    let options: Options
    var random: SeededRandom
    var processes: [Process] = []
    var presenters: [Presenter] = []
    var space = Space()
    /// Cross-process claims: the kernel's byte locks, by process.
    let kernel = MemoryLocks()
    /// The owner the center records for each request (one coordinator object per process
    /// would do as well: only cancellation asks).
    static let owner = ObjectIdentifier(MemoryLocks.self)
    var now = 0
    var started = 0
    /// The steps as they ran, kept only when asked for: a failing seed is run again
    /// with it (the same seed, the same run), so that passing seeds build no strings.
    var tracing = false
    var trace: [String] = []
    /// Broken invariants found while carrying out actions, reported after the step.
    var cancelledButRan: [String] = []
    var releasedEarly: [String] = []

    init(seed: UInt64, options: Options = Options()) {
        self.seed = seed
        self.options = options
        random = SeededRandom(state: seed)
        for index in 0 ..< options.processes {
            let name = "\(100 + index)-\(String(random.next() & 0xFFFF, radix: 16))"
            processes.append(Process(name: name))
            space.records.insert(name)
            space.mailboxes[name] = []
            for number in UInt64(1) ..< UInt64(Int.random(in: 1 ... 3, using: &random)) {
                let path = Self.items.randomElement(using: &random)!
                presenters.append(Presenter(process: index, number: number, path: path))
                space.presenterRecords.append((name, number, path))
            }
        }
    }

    // MARK: Running

    /// Runs the seed: the faulty part, then settling, checking after every step.
    func run() throws(Failure) {
        for _ in 0 ..< options.steps {
            step(faults: true)
            try checkExclusion()
        }
        // Settling: no faults, no new coordinations, stopped processes resumed.
        for index in processes.indices { processes[index].stoppedUntil = 0 }
        // Until nothing can run and nothing waits for a deadline (the clock then jumps).
        for _ in 0 ..< 4000 {
            if !step(faults: false) {
                guard let deadline = nextDeadline else { break }
                now = max(now, deadline - 1)
            }
            try checkExclusion()
        }
        try checkSettled()
    }

    func fail(_ invariant: String) -> Failure {
        Failure(seed: seed, step: now, invariant: invariant, trace: trace)
    }

    func log(_ line: @autoclosure () -> String) {
        guard tracing else { return }
        trace.append("\(now) \(line())")
        if trace.count > 200 { trace.removeFirst(100) }
    }

    /// Runs `seed`; a failure comes with the trace of a second, identical run.
    static func check(seed: UInt64, options: Options = Options()) -> Failure? {
        let simulation = Simulation(seed: seed, options: options)
        do {
            try simulation.run()
            return nil
        } catch {
            let replay = Simulation(seed: seed, options: options)
            replay.tracing = true
            do {
                try replay.run()
                return Failure(seed: seed, step: error.step, invariant: error.invariant + " (and the replay did not fail: not deterministic)",
                               trace: [])
            } catch {
                return error
            }
        }
    }

    /// One step: the clock moves, then one enabled action, chosen at random, runs.
    /// Returns whether an action ran.
    @discardableResult
    func step(faults: Bool) -> Bool {
        now += 1
        timeOut()
        if faults, Int.random(in: 0 ..< 100, using: &random) < options.killPercent, let victim = liveIndices.randomElement(using: &random),
           liveIndices.count > 1 {
            kill(victim)
            return true
        }
        if faults, Int.random(in: 0 ..< 100, using: &random) < options.stopPercent, let victim = liveIndices.randomElement(using: &random) {
            processes[victim].stoppedUntil = now + Int.random(in: 1 ... 3 * options.presenterTimeout, using: &random)
            log("\(processes[victim].name) stopped until \(processes[victim].stoppedUntil)")
            return true
        }
        if faults, Int.random(in: 0 ..< 100, using: &random) < options.cancelPercent,
           let victim = liveIndices.randomElement(using: &random), cancel(in: victim) {
            return true
        }
        if faults, Int.random(in: 0 ..< 100, using: &random) < options.overflowPercent,
           let victim = liveIndices.filter({ !processes[$0].events.isEmpty }).randomElement(using: &random) {
            // The kernel's queue was full: what it held is lost, and one overflow event says so.
            processes[victim].events = [.overflow]
            log("\(processes[victim].name)'s inotify queue overflows")
            return true
        }
        var actions: [(Int, Int)] = [] // (process, action: 0 receive, 1 serve, 2 coordinate n, 3 start)
        for index in liveIndices where processes[index].stoppedUntil <= now {
            let process = processes[index]
            if !process.events.isEmpty { actions.append((index, -1)) }
            if !process.serving.isEmpty || process.running != nil { actions.append((index, -2)) }
            for (position, coordinator) in process.coordinators.enumerated() where canAdvance(coordinator, in: index) {
                actions.append((index, position))
            }
            if faults, started < options.coordinations { actions.append((index, -3)) }
        }
        guard let (index, action) = actions.randomElement(using: &random) else { return false }
        switch action {
        case -1: receive(in: index)
        case -2: serve(in: index)
        case -3: startCoordination(in: index)
        default: advance(action, in: index)
        }
        return true
    }

    /// The next time a waiting coordinator gives up (a presenter's answer, a claim).
    var nextDeadline: Int? {
        liveIndices.flatMap { index in
            processes[index].coordinators.compactMap { coordinator -> Int? in
                if let since = coordinator.asks.filter({ $0.answer == nil }).map(\.since).min() {
                    return since + options.presenterTimeout + 1
                }
                if coordinator.phase == .kernel { return coordinator.since + options.claimTimeout + 1 }
                return nil
            }
        }.min()
    }

    var liveIndices: [Int] { processes.indices.filter { processes[$0].alive } }

    func process(named name: String) -> Int? { processes.firstIndex { $0.name == name } }

    func isAlive(_ name: String) -> Bool { process(named: name).map { processes[$0].alive } ?? false }

    // MARK: Faults

    func kill(_ index: Int) {
        let name = processes[index].name
        log("\(name) killed")
        processes[index].alive = false
        processes[index].coordinators.removeAll()
        // The kernel drops its locks; its record's descriptor closes, which every process
        // watching the space hears, in order with what it already queued.
        kernel.dropAll(of: index)
        for other in liveIndices { processes[other].events.append(.ended(name)) }
    }

    /// Whoever finds a process dead removes what it left in the space.
    func cleanUp(_ name: String) {
        guard !isAlive(name) else { return }
        space.records.remove(name)
        space.mailboxes[name] = nil
        space.presenterRecords.removeAll { $0.process == name }
    }

    // MARK: Sending

    /// Writes a message into `target`'s mailbox. False when it has none (gone) or the
    /// write failed (an injected ENOSPC or EMFILE).
    func send(_ body: SpaceProtocol.Body, from index: Int, to target: String, id: UInt64, mayFail: Bool) -> Bool {
        guard space.mailboxes[target] != nil else { return false }
        if mayFail, Int.random(in: 0 ..< 100, using: &random) < options.failedSendPercent {
            log("\(processes[index].name) send \(body.kind) to \(target): failed (injected)")
            return false
        }
        var message = body.encoded()
        SpaceProtocol.Header(from: processes[index].name, id: id, pid: Int32(100 + index)).stamp(&message)
        space.mailboxes[target]!.append(message.encoded())
        if let receiver = process(named: target), processes[receiver].alive { processes[receiver].events.append(.mail) }
        log("\(processes[index].name) -> \(target): \(body.kind) #\(id)")
        return true
    }

    /// A message with no answer (`did-change`, `reacquire`): a failed write is ignored,
    /// as `SpaceMail.tell` ignores it.
    func tell(_ body: SpaceProtocol.Body, from index: Int, to target: String) {
        let id = processes[index].newID()
        _ = send(body, from: index, to: target, id: id, mayFail: false)
    }

    // MARK: Receiving (each process's watcher thread), as SpaceMail.receive

    func receive(in index: Int) {
        let event = processes[index].events.removeFirst()
        let me = processes[index].name
        switch event {
        case .ended(let name):
            processEnded(name, in: index)
        case .overflow:
            // As `SpaceMail.received` and `processEnded` on `IN_Q_OVERFLOW`: the whole
            // mailbox is read, and the processes this one waits for or owes are checked.
            log("\(me) rescans after an overflow")
            while space.mailboxes[me]?.isEmpty == false { readMessage(in: index) }
            for name in ProcessEnding.toRecheck(awaited: processes[index].replies.targets, owed: processes[index].ledger.owedProcesses) {
                processEnded(name, in: index)
            }
        case .mail:
            readMessage(in: index)
        }
    }

    /// Reads the oldest message file of `index`'s mailbox and acts on it.
    func readMessage(in index: Int) {
        let me = processes[index].name
        guard var box = space.mailboxes[me], !box.isEmpty else { return }
        let bytes = box.removeFirst()
        space.mailboxes[me] = box
        guard case .success(let decoded) = SpaceMessage.decode(bytes), let message = try? SpaceProtocol.Message(decoding: decoded) else {
            log("\(me) could not decode a message")
            return
        }
        switch message.body {
        case .reply(let reply):
            resolve(reply, in: index)
        case .presenter:
            // As `PresenterServer.received`.
            if let item = ServingMachine<Int>.item(message) { ServingMachine.arrived(item, ledger: &processes[index].ledger) }
            processes[index].serving.append(.message(message))
        case .status, .statusReply:
            break
        }
    }

    /// `SpaceMail.processEnded`'s decision (``ProcessEnding``), carried out as it does.
    func processEnded(_ name: String, in index: Int) {
        log("\(processes[index].name) hears \(name) ended")
        let outcome = ProcessEnding.decide(waiting: processes[index].replies.awaiting(name), owes: processes[index].ledger.owes(name)) {
            isAlive(name)
        }
        if outcome.givesBack, processes[index].ledger.senderDied(name), !options.forgetsDeadAskers {
            processes[index].serving.append(.senderGone(name))
        }
        for id in outcome.unanswered { arrive(id, .success(nil), in: index) }
        if outcome.cleansUp { cleanUp(name) }
    }

    // MARK: Serving (each process's serving task), with PresenterServer's machine

    /// One step of the serving task: the next item taken up, or the end of a presenter's
    /// callback. The ``ServingMachine`` decides; this carries out its actions as
    /// `PresenterServer.serve` does, with the simulated presenters.
    func serve(in index: Int) {
        let me = processes[index].name
        var served: Served
        if let running = processes[index].running {
            // The presenter's callback returns: it relinquished or refused, or its steps
            // after relinquishing ended.
            processes[index].running = nil
            served = running
            let refuses = Int.random(in: 0 ..< 100, using: &random) < options.refusePercent
            let event: ServingMachine<Int>.Event
            switch (served.action, served.presenter) {
            case (.relinquish, let presenter?) where !refuses:
                presenters[presenter].relinquished += 1
                log("\(me) presenter \(presenter) relinquished")
                event = .relinquished(presenter)
            case (.followUps, _) where !refuses:
                event = .followedUp
            default:
                log("\(me) presenter refuses")
                event = .failed("refused")
            }
            served.action = served.machine.handle(event, ledger: &processes[index].ledger)
        } else {
            let message: SpaceProtocol.Message?, taken: ServingMachine<Int>.Item?
            switch processes[index].serving.removeFirst() {
            case .senderGone(let name): (message, taken) = (nil, .senderGone(name))
            case .message(let received): (message, taken) = (received, ServingMachine<Int>.item(received))
            }
            guard let taken else { return }
            var presenter: Int?
            if let message, case .presenter(let request) = message.body {
                presenter = presenters.firstIndex { $0.process == index && $0.number == request.presenter }
            }
            let (machine, action) = ServingMachine.start(taken, hasPresenter: presenter != nil, ledger: &processes[index].ledger)
            served = Served(machine: machine, action: action, message: message, presenter: presenter)
        }
        // Its actions, up to one that takes time or the last.
        while true {
            switch served.action {
            case .relinquish, .followUps:
                processes[index].running = served
                return
            case .undo(let presenter), .reacquire(let presenter):
                presenters[presenter].relinquished -= 1
                log("\(me) presenter \(presenter) gets its item back")
                served.action = served.machine.handle(.undone, ledger: &processes[index].ledger)
            case .deliver:
                if let message = served.message, case .presenter(let request) = message.body, case .didChange = request.call,
                   let presenter = served.presenter {
                    presenters[presenter].heardChanges += 1
                }
                return
            case .reply(let failure):
                guard let message = served.message else { return }
                var reply = SpaceProtocol.Reply(re: message.header.id)
                reply.failure = failure
                tell(.reply(reply), from: index, to: message.header.from)
                return
            case .end:
                return
            }
        }
    }

    // MARK: Invariants

    /// Once settled: every request ended, every presenter of a live process has its item
    /// back and nothing is owed, and after one cleanup nothing of a dead process is left.
    func checkSettled() throws(Failure) {
        for index in liveIndices {
            for coordinator in processes[index].coordinators {
                guard case .done = coordinator.phase else {
                    throw fail("#\(coordinator.id) in \(processes[index].name) never ended (\(coordinator.phase))")
                }
            }
            if processes[index].ledger.keptCount != 0 {
                throw fail("\(processes[index].name) still keeps \(processes[index].ledger.keptCount) relinquishes")
            }
            if !processes[index].replies.entries.isEmpty {
                throw fail("\(processes[index].name) still awaits \(processes[index].replies.entries.count) replies")
            }
        }
        // Every request ended: nothing held or queued in the kernel, nothing tracked here.
        if let (offset, owners) = kernel.holders.first {
            throw fail("byte \(offset) is still locked by \(owners.keys.map { processes[$0].name })")
        }
        if let index = liveIndices.first(where: { processes[$0].requests.trackedCount != 0 }) {
            throw fail("\(processes[index].name) still tracks \(processes[index].requests.trackedCount) requests")
        }
        for (number, presenter) in presenters.enumerated() where processes[presenter.process].alive && presenter.relinquished != 0 {
            throw fail("presenter \(number) of \(processes[presenter.process].name) on \(presenter.path) is left relinquished "
                + "(\(presenter.relinquished)): deaf to later changes")
        }
        // `filecoord status` in a live process cleans up after every dead one.
        guard !liveIndices.isEmpty else { return }
        for process in processes where !process.alive { cleanUp(process.name) }
        let dead = Set(processes.filter { !$0.alive }.map(\.name))
        if let left = space.records.first(where: dead.contains) ?? space.mailboxes.keys.first(where: dead.contains)
            ?? space.presenterRecords.first(where: { dead.contains($0.process) })?.process {
            throw fail("\(left) is dead, and something of it is still in the space")
        }
    }
}
