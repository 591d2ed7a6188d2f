import AsyncFileIO
import Foundation
import SystemPackage
import Testing
@testable import FileCoordination

/// One coordination as its machine decides it, driven synchronously: each test answers
/// the machine's actions and reads the actions back as words, in order. Every row of
/// Apple's order table (docs/design.md, "Message order"), and every way a coordination
/// ends early.
@Suite("Coordination machine")
struct CoordinationMachineTests {
    final class Stub: FilePresenter, CustomStringConvertible {
        let presentedItemURL: URL?
        init(_ path: String) { presentedItemURL = URL(fileURLWithPath: path) }
        var description: String { presentedItemURL!.path }
    }

    struct Refused: Error {}

    let file = Stub("/d/f"), folder = Stub("/d"), inner = Stub("/d/f/x"), own = Stub("/d/f")
    let id = CoordinationRules.RequestID(raw: 7)

    func entry(_ stub: Stub) -> PresenterRegistry.Entry {
        PresenterRegistry.Entry(presenter: stub, path: FilePath(stub.presentedItemURL!.path))
    }

    func concerned(item: [Stub] = [], containers: [Stub] = [], inside: [Stub] = []) -> PresenterRegistry.Concerned {
        PresenterRegistry.Concerned(item: item.map(entry), containers: containers.map(entry), inside: inside.map(entry))
    }

    func item(_ request: ItemRequest, subtree: Bool = false) -> CoordinationMachine.Item {
        .init(path: FilePath(request.url.path), request: request, url: request.url, subtree: subtree)
    }

    func read(_ path: String = "/d/f", _ options: FileCoordinator.ReadingOptions = []) -> CoordinationMachine.Item {
        item(.reading(URL(fileURLWithPath: path), options))
    }

    func write(_ path: String = "/d/f", _ options: FileCoordinator.WritingOptions = [], subtree: Bool = false) -> CoordinationMachine.Item {
        item(.writing(URL(fileURLWithPath: path), options), subtree: subtree)
    }

    static let reacquirer: FileReacquirer = {}

    /// Runs a coordination from its start to its end: `answer` answers what it chooses to
    /// (nil: the usual answer), the rest gets the answer of an untroubled run. Returns
    /// the actions as words.
    func run(_ items: [CoordinationMachine.Item], owner: Stub? = nil, intents: Int = 0,
             presenters: [PresenterRegistry.Concerned],
             answer: (CoordinationMachine.Action) -> CoordinationMachine.Event? = { _ in nil }) -> [String] {
        var machine = CoordinationMachine(items: items, owner: owner.map(ObjectIdentifier.init), intents: intents)
        var action = machine.start()
        var words: [String] = []
        for _ in 0 ..< 40 {
            words.append(Self.words(action))
            if case .end = action { return words }
            let event = answer(action) ?? usual(action, presenters: presenters)
            action = machine.handle(event)
        }
        Issue.record("no end after 40 actions: \(words)")
        return words
    }

    func usual(_ action: CoordinationMachine.Action, presenters: [PresenterRegistry.Concerned]) -> CoordinationMachine.Event {
        switch action {
        case .takeClaims: .granted(id, current: nil)
        case .lookUpPresenters: .presenters(presenters, silent: [:], prepared: [])
        case .ask(let steps): .answered(steps.map { _ in .success(Self.reacquirer) })
        case .checkExistence(let paths), .checkExistenceAfter(let paths): .existence(paths.map { _ in true })
        case .checkCancellation: .cancellation(nil)
        case .runAccessor: .accessorEnded(ran: true, moved: [], deferred: [])
        case .updateIntents, .suppress, .endSuppressing, .tell, .giveBack, .release, .end: .done
        }
    }

