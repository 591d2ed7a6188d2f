import AsyncFileIO
import Foundation
import SystemPackage
@testable import FileCoordination

/// A presenter as a coordination's machine sees it: one of this process's, or a record of
/// another process's.
final class SimulatedPresenter: FilePresenter {
    let target: Simulation.Target
    let presentedItemURL: URL?
    init(_ target: Simulation.Target, path: String) {
        self.target = target
        presentedItemURL = URL(fileURLWithPath: path)
    }
}

/// The coordinations: each is the production ``CoordinationMachine``, whose actions this
/// driver carries out one per step (so that other processes' steps interleave between
/// any two of them), on the simulated space. Its claims go through the production
/// center's requests and the space's claim attempts.
extension Simulation {
    struct Ask {
        var target: Target
        /// The request's id (its reply's `re`) and the relinquish's own number.
        var id: UInt64 = 0
        var re: UInt64 = 0
        var since: Int
        var answer: Result<FileReacquirer?, any Error>?
    }

    struct Refused: Error {}
    struct NotDelivered: Error {}

    /// Which ask of which coordination a request's outcome is for: what the production
    /// ``ReplyTable`` keeps for a parked task (its continuation).
    struct AskRef {
        var coordinator: Int
        var ask: Int
    }

    /// The answer an ask gets from its request's outcome, as `RemotePresenter.relinquish`
    /// makes it: a reply (relinquished, or refused), none (its process is gone, or the
    /// deadline passed and the policy proceeds), or a failure to deliver it.
    static func answer(_ outcome: Result<SpaceProtocol.Body?, any Error>) -> Result<FileReacquirer?, any Error> {
        switch outcome {
        case .success(.reply(let reply)?): reply.failure == nil ? .success({}) : .failure(Refused())
        case .success: .success(nil)
        case .failure(let error) where error is RemoteNoAnswer: .success(nil)
        case .failure(let error): .failure(error)
        }
    }

    /// Gives `ask` of `coordinator` its answer; a relinquish is then owed its reacquire.
    static func settle(_ ask: Int, of coordinator: inout Coordinator, with outcome: Result<SpaceProtocol.Body?, any Error>) {
        let answer = answer(outcome)
        coordinator.asks[ask].answer = answer
        guard case .success(.some) = answer else { return }
        let target = coordinator.asks[ask].target
        coordinator.owed.insert(target)
        coordinator.relinquishes[target] = coordinator.asks[ask].re
    }

    /// The outcome of request `id` of process `index` is in: the production table says
    /// which ask it ends, if any still waits for it.
    func arrive(_ id: UInt64, _ outcome: Result<SpaceProtocol.Body?, any Error>, in index: Int) {
        guard let ref = processes[index].replies.arrive(id, outcome),
              let position = processes[index].coordinators.firstIndex(where: { $0.id == ref.coordinator }) else { return }
        Self.settle(ref.ask, of: &processes[index].coordinators[position], with: outcome)
    }

    func startCoordination(in index: Int) {
        started += 1
        var paths = [Self.items.randomElement(using: &random)!]
        if Int.random(in: 0 ..< 4, using: &random) == 0, let second = Self.items.filter({ $0 != paths[0] }).randomElement(using: &random) {
            paths.append(second)
        }
        let write = Bool.random(using: &random)
        let items = paths.map { path in
            let url = URL(fileURLWithPath: path)
            let request: ItemRequest = write ? .writing(url, path == "/d" ? .forDeleting : []) : .reading(url, [])
            return CoordinationMachine.Item(path: FilePath(path), request: request, url: url, subtree: write && path == "/d")
        }
        var machine = CoordinationMachine(items: items, owner: nil)
        let first = machine.start()
        let coordinator = Coordinator(id: started, paths: paths, write: write, machine: machine, action: first, since: now)
        log("\(processes[index].name) starts #\(coordinator.id) \(write ? "write" : "read") \(paths.joined(separator: " "))")
        processes[index].coordinators.append(coordinator)
    }

