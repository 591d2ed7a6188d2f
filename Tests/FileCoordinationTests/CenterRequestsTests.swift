import SystemPackage
import Testing
@testable import FileCoordination

/// The center's requests from submission to release (``CenterRequests``), step by step
/// and at random: every task that waits is resumed exactly once.
@Suite("Center requests")
struct CenterRequestsTests {
    typealias Requests = CenterRequests<Int>
    typealias Claim = CoordinationRules.Claim
    final class Owner {}
    let a = Owner(), b = Owner()
    struct Withdrawn: Error {}

    @Test("a free request is granted with nothing kept; a blocked one is resumed by the release")
    func grantedThenResumed() {
        var requests = Requests()
        let write = [Claim(path: "/f", access: .writing)]
        let first = requests.submit(write, purpose: "1", owner: ObjectIdentifier(a))
        #expect(first.granted && requests.trackedCount == 0)
        let second = requests.submit(write, purpose: "2", owner: ObjectIdentifier(b))
        #expect(!second.granted && requests.trackedCount == 1)
        let parked = requests.park(second.id, 2)
        guard case .waiting = parked else { Issue.record("expected to wait, got \(parked)"); return }
        #expect(requests.release(first.id) == [2])
        #expect(requests.trackedCount == 0 && requests.rules.isGranted(second.id))
        #expect(requests.release(second.id).isEmpty)
    }

    @Test("granted before its task parked: the task goes on at once")
    func grantedBeforePark() {
        var requests = Requests()
        let write = [Claim(path: "/f", access: .writing)]
        let first = requests.submit(write, purpose: "1", owner: ObjectIdentifier(a))
        let second = requests.submit(write, purpose: "2", owner: ObjectIdentifier(a))
        #expect(requests.release(first.id).isEmpty, "nothing parked yet")
        let parked = requests.park(second.id, 2)
        guard case .granted = parked else { Issue.record("expected granted, got \(parked)"); return }
    }

    @Test("withdrawn before its task parked: the task fails when it parks, and the next in line is granted")
    func withdrawnBeforePark() {
        var requests = Requests()
        let first = requests.submit([Claim(path: "/f", access: .reading)], purpose: "1", owner: ObjectIdentifier(a))
        let writer = requests.submit([Claim(path: "/f", access: .writing)], purpose: "2", owner: ObjectIdentifier(a))
        let reader = requests.submit([Claim(path: "/f", access: .reading)], purpose: "3", owner: ObjectIdentifier(b))
        #expect(!writer.granted && !reader.granted, "the reader waits behind the writer")
        let readerParked = requests.park(reader.id, 3)
        guard case .waiting = readerParked else { Issue.record("expected to wait"); return }
        let withdrawn = requests.withdraw(writer.id, because: Withdrawn())
        #expect(withdrawn.failed.isEmpty, "the writer's task has not parked")
        #expect(withdrawn.granted == [3], "the reader no longer waits behind it")
        let parked = requests.park(writer.id, 2)
        guard case .failed(let error) = parked else { Issue.record("expected a failure, got \(parked)"); return }
        #expect(error is Withdrawn)
        _ = requests.release(first.id)
        _ = requests.release(reader.id)
        #expect(requests.trackedCount == 0)
    }

    @Test("an owner's requests: those waiting here and those taking kernel locks; status sees both")
    func ownersAndStatus() {
        var requests = Requests()
        let held = requests.submit([Claim(path: "/f", access: .writing)], purpose: "1", owner: ObjectIdentifier(a))
        let waiting = requests.submit([Claim(path: "/f", access: .reading)], purpose: "2", owner: ObjectIdentifier(a))
        let kernel = requests.submit([Claim(path: "/g", access: .writing)], purpose: "3", owner: ObjectIdentifier(a))
        requests.beginTakingKernelClaims(kernel.id, [Claim(path: "/g", access: .writing)], owner: ObjectIdentifier(a))
        let owned = requests.requests(of: ObjectIdentifier(a))
        #expect(owned.waiting == [waiting.id] && owned.takingKernelClaims == [kernel.id])
        #expect(requests.requests(of: ObjectIdentifier(b)).waiting.isEmpty)
        let status = requests.statusClaims
        #expect(status.held.map(\.path) == ["/f"])
        #expect(Set(status.waiting.map(\.path)) == ["/f", "/g"])
        requests.endTakingKernelClaims(kernel.id)
        #expect(requests.statusClaims.held.count == 2)
        _ = requests.release(kernel.id)
        _ = requests.release(held.id)
    }