    static func words(_ action: CoordinationMachine.Action) -> String {
        func name(_ entry: PresenterRegistry.Entry) -> String { "\(entry.presenter)" }
        switch action {
        case .takeClaims(let claims):
            return "claim " + claims.map { "\($0.access == .writing ? "write" : "read") \($0.path)\($0.scope == .subtree ? "/…" : "")" }
                .joined(separator: ", ")
        case .updateIntents(let paths): return "intents " + paths.map(\.string).joined(separator: ", ")
        case .lookUpPresenters(let accesses): return "look up " + accesses.map(\.path.string).joined(separator: ", ")
        case .ask(let steps):
            return "ask " + steps.map { steps in
                var words = [name(steps.entry), steps.kind == .writing ? "toWriter" : "toReader"]
                if steps.save { words.append("save") }
                if steps.accommodateDeletion { words.append("accommodateDeletion") }
                words += steps.subitemDeletions.map { "accommodateSubitemDeletion \($0)" }
                return words.joined(separator: " ")
            }.joined(separator: "; ")
        case .checkExistence(let paths): return "exists? " + paths.map(\.string).joined(separator: ", ")
        case .suppress(let pairs): return "suppress \(pairs.count)"
        case .checkCancellation: return "cancelled?"
        case .runAccessor(let urls): return "accessor " + urls.map(\.path).joined(separator: ", ")
        case .checkExistenceAfter(let paths): return "exists after? " + paths.map(\.string).joined(separator: ", ")
        case .endSuppressing: return "end suppressing"
        case .tell(let messages):
            return "tell " + messages.map { message in
                switch message {
                case .didChange(let entry): "didChange \(name(entry))"
                case .didMove(let entry, let path): "didMove \(name(entry)) \(path)"
                case .subitemDidAppear(let entry, let path): "subitemDidAppear \(name(entry)) \(path)"
                case .subitemDidChange(let entry, let path): "subitemDidChange \(name(entry)) \(path)"
                case .subitemDidMove(let entry, let from, let to): "subitemDidMove \(name(entry)) \(from) \(to)"
                }
            }.joined(separator: "; ")
        case .giveBack(let reacquirers): return "give back " + reacquirers.map { name($0.0) }.joined(separator: ", ")
        case .release: return "release"
        case .end(let error?): return "end: \(error is CancellationError ? "cancelled" : "\(type(of: error))")"
        case .end(nil): return "end"
        }
    }

    // MARK: The order table, row by row