    func canAdvance(_ coordinator: Coordinator, in index: Int) -> Bool {
        switch coordinator.phase {
        case .rules: coordinator.rulesID == nil || processes[index].requests.rules.isGranted(coordinator.rulesID!)
        case .kernel, .driving, .accessing: true
        case .asking: coordinator.asks.allSatisfy { $0.answer != nil }
        case .done: false
        }
    }

    func advance(_ position: Int, in index: Int) {
        var coordinator = processes[index].coordinators[position]
        defer { if processes[index].alive { processes[index].coordinators[position] = coordinator } }
        switch coordinator.phase {
        case .rules:
            if let id = coordinator.rulesID {
                precondition(processes[index].requests.rules.isGranted(id))
            } else {
                let (id, granted) = processes[index].requests.submit(coordinator.claims, purpose: "#\(coordinator.id)", owner: Self.owner)
                coordinator.rulesID = id
                guard granted else {
                    // Its task parks at once; a later release resumes it.
                    let parked = processes[index].requests.park(id, coordinator.id)
                    precondition({ if case .waiting = parked { true } else { false } }())
                    return
                }
            }
            coordinator.phase = .kernel
            coordinator.since = now
        case .kernel:
            let plan = SpaceLocks.plan(for: coordinator.claims)
            guard case .held(let held)? = try? SpaceLocks.attempt(plan, queued: &coordinator.queued, calls: kernel.process(index)) else {
                if now - coordinator.since > options.claimTimeout {
                    log("\(processes[index].name) #\(coordinator.id) timed out waiting for a claim")
                    releaseClaims(&coordinator, in: index)
                    coordinator.action = coordinator.machine.handle(.failed(CancellationError()))
                    coordinator.phase = .driving
                }
                return
            }
            coordinator.held = held
            coordinator.holds = true
            log("\(processes[index].name) #\(coordinator.id) claimed")
            coordinator.action = coordinator.machine.handle(.granted(coordinator.rulesID!, current: nil))
            coordinator.phase = .driving
        case .asking:
            coordinator.phase = .driving
            coordinator.action = coordinator.machine.handle(.answered(coordinator.asks.map { $0.answer! }))
            coordinator.asks = []
        case .driving:
            carryOut(&coordinator, in: index)
        case .accessing:
            coordinator.phase = .driving
            if coordinator.write { coordinator.toTell = coordinator.itemPresenters }
            coordinator.action = coordinator.machine.handle(.accessorEnded(ran: true, moved: [], deferred: []))
        case .done:
            break
        }
    }