    @Test("a move carries a waiting request's intents to the new path")
    func moveUpdatesIntents() {
        var requests = Requests()
        let mover = requests.submit([Claim(path: "/old", access: .writing, scope: .subtree)], purpose: "1", owner: ObjectIdentifier(a))
        let intent = FileAccessIntent.readingIntent(with: FilePath("/old/x").fileURL)
        let waiting = requests.submit([Claim(path: "/old/x", access: .reading)], purpose: "2", owner: ObjectIdentifier(b),
                                      intents: [("/old/x", intent)])
        #expect(mover.granted && !waiting.granted)
        let updates = requests.move(from: "/old", to: "/new")
        #expect(updates.map(\.1) == ["/new/x"] && updates.first?.0 === intent)
    }

    /// A task's life as the center drives it.
    enum Task: Equatable { case submitted, withdrawn, parked, running, failed, done }

    @Test("randomized: every task is resumed once, only when parked, and granted only by the rules", arguments: 0 ..< 12)
    func randomized(seed: Int) {
        var generator = SeededGenerator(seed: UInt64(seed) &+ 1000)
        var requests = Requests()
        let owners = [ObjectIdentifier(a), ObjectIdentifier(b)]
        let paths: [FilePath] = ["/r", "/r/a", "/s"]
        var tasks: [Int: Task] = [:]
        var ids: [Int: Requests.RequestID] = [:]
        var ownerOf: [Int: ObjectIdentifier] = [:]
        func resumed(_ granted: [Int], _ failed: [(Int, any Error)]) {
            for task in granted {
                #expect(tasks[task] == .parked, "task \(task) resumed while \(String(describing: tasks[task]))")
                #expect(requests.rules.isGranted(ids[task]!))
                tasks[task] = .running
            }
            for (task, _) in failed {
                #expect(tasks[task] == .parked, "task \(task) failed while \(String(describing: tasks[task]))")
                tasks[task] = .failed
            }
        }
        func park(_ task: Int) {
            let parked = requests.park(ids[task]!, task)
            let wasWithdrawn = tasks[task] == .withdrawn
            switch parked {
            case .waiting: #expect(!wasWithdrawn); tasks[task] = .parked
            case .granted: #expect(!wasWithdrawn && requests.rules.isGranted(ids[task]!)); tasks[task] = .running
            case .failed: #expect(wasWithdrawn); tasks[task] = .failed
            }
        }
        func withdraw(_ task: Int) {
            if tasks[task] == .submitted && !requests.rules.isGranted(ids[task]!) { tasks[task] = .withdrawn }
            let result = requests.withdraw(ids[task]!, because: Withdrawn())
            resumed(result.granted, result.failed)
        }
        for step in 0 ..< 300 {
            let pick = { (state: Task) in tasks.filter { $0.value == state }.keys.sorted().randomElement(using: &generator) }
            switch Int.random(in: 0 ..< 10, using: &generator) {
            case 0 ..< 3:
                let claims = [Claim(path: paths.randomElement(using: &generator)!,
                                    access: Bool.random(using: &generator) ? .reading : .writing)]
                let owner = owners.randomElement(using: &generator)!
                let (id, granted) = requests.submit(claims, purpose: "\(step)", owner: owner)
                ids[step] = id
                ownerOf[step] = owner
                tasks[step] = granted ? .running : .submitted
            case 3 ..< 5:
                if let task = [pick(.submitted), pick(.withdrawn)].compactMap({ $0 }).randomElement(using: &generator) { park(task) }
            case 5 ..< 8:
                if let task = pick(.running) { resumed(requests.release(ids[task]!), []); tasks[task] = .done }
            case 8:
                if let task = [pick(.submitted), pick(.parked)].compactMap({ $0 }).randomElement(using: &generator) { withdraw(task) }
            default:
                // A coordinator's cancel(): every request of one owner still waiting.
                let owner = owners.randomElement(using: &generator)!
                let raws = Set(requests.requests(of: owner).waiting.map(\.raw))
                let expected = Set(tasks.filter { [.submitted, .parked].contains($0.value) && ownerOf[$0.key] == owner
                    && !requests.rules.isGranted(ids[$0.key]!) }.map { ids[$0.key]!.raw })
                #expect(raws == expected)
                for task in tasks.keys.sorted() where raws.contains(ids[task]!.raw) { withdraw(task) }
            }
        }
        // Drain: every task parks, and releasing the running ones ends them all.
        for task in tasks.keys.sorted() where [.submitted, .withdrawn].contains(tasks[task]) { park(task) }
        while let task = tasks.first(where: { $0.value == .running })?.key {
            resumed(requests.release(ids[task]!), [])
            tasks[task] = .done
        }
        #expect(tasks.values.allSatisfy { $0 == .done || $0 == .failed })
        #expect(requests.trackedCount == 0 && requests.rules.grantedCount == 0 && requests.rules.waitingCount == 0)
    }
}
