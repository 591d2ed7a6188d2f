import AsyncFileIO
import CFileCoordinationShims
import FileWatching
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A request to another process was not answered within its deadline.
package struct RemoteNoAnswer: Error {
    package init() {}
}

/// How messages reach another process's presenters: ``SpaceMail`` (files and inotify in
/// the space's directory) or the etcd space's `EtcdMail` (keys in etcd; module
/// FileCoordinationEtcd).
package protocol PresenterMailbox: Sendable {
    /// Sends a request and waits for its reply; nil when the target process is gone.
    /// Within `timeout` (when given), else it throws ``RemoteNoAnswer``; throws
    /// ``OwnMailboxUnavailable`` when this process cannot have the mailbox the reply
    /// comes to, and the coordinator's cancellation when `ending` fires.
    func request(_ message: SpaceProtocol.Body, to target: String, timeout: Duration?, ending: CancelSignal?) async throws -> SpaceProtocol.Body?
    /// Posts a message that has no reply, in order behind those posted before it.
    func tell(_ message: SpaceProtocol.Body, to target: String)
    /// A number unique among this process's messages.
    func nextID() -> UInt64
}

extension SpaceMail: PresenterMailbox {}

/// This process could not make its own mailbox (``SpaceMail/openMailbox()``): no request
/// was sent, and the error names that mailbox, not the presenter asked.
package struct OwnMailboxUnavailable: Error {
    package let error: FileCoordinationError
}

/// A presenter registered by another process, as this process sees it: what it is asked
/// before an access is a request into that process's mailbox, answered through this
/// process's mailbox; what it is told after, a message with no answer.
package final class RemotePresenter: FilePresenter, CustomStringConvertible {
    let mail: any PresenterMailbox
    let process: String
    let number: UInt64
    package let path: FilePath
    let pid: Int32

    package init(mail: any PresenterMailbox, process: String, number: UInt64, path: FilePath, pid: Int32) {
        self.mail = mail
        self.process = process
        self.number = number
        self.path = path
        self.pid = pid
    }

    package var presentedItemURL: URL? { path.fileURL }
    package var description: String { "the presenter of \(path) in process \(pid)" }

    private func message(_ call: SpaceProtocol.Call, path: FilePath? = nil) -> SpaceProtocol.Body {
        .presenter(.init(presenter: number, path: path ?? self.path, call: call))
    }

    /// Sends and waits; throws the presenter's own error text when it refused, and says
    /// that the request could not be delivered when the sending failed (a full space).
    private func ask(_ call: SpaceProtocol.Call, path: FilePath? = nil, timeout: Duration? = nil,
                     ending: CancelSignal? = nil) async throws -> Bool {
        let answer: SpaceProtocol.Body?
        do {
            answer = try await mail.request(message(call, path: path), to: process, timeout: timeout, ending: ending)
        } catch let unavailable as OwnMailboxUnavailable {
            throw unavailable.error
        } catch let error as FileCoordinationError where error.code != .timedOut && error.code != .cancelled {
            throw FileCoordinationError(code: error.code, path: path ?? self.path, operation: call.kind, errno: error.errno,
                                        message: "the request could not be delivered to \(self): \(error)", cause: error)
        }
        guard let answer else { return false }
        if case .reply(let reply) = answer, let text = reply.failure {
            throw FileCoordinationError(code: .presenterFailed, path: path ?? self.path, operation: call.kind,
                                        message: "\(self) refused: \(text)")
        }
        return true
    }

    /// Posts a message that has no answer: the coordination waits for its write once, at
    /// its end (``SpaceMail/flush()``).
    func tell(_ call: SpaceProtocol.Call, path: FilePath? = nil) {
        mail.tell(message(call, path: path), to: process)
    }

    typealias FollowUp = SpaceProtocol.Relinquish.FollowUp

    /// Relinquish, then the follow-up step and the subitem deletions, in one round trip,
    /// answered within `timeout` (when given) or ``RemoteNoAnswer`` is thrown, and until
    /// `ending` fires (the coordinator was cancelled). Returns nil when the presenter's
    /// process is gone.
    func relinquish(_ item: FilePath, kind: FileAccessRequest.Kind, purpose: String, then followUp: FollowUp? = nil,
                    subitemDeletions: [FilePath] = [], timeout: Duration? = nil, ending: CancelSignal? = nil) async throws -> FileReacquirer? {
        let re = mail.nextID()
        let request = SpaceProtocol.Relinquish(access: kind == .writing ? .write : .read, purpose: purpose, re: re,
                                               then: followUp, subitemDeletions: subitemDeletions)
        do {
            guard try await ask(.relinquish(request), path: item, timeout: timeout, ending: ending) else { return nil }
        } catch let error where error is CancellationError || error is RemoteNoAnswer
                    || (error as? FileCoordinationError)?.code == .cancelled {
            // Given up on (the presenter timeout, or the coordination was cancelled): the
            // presenter may still relinquish later, and must then get its item back.
            // Posted now, ahead of anything this process sends that presenter next.
            tell(.reacquire(re: re))
            throw error
        }
        return { [self] in tell(.reacquire(re: re)) }
    }

    package func relinquishPresentedItem(toReader request: FileAccessRequest) async throws -> FileReacquirer? {
        try await relinquish((try? FilePath(fileURL: request.url)) ?? path, kind: request.kind, purpose: request.purposeIdentifier)
    }

    package func relinquishPresentedItem(toWriter request: FileAccessRequest) async throws -> FileReacquirer? {
        try await relinquish((try? FilePath(fileURL: request.url)) ?? path, kind: request.kind, purpose: request.purposeIdentifier)
    }

    package func savePresentedItemChanges() async throws { _ = try await ask(.save) }
    package func accommodatePresentedItemDeletion() async throws { _ = try await ask(.accommodateDeletion) }
    package func accommodatePresentedSubitemDeletion(at url: URL) async throws {
        _ = try await ask(.accommodateSubitemDeletion, path: try FilePath(fileURL: url))
    }
    package func presentedItemDidChange() async { tell(.didChange) }
    package func presentedItemDidMove(to url: URL) async {
        if let to = try? FilePath(fileURL: url) { tell(.didMove(to: to)) }
    }
    package func presentedSubitemDidAppear(at url: URL) async {
        if let at = try? FilePath(fileURL: url) { tell(.subitemDidAppear, path: at) }
    }
    package func presentedSubitemDidChange(at url: URL) async {
        if let at = try? FilePath(fileURL: url) { tell(.subitemDidChange, path: at) }
    }
    package func presentedSubitem(at url: URL, didMoveTo newURL: URL) async {
        if let at = try? FilePath(fileURL: url), let to = try? FilePath(fileURL: newURL) {
            tell(.subitemDidMove(to: to), path: at)
        }
    }
}