    /// Carries out the machine's next action, as the production driver does, on the
    /// simulated space.
    func carryOut(_ coordinator: inout Coordinator, in index: Int) {
        let me = processes[index].name
        switch coordinator.action {
        case .takeClaims:
            coordinator.phase = .rules
        case .lookUpPresenters(let accesses):
            var registry = PresenterRegistry()
            coordinator.stubs = []
            for (number, presenter) in presenters.enumerated() where presenter.process == index {
                let stub = SimulatedPresenter(.local(number), path: presenter.path)
                coordinator.stubs.append(stub)
                registry.add(stub, at: FilePath(presenter.path))
            }
            for record in space.presenterRecords where record.process != me {
                let stub = SimulatedPresenter(.remote(process: record.process, number: record.number, path: record.path), path: record.path)
                coordinator.stubs.append(stub)
                registry.add(stub, at: FilePath(record.path))
            }
            let found = accesses.map { registry.concerned(by: $0.path, subtree: $0.subtree, excluding: nil) }
            // A write that is not a deletion owes its item's presenters a `didChange`.
            coordinator.itemPresenters = Set(zip(coordinator.machine.items, found).flatMap { item, concerned in
                item.isWrite && !item.writingOptions.contains(.forDeleting)
                    ? concerned.item.map { ($0.presenter as! SimulatedPresenter).target } : []
            })
            coordinator.action = coordinator.machine.handle(.presenters(found, silent: [:], prepared: []))
        case .ask(let steps):
            coordinator.asks = []
            for steps in steps {
                let target = (steps.entry.presenter as! SimulatedPresenter).target
                var ask = Ask(target: target, since: now)
                coordinator.asked[target, default: 0] += 1
                switch target {
                case .local(let presenter):
                    presenters[presenter].relinquished += 1
                    ask.answer = .success({})
                case .remote(let process, let number, let path):
                    (ask.re, ask.id) = (processes[index].newID(), processes[index].newID())
                    let then: SpaceProtocol.Relinquish.FollowUp? = steps.accommodateDeletion ? .accommodateDeletion : steps.save ? .save : nil
                    let request = SpaceProtocol.Relinquish(access: steps.kind == .writing ? .write : .read, purpose: "#\(coordinator.id)",
                                                           re: ask.re, then: then, subitemDeletions: steps.subitemDeletions)
                    // As `AwaitedReplies.request`: registered, sent, then the task parks
                    // (resumed at once if the outcome is in already).
                    processes[index].replies.register(ask.id, target: process)
                    let sent = send(.presenter(.init(presenter: number, path: FilePath(path), call: .relinquish(request))),
                                    from: index, to: process, id: ask.id, mayFail: true)
                    if sent, isAlive(process) {
                        // Answered by its reply, its process's end, or the deadline.
                    } else if space.mailboxes[process] == nil || !isAlive(process) {
                        // Gone, or dead after the write: skipped, and cleaned up after.
                        cleanUp(process)
                        _ = processes[index].replies.arrive(ask.id, .success(nil))
                    } else {
                        _ = processes[index].replies.arrive(ask.id, .failure(NotDelivered()))
                    }
                    coordinator.asks.append(ask)
                    let ref = AskRef(coordinator: coordinator.id, ask: coordinator.asks.count - 1)
                    if case .resume(let outcome) = processes[index].replies.park(ask.id, ref) {
                        Self.settle(ref.ask, of: &coordinator, with: outcome)
                    }
                    continue
                }
                if case .success(.some)? = ask.answer { coordinator.owed.insert(target) }
                coordinator.asks.append(ask)
            }
            coordinator.phase = .asking
        case .checkExistence(let paths), .checkExistenceAfter(let paths):
            coordinator.action = coordinator.machine.handle(.existence(paths.map { _ in true }))
        case .updateIntents, .suppress, .endSuppressing:
            coordinator.action = coordinator.machine.handle(.done)
        case .checkCancellation:
            // A cancel() after this check does not stop the accessor (as in production).
            coordinator.cancelledAtCheck = coordinator.cancelled
            coordinator.action = coordinator.machine.handle(.cancellation(coordinator.cancelled ? .coordinator : nil))
        case .runAccessor:
            if coordinator.cancelledAtCheck { cancelledButRan.append("#\(coordinator.id) in \(me)") }
            log("\(me) #\(coordinator.id) accesses")
            coordinator.phase = .accessing
        case .tell(let messages):
            for message in messages {
                guard case .didChange(let entry) = message else { continue }
                let target = (entry.presenter as! SimulatedPresenter).target
                coordinator.toTell.remove(target)
                switch target {
                case .local(let presenter): presenters[presenter].heardChanges += 1
                case .remote(let process, let number, let path):
                    tell(.presenter(.init(presenter: number, path: FilePath(path), call: .didChange)), from: index, to: process)
                }
            }
            coordinator.action = coordinator.machine.handle(.done)
        case .giveBack(let reacquirers):
            for (entry, _) in reacquirers {
                let target = (entry.presenter as! SimulatedPresenter).target
                coordinator.owed.remove(target)
                switch target {
                case .local(let presenter): presenters[presenter].relinquished -= 1
                case .remote(let process, let number, let path):
                    guard let re = coordinator.relinquishes[target] else { continue }
                    tell(.presenter(.init(presenter: number, path: FilePath(path), call: .reacquire(re: re))), from: index, to: process)
                }
            }
            coordinator.action = coordinator.machine.handle(.done)
        case .release:
            if !coordinator.owed.isEmpty || !coordinator.toTell.isEmpty {
                releasedEarly.append("#\(coordinator.id) in \(me) released its claims owing \(coordinator.owed.count) reacquirers and "
                    + "\(coordinator.toTell.count) didChange")
            }
            releaseClaims(&coordinator, in: index)
            coordinator.action = coordinator.machine.handle(.done)
        case .end(let error):
            coordinator.phase = .done(error.map { "failed: \(type(of: $0))" } ?? "ok")
            log("\(me) #\(coordinator.id) ends: \(coordinator.phase)")
        }
    }

