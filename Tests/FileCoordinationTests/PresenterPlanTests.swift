import Foundation
import SystemPackage
import Testing
@testable import FileCoordination

/// Apple's order table (docs/design.md, "Message order") as the planner gives it: no
/// presenter, no I/O, one case per row.
@Suite("Presenter plan")
struct PresenterPlanTests {
    final class Stub: FilePresenter {
        let presentedItemURL: URL?
        init(_ path: String) { presentedItemURL = URL(fileURLWithPath: path) }
    }

    let file = Stub("/d/f"), folder = Stub("/d"), inner = Stub("/d/f/x")
    func entry(_ stub: Stub) -> PresenterRegistry.Entry {
        PresenterRegistry.Entry(presenter: stub, path: FilePath(stub.presentedItemURL!.path))
    }
    func concerned(item: [Stub] = [], containers: [Stub] = [], inside: [Stub] = []) -> PresenterRegistry.Concerned {
        PresenterRegistry.Concerned(item: item.map(entry), containers: containers.map(entry), inside: inside.map(entry))
    }
    func read(_ options: FileCoordinator.ReadingOptions = []) -> ItemRequest { .reading(URL(fileURLWithPath: "/d/f"), options) }
    func write(_ options: FileCoordinator.WritingOptions = []) -> ItemRequest { .writing(URL(fileURLWithPath: "/d/f"), options) }

    /// (kind, save, accommodate, subitem deletions) of each presenter, in order.
    func summary(_ plan: PresenterPlan) -> [String] {
        plan.steps.map { steps in
            var words = [steps.kind == .writing ? "toWriter" : "toReader"]
            if steps.save { words.append("save") }
            if steps.accommodateDeletion { words.append("accommodateDeletion") }
            words += steps.subitemDeletions.map { "accommodateSubitemDeletion \($0)" }
            return words.joined(separator: " ")
        }
    }

    @Test("read: relinquish to a reader, then save (not with withoutChanges)")
    func readRow() {
        var plan = PresenterPlan()
        plan.add(FilePath("/d/f"), read(), concerned: concerned(item: [file], containers: [folder]))
        #expect(summary(plan) == ["toReader save", "toReader save"])
        var quiet = PresenterPlan()
        quiet.add(FilePath("/d/f"), read(.withoutChanges), concerned: concerned(item: [file]))
        #expect(summary(quiet) == ["toReader"])
    }

    @Test("write: relinquish to a writer, then save; replacing saves nothing")
    func writeRow() {
        var plan = PresenterPlan()
        plan.add(FilePath("/d/f"), write(), concerned: concerned(item: [file], containers: [folder]))
        #expect(summary(plan) == ["toWriter save", "toWriter save"])
        var replacing = PresenterPlan()
        replacing.add(FilePath("/d/f"), write(.forReplacing), concerned: concerned(item: [file]))
        #expect(summary(replacing) == ["toWriter"])
    }

    @Test("delete: the item and what is inside accommodate the deletion; containers hear of a subitem deletion")
    func deleteRow() {
        var plan = PresenterPlan()
        plan.add(FilePath("/d/f"), write(.forDeleting), concerned: concerned(item: [file], containers: [folder], inside: [inner]))
        #expect(summary(plan) == ["toWriter accommodateDeletion", "toWriter accommodateDeletion", "toWriter accommodateSubitemDeletion /d/f"])
    }

    @Test("one presenter concerned twice is asked once: a writer outranks a reader, the steps add up")
    func mergedSteps() {
        var plan = PresenterPlan()
        plan.add(FilePath("/d/f"), read(.withoutChanges), concerned: concerned(containers: [folder]))
        plan.add(FilePath("/d/g"), .writing(URL(fileURLWithPath: "/d/g"), .forDeleting), concerned: concerned(containers: [folder]))
        #expect(summary(plan) == ["toWriter accommodateSubitemDeletion /d/g"])
        #expect(plan.steps.first?.path == FilePath("/d/g"))
    }

    @Test("a presenter the batch does not ask again is left out")
    func skipped() {
        var plan = PresenterPlan()
        plan.add(FilePath("/d/f"), write(), concerned: concerned(item: [file], containers: [folder])) { $0.id != ObjectIdentifier(self.folder) }
        #expect(summary(plan) == ["toWriter save"])
    }

    /// What `after` tells, as words, in order.
    func told(_ options: FileCoordinator.WritingOptions = [], existedBefore: Bool? = true, existsAfter: Bool = true,
              moved: Set<ObjectIdentifier> = [], containers: [Stub]? = nil) -> [String] {
        let messages = PresenterPlan.after(write: FilePath("/d/f"), options: options, existedBefore: existedBefore,
                                           concerned: concerned(item: [file], containers: containers ?? [folder]), moved: moved,
                                           existsAfter: existsAfter)
        let words = messages.map { message -> String in
            switch message {
            case .didChange(let entry): "didChange \(entry.path)"
            case .subitemDidAppear(let entry, let path): "subitemDidAppear \(entry.path) \(path)"
            case .subitemDidChange(let entry, let path): "subitemDidChange \(entry.path) \(path)"
            case .didMove, .subitemDidMove: "move"
            }
        }
        return words
    }

    @Test("after a write: didChange for the item, subitemDidChange for containers; a new item appears")
    func afterWrite() {
        #expect(told() == ["didChange /d/f", "subitemDidChange /d /d/f"])
        #expect(told(existedBefore: false) == ["didChange /d/f", "subitemDidAppear /d /d/f"])
        #expect(told(existsAfter: false) == ["didChange /d/f"])
        #expect(told(containers: []) == ["didChange /d/f"])
    }

    @Test("after a move, the item's presenters hear nothing here (the move sends didMove); after a deletion, nobody")
    func afterMoveAndDelete() {
        #expect(told(.forMoving) == [])
        #expect(told(.forMoving, existedBefore: false) == ["subitemDidAppear /d /d/f"])
        #expect(told(.forDeleting) == [])
        #expect(told(moved: [ObjectIdentifier(file)]) == ["subitemDidChange /d /d/f"])
    }
}