    @Test("read: relinquish to a reader and save before; after, only the reacquirers, then the claims go")
    func readRow() {
        #expect(run([read()], presenters: [concerned(item: [file], containers: [folder])]) == [
            "claim read /d/f", "look up /d/f", "ask /d/f toReader save; /d toReader save", "cancelled?", "accessor /d/f",
            "give back /d/f, /d", "release", "end",
        ])
        // withoutChanges: no save.
        #expect(run([read("/d/f", .withoutChanges)], presenters: [concerned(item: [file])])[2] == "ask /d/f toReader")
    }

    @Test("write: relinquish to a writer and save; after, didChange and subitemDidChange, then reacquirers, then release")
    func writeRow() {
        #expect(run([write()], presenters: [concerned(item: [file], containers: [folder])]) == [
            "claim write /d/f", "look up /d/f", "ask /d/f toWriter save; /d toWriter save", "exists? /d/f", "suppress 2",
            "cancelled?", "accessor /d/f", "exists after? /d/f", "end suppressing",
            "tell didChange /d/f; subitemDidChange /d /d/f", "give back /d/f, /d", "release", "end",
        ])
    }

    @Test("write of a new item: its containers hear subitemDidAppear")
    func newItem() {
        let words = run([write()], presenters: [concerned(containers: [folder])]) { action in
            if case .checkExistence = action { return .existence([false]) }
            return nil
        }
        #expect(words.contains("tell subitemDidAppear /d /d/f"), "\(words)")
    }

    @Test("delete: accommodate the deletion (containers: the subitem's); nothing after but the reacquirers")
    func deleteRow() {
        #expect(run([write("/d/f", .forDeleting, subtree: true)], presenters: [concerned(item: [file], containers: [folder], inside: [inner])]) == [
            "claim write /d/f/…", "look up /d/f",
            "ask /d/f toWriter accommodateDeletion; /d/f/x toWriter accommodateDeletion; /d toWriter accommodateSubitemDeletion /d/f",
            "suppress 3", "cancelled?", "accessor /d/f", "end suppressing", "give back /d/f, /d/f/x, /d", "release", "end",
        ])
    }

    @Test("move: relinquish and save; after, the accessor's didMove, no didChange for those it moved")
    func moveRow() {
        let moved = PendingMessage.didMove(entry(file), to: FilePath("/e/f"))
        let words = run([write("/d/f", .forMoving)], presenters: [concerned(item: [file], containers: [folder])]) { action in
            switch action {
            case .runAccessor: .accessorEnded(ran: true, moved: [ObjectIdentifier(file)], deferred: [moved])
            case .checkExistenceAfter: .existence([false])
            default: nil
            }
        }
        #expect(words[2] == "ask /d/f toWriter save; /d toWriter save")
        #expect(words.suffix(5) == ["end suppressing", "tell didMove /d/f /e/f", "give back /d/f, /d", "release", "end"])
    }

    @Test("the coordinator's own presenter is neither asked nor told, but its watch drops the write's events")
    func ownPresenter() {
        #expect(run([write()], owner: own, presenters: [concerned(item: [own])]) == [
            "claim write /d/f", "look up /d/f", "suppress 1", "cancelled?", "accessor /d/f", "end suppressing", "release", "end",
        ])
    }

    @Test("several items: one lookup, every presenter asked at once, a writer outranking a reader")
    func severalItems() {
        let words = run([read("/d/f"), write("/d/g")], presenters: [concerned(item: [file], containers: [folder]), concerned(containers: [folder])])
        #expect(words[1] == "look up /d/f, /d/g")
        #expect(words[2] == "ask /d/f toReader save; /d toWriter save")
        #expect(words.filter { $0.hasPrefix("look up") }.count == 1)
    }

    // MARK: Ending early

    @Test("claims not had: the coordination ends with nothing to give back")
    func claimsFail() {
        let words = run([write()], presenters: []) { action in
            if case .takeClaims = action { return .failed(CancellationError()) }
            return nil
        }
        #expect(words == ["claim write /d/f", "end: cancelled"])
    }

    @Test("a presenter refuses: the accessor never runs, the others get their reacquirers, then the claims go")
    func refusal() {
        let words = run([write()], presenters: [concerned(item: [file], containers: [folder])]) { action in
            if case .ask = action { return .answered([.success(Self.reacquirer), .failure(Refused())]) }
            return nil
        }
        #expect(words.suffix(3) == ["give back /d/f", "release", "end: Refused"])
        #expect(!words.contains { $0.hasPrefix("accessor") })
    }

    @Test("cancelled while presenters were asked: suppression ends, reacquirers run, claims go, and it throws")
    func cancelled() {
        for (cause, said) in [(CoordinationMachine.Cancellation.task, "end: cancelled"), (.coordinator, "end: FileCoordinationError")] {
            let words = run([write()], presenters: [concerned(item: [file])]) { action in
                if case .checkCancellation = action { return .cancellation(cause) }
                return nil
            }
            #expect(words.suffix(4) == ["end suppressing", "give back /d/f", "release", said])
            #expect(!words.contains { $0.hasPrefix("accessor") })
        }
    }

    @Test("the existence check fails: reacquirers run and the claims go")
    func existenceFails() {
        let words = run([write()], presenters: [concerned(containers: [folder])]) { action in
            if case .checkExistence = action { return .failed(Refused()) }
            return nil
        }
        #expect(words.suffix(3) == ["give back /d", "release", "end: Refused"])
    }

    @Test("the accessor never ran: no did… messages, but the moves reported are told; reacquirers, then release")
    func accessorNeverRan() {
        let moved = PendingMessage.subitemDidMove(entry(folder), from: FilePath("/d/f"), to: FilePath("/d/g"))
        let words = run([write()], presenters: [concerned(item: [file], containers: [folder])]) { action in
            if case .runAccessor = action { return .accessorEnded(ran: false, moved: [], deferred: [moved]) }
            return nil
        }
        #expect(words.suffix(5) == ["end suppressing", "tell subitemDidMove /d /d/f /d/g", "give back /d/f, /d", "release", "end"])
    }

    // MARK: Moves and batches

    @Test("items moved while the claims waited: the accessor and the intents get the new paths")
    func movedWhileWaiting() {
        let words = run([write()], intents: 1, presenters: [concerned()]) { action in
            if case .takeClaims = action { return .granted(id, current: [FilePath("/e/f")]) }
            return nil
        }
        #expect(words == ["claim write /d/f", "intents /e/f", "look up /e/f", "cancelled?", "accessor /e/f", "release", "end"])
    }

    @Test("in a batch: presenters prepared or silent are not asked; silent under a failing policy fails it at once")
    func batch() {
        let prepared = run([write()], presenters: [concerned(item: [file], containers: [folder])]) { action in
            if case .lookUpPresenters = action {
                return .presenters([concerned(item: [file], containers: [folder])], silent: [ObjectIdentifier(folder): nil],
                                   prepared: [ObjectIdentifier(file)])
            }
            return nil
        }
        #expect(!prepared.contains { $0.hasPrefix("ask") }, "\(prepared)")
        #expect(prepared.contains("tell didChange /d/f; subitemDidChange /d /d/f"))
        let error = FileCoordinationError(code: .timedOut, path: FilePath("/d"), operation: "relinquishPresentedItem(toWriter:)",
                                          message: "no answer")
        let failing = run([write()], presenters: []) { action in
            if case .lookUpPresenters = action {
                return .presenters([concerned(item: [file], containers: [folder])], silent: [ObjectIdentifier(folder): error], prepared: [])
            }
            return nil
        }
        #expect(failing == ["claim write /d/f", "look up /d/f", "release", "end: FileCoordinationError"])
    }
}