    /// The claims go: the kernel's bytes, then the request in the process's rules (or its
    /// wait withdrawn).
    func releaseClaims(_ coordinator: inout Coordinator, in index: Int) {
        kernel.process(index).release(coordinator.held ?? SpaceLocks.Held(bytes: coordinator.queued))
        coordinator.held = nil
        coordinator.queued = []
        coordinator.holds = false
        guard let id = coordinator.rulesID else { return }
        coordinator.rulesID = nil
        if processes[index].requests.rules.isGranted(id) {
            // The tasks its end grants were parked; they find their grant when they next run.
            for waiter in processes[index].requests.release(id) { log("\(processes[index].name) #\(waiter) granted") }
        } else {
            let ended = processes[index].requests.withdraw(id, because: CancellationError())
            precondition(ended.failed.map(\.0) == [coordinator.id], "the withdrawn task is resumed with its error")
        }
    }

    /// A reply arrived.
    func resolve(_ reply: SpaceProtocol.Reply, in index: Int) {
        arrive(reply.re, .success(.reply(reply)), in: index)
    }

    /// Asks not answered within the presenter timeout are given up (the policy proceeds),
    /// with a `reacquire` posted: the presenter may relinquish later, and must then get
    /// its item back (as `RemotePresenter.relinquish` does).
    func timeOut() {
        for index in liveIndices where processes[index].stoppedUntil <= now {
            for position in processes[index].coordinators.indices {
                for ask in processes[index].coordinators[position].asks.indices {
                    let waiting = processes[index].coordinators[position].asks[ask]
                    guard waiting.answer == nil, now - waiting.since > options.presenterTimeout,
                          case .remote(let process, let number, let path) = waiting.target else { continue }
                    // As `AwaitedReplies`' deadline: the request ends with no answer.
                    arrive(waiting.id, .failure(RemoteNoAnswer()), in: index)
                    log("\(processes[index].name) #\(processes[index].coordinators[position].id) gives up on \(process)")
                    tell(.presenter(.init(presenter: number, path: FilePath(path), call: .reacquire(re: waiting.re))), from: index, to: process)
                }
            }
        }
    }

    /// A coordinator's `cancel()` while its coordination is under way.
    func cancel(in index: Int) -> Bool {
        guard let position = processes[index].coordinators.indices.filter({ processes[index].coordinators[$0].holds })
            .randomElement(using: &random) else { return false }
        processes[index].coordinators[position].cancelled = true
        log("\(processes[index].name) cancels #\(processes[index].coordinators[position].id)")
        return true
    }

    // MARK: Invariants of the coordinations

    /// No two coordinations hold conflicting claims at once, in one process or across
    /// processes; no presenter is asked twice by one coordination; no cancelled
    /// coordination runs its accessor; none releases its claims before its presenters got
    /// their `didChange` and their items back.
    func checkExclusion() throws(Failure) {
        if let ran = cancelledButRan.first { throw fail("\(ran) was cancelled before its accessor, and the accessor ran") }
        if let early = releasedEarly.first { throw fail(early) }
        var holding: [(process: Int, coordinator: Coordinator)] = []
        for index in liveIndices {
            for coordinator in processes[index].coordinators where coordinator.holds {
                if let (target, count) = coordinator.asked.first(where: { $0.value > 1 }) {
                    throw fail("#\(coordinator.id) in \(processes[index].name) asked \(target) \(count) times")
                }
                holding.append((index, coordinator))
            }
        }
        for (a, first) in holding.enumerated() {
            for second in holding[(a + 1)...] {
                for x in first.coordinator.claims {
                    for y in second.coordinator.claims where CoordinationRules.conflict(x, y) {
                        throw fail("#\(first.coordinator.id) in \(processes[first.process].name) and #\(second.coordinator.id) in "
                            + "\(processes[second.process].name) hold \(x.path) and \(y.path) at once")
                    }
                }
            }
        }
    }
}
