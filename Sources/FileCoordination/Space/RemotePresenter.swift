@_spi(FileCoordinationInternal) import AsyncFileIO
import CFileCoordinationShims
@_spi(FileCoordinationInternal) import FileWatching
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// How long a request to another process's presenter may wait for its answer: set by
/// ``PresenterMessenger/bounded(_:_:of:late:_:)`` around the callback, which then runs in
/// the coordinating task itself (a remote callback is a request and a reply, so it cannot
/// hang the task past its deadline).
enum RemoteDeadline {
    @TaskLocal static var timeout: Duration?
}

/// A request to another process was not answered within ``RemoteDeadline/timeout``.
struct RemoteNoAnswer: Error {}

/// A presenter registered by another process, as this process sees it: each callback is
/// a request into that process's mailbox, answered through this process's mailbox.
final class RemotePresenter: FilePresenter, CustomStringConvertible {
    let mail: SpaceMail
    let process: String
    let number: UInt64
    let path: FilePath
    let pid: Int32

    init(mail: SpaceMail, process: String, number: UInt64, path: FilePath, pid: Int32) {
        self.mail = mail
        self.process = process
        self.number = number
        self.path = path
        self.pid = pid
    }

    var presentedItemURL: URL? { path.fileURL }
    var description: String { "the presenter of \(path) in process \(pid)" }

    private func message(_ kind: String, path: FilePath? = nil, to: FilePath? = nil) -> SpaceMessage {
        var message = SpaceMessage(kind: kind)
        message.set("presenter", "\(number)")
        message.set("path", path ?? self.path)
        if let to { message.set("to", to) }
        return message
    }

    /// Sends and waits; throws the presenter's own error text when it refused.
    private func ask(_ message: SpaceMessage) async throws -> Bool {
        guard let reply = try await mail.request(message, to: process) else { return false }
        if reply.string("result") == "error" {
            throw FileCoordinationError(code: .presenterFailed, path: path, operation: message.kind,
                                        message: "\(self) refused: \(reply.string("text") ?? "no reason given")")
        }
        return true
    }

    /// Posts a message that has no answer: the coordination waits for its write once, at
    /// its end (``SpaceMail/flush()``).
    private func tell(_ message: SpaceMessage) async {
        mail.tell(message, to: process)
    }

    /// What a presenter does after relinquishing, in the same request.
    enum FollowUp: String { case save, accommodateDeletion = "accommodate-deletion" }

    /// Relinquish, then the follow-up step and the subitem deletions, in one round trip.
    /// Returns nil when the presenter's process is gone.
    func relinquish(_ item: FilePath, kind: FileAccessRequest.Kind, purpose: String, then followUp: FollowUp? = nil,
                    subitemDeletions: [FilePath] = []) async throws -> FileReacquirer? {
        var message = message("relinquish", path: item)
        message.set("access", kind == .writing ? "write" : "read")
        if let followUp { message.set("then", followUp.rawValue) }
        for (index, subitem) in subitemDeletions.enumerated() { message.set("subitem.\(index)", subitem) }
        message.set("purpose", purpose)
        let id = mail.nextID()
        message.set("re", "\(id)")
        var reacquire = self.message("reacquire")
        reacquire.set("re", "\(id)")
        do {
            guard try await ask(message) else { return nil }
        } catch let error where error is CancellationError || error is RemoteNoAnswer {
            // Given up on (the presenter timeout, or the coordination was cancelled): the
            // presenter may still relinquish later, and must then get its item back.
            // Posted now, ahead of anything this process sends that presenter next.
            mail.tell(reacquire, to: process)
            throw error
        }
        let done = reacquire
        return { [self] in await tell(done) }
    }

    func relinquishPresentedItem(toReader request: FileAccessRequest) async throws -> FileReacquirer? {
        try await relinquish((try? FilePath(fileURL: request.url)) ?? path, kind: request.kind, purpose: request.purposeIdentifier)
    }

    func relinquishPresentedItem(toWriter request: FileAccessRequest) async throws -> FileReacquirer? {
        try await relinquish((try? FilePath(fileURL: request.url)) ?? path, kind: request.kind, purpose: request.purposeIdentifier)
    }

    func savePresentedItemChanges() async throws { _ = try await ask(message("save")) }
    func accommodatePresentedItemDeletion() async throws { _ = try await ask(message("accommodate-deletion")) }
    func accommodatePresentedSubitemDeletion(at url: URL) async throws {
        _ = try await ask(message("accommodate-subitem-deletion", path: try FilePath(fileURL: url)))
    }
    func presentedItemDidChange() async { await tell(message("did-change")) }
    func presentedItemDidMove(to url: URL) async {
        if let to = try? FilePath(fileURL: url) { await tell(message("did-move", to: to)) }
    }
    func presentedSubitemDidAppear(at url: URL) async {
        if let at = try? FilePath(fileURL: url) { await tell(message("subitem-appear", path: at)) }
    }
    func presentedSubitemDidChange(at url: URL) async {
        if let at = try? FilePath(fileURL: url) { await tell(message("subitem-change", path: at)) }
    }
    func presentedSubitem(at url: URL, didMoveTo newURL: URL) async {
        if let at = try? FilePath(fileURL: url), let to = try? FilePath(fileURL: newURL) {
            await tell(message("subitem-move", path: at, to: to))
        }
    }
}
