import AsyncFileIO
import SystemPackage

/// The messages and records of the cross-process protocol (`docs/protocol.md`) as types,
/// and their codec to and from ``SpaceMessage`` (the `key value` text on the wire).
///
/// Every key and kind of the protocol is spelled here and nowhere else; the transport
/// reads and writes these types. Decoding is strict: a message missing a field its kind
/// requires is malformed, and the receiver ignores it with a warning.
package enum SpaceProtocol {
    /// What every message carries, set by the sender as it writes the message.
    package struct Header: Sendable, Equatable {
        /// The sender's process name (`<pid>-<hex>`).
        package var from: String
        /// Unique per sender.
        package var id: UInt64
        package var pid: Int32

        package init(from: String, id: UInt64, pid: Int32) {
            (self.from, self.id, self.pid) = (from, id, pid)
        }
    }

    /// A message of the protocol's table, without its header.
    package enum Body: Sendable, Equatable {
        /// A callback of one presenter of the receiving process.
        case presenter(PresenterMessage)
        /// The answer to a presenter request.
        case reply(Reply)
        /// `filecoord status` asks a process what it holds.
        case status
        case statusReply(StatusReport)
    }

    /// The header's sender field, which the receiver reads before decoding a whole slot
    /// (see `SpaceMail.receive`).
    static let fromKey = "from"
    /// A process record's PID namespace (the inode number of `/proc/self/ns/pid`).
    static let pidNamespaceKey = "pid-ns"

    /// A message as received: header and body.
    package struct Message: Sendable, Equatable {
        package var header: Header
        package var body: Body

        package init(header: Header, body: Body) {
            (self.header, self.body) = (header, body)
        }
    }

    /// A callback of the presenter numbered `presenter` in the receiving process.
    package struct PresenterMessage: Sendable, Equatable {
        package var presenter: UInt64
        /// The presented item (for the subitem callbacks, the subitem).
        package var path: FilePath
        package var call: Call
    }

    /// The callbacks a message can carry, named on the wire by their `kind`.
    package enum Call: Sendable, Equatable {
        case relinquish(Relinquish)
        case save
        case accommodateDeletion
        case accommodateSubitemDeletion
        case didChange
        case didMove(to: FilePath)
        case subitemDidAppear
        case subitemDidChange
        case subitemDidMove(to: FilePath)
        /// Ends the relinquish whose `re` this is.
        case reacquire(re: UInt64)

        /// Whether the sender waits for a ``Reply``.
        var isRequest: Bool {
            switch self {
            case .relinquish, .save, .accommodateDeletion, .accommodateSubitemDeletion: true
            default: false
            }
        }
    }

    /// A coordinator's request that a presenter relinquish its item, with the steps that
    /// follow in the same round trip.
    package struct Relinquish: Sendable, Equatable {
        package enum Access: String, Sendable { case read, write }
        package enum FollowUp: String, Sendable { case save, accommodateDeletion = "accommodate-deletion" }

        package var access: Access
        package var purpose: String
        /// The reference its `reacquire` will carry.
        package var re: UInt64
        package var then: FollowUp? = nil
        package var subitemDeletions: [FilePath] = []
    }

    /// A presenter request's answer: `failure` is the presenter's error text.
    package struct Reply: Sendable, Equatable {
        package var re: UInt64
        package var failure: String? = nil

        package init(re: UInt64, failure: String? = nil) {
            (self.re, self.failure) = (re, failure)
        }
    }

    /// One claim as `status` lists it: `r /path` or `w /path` on the wire.
    struct ClaimLine: Sendable, Equatable {
        var isWrite: Bool
        var path: FilePath
    }

    /// A process's answer to `status`.
    package struct StatusReport: Sendable, Equatable {
        var re: UInt64
        var claims: [ClaimLine] = []
        var waiting: [ClaimLine] = []
        var presenters: [FilePath] = []
    }

    /// `presenters/<process>-<n>`: one registered presenter.
    struct PresenterRecord: Sendable, Equatable {
        var from: String
        var pid: Int32
        var presenter: UInt64
        var path: FilePath
    }

    /// `procs/<process>`: a live process, and the claims it has held for a while.
    struct ProcessRecord: Sendable, Equatable {
        var pid: Int32
        /// Whether it reads its mailbox (one that does not is never asked for its status).
        var listening: Bool
        var claims: [ClaimLine] = []
        /// Claims it waits for (a process that waits in the kernel does not read its
        /// mailbox: `status` reads them here).
        var waiting: [ClaimLine] = []
        /// The PID namespace `pid` belongs to (``PIDNamespaces``); nil when unknown.
        var pidNamespace: UInt64? = PIDNamespaces.current
    }

    /// Why a file that is a well-formed ``SpaceMessage`` is still not a message of ours.
    package enum Invalid: Error, Sendable, Equatable {
        case unknownKind(String)
        case missing(String)

        var text: String {
            switch self {
            case .unknownKind(let kind): "a message of an unknown kind (\(kind))"
            case .missing(let key): "a field is missing (\(key))"
            }
        }
    }
}

// MARK: Encoding

extension SpaceProtocol.Header {
    /// Adds the header's fields to a message about to be written.
    package func stamp(_ message: inout SpaceMessage) {
        message.set(SpaceProtocol.fromKey, from)
        message.set("id", "\(id)")
        message.set("pid", "\(pid)")
    }
}

extension SpaceProtocol {
    /// Every message's `kind` line, spelled here only.
    enum Kind: String {
        case reply, status, statusReply = "status-reply"
        case relinquish, save, accommodateDeletion = "accommodate-deletion"
        case accommodateSubitemDeletion = "accommodate-subitem-deletion"
        case didChange = "did-change", didMove = "did-move", subitemDidAppear = "subitem-appear"
        case subitemDidChange = "subitem-change", subitemDidMove = "subitem-move", reacquire
        /// The records: a published presenter's, a process's.
        case presenterRecord = "presenter", processRecord = "process"
    }
}

extension SpaceProtocol.Call {
    var kindLine: SpaceProtocol.Kind {
        switch self {
        case .relinquish: .relinquish
        case .save: .save
        case .accommodateDeletion: .accommodateDeletion
        case .accommodateSubitemDeletion: .accommodateSubitemDeletion
        case .didChange: .didChange
        case .didMove: .didMove
        case .subitemDidAppear: .subitemDidAppear
        case .subitemDidChange: .subitemDidChange
        case .subitemDidMove: .subitemDidMove
        case .reacquire: .reacquire
        }
    }

    /// The `kind` line.
    var kind: String { kindLine.rawValue }
}

extension SpaceProtocol.Body {
    /// The `kind` line.
    var kind: String {
        switch self {
        case .presenter(let message): message.call.kind
        case .reply: SpaceProtocol.Kind.reply.rawValue
        case .status: SpaceProtocol.Kind.status.rawValue
        case .statusReply: SpaceProtocol.Kind.statusReply.rawValue
        }
    }

    /// The message without its header (the sender stamps that as it writes).
    package func encoded() -> SpaceMessage {
        switch self {
        case .presenter(let message):
            var out = SpaceMessage(kind: message.call.kind)
            out.set("presenter", "\(message.presenter)")
            out.set("path", message.path)
            switch message.call {
            case .relinquish(let relinquish):
                out.set("access", relinquish.access.rawValue)
                out.set("purpose", relinquish.purpose)
                out.set("re", "\(relinquish.re)")
                if let then = relinquish.then { out.set("then", then.rawValue) }
                for (index, subitem) in relinquish.subitemDeletions.enumerated() { out.set("subitem.\(index)", subitem) }
            case .didMove(let to), .subitemDidMove(let to):
                out.set("to", to)
            case .reacquire(let re):
                out.set("re", "\(re)")
            case .save, .accommodateDeletion, .accommodateSubitemDeletion, .didChange, .subitemDidAppear, .subitemDidChange:
                break
            }
            return out
        case .reply(let reply):
            var out = SpaceMessage(kind: SpaceProtocol.Kind.reply.rawValue)
            out.set("re", "\(reply.re)")
            out.set("result", reply.failure == nil ? "ok" : "error")
            if let text = reply.failure { out.set("text", text) }
            return out
        case .status:
            return SpaceMessage(kind: SpaceProtocol.Kind.status.rawValue)
        case .statusReply(let report):
            // Built as a list and sorted once: a process may hold thousands of claims.
            var fields = [SpaceMessage.Field(key: "re", value: Array("\(report.re)".utf8))]
            fields += SpaceProtocol.claimFields("claim", report.claims)
            fields += SpaceProtocol.claimFields("waiting", report.waiting)
            for (index, path) in report.presenters.enumerated() {
                fields.append(.init(key: "presenter.\(index)", value: path.platformBytes))
            }
            return SpaceMessage(kind: SpaceProtocol.Kind.statusReply.rawValue, fields: fields)
        }
    }
}

extension SpaceProtocol {
    static func claimFields(_ prefix: String, _ claims: [ClaimLine]) -> [SpaceMessage.Field] {
        claims.enumerated().map { index, claim in
            .init(key: "\(prefix).\(index)", value: Array((claim.isWrite ? "w " : "r ").utf8) + claim.path.platformBytes)
        }
    }

    /// The `claim.N` (or `waiting.N`) fields of a message, in any order of N.
    static func claimLines(_ prefix: String, in message: SpaceMessage) -> [ClaimLine] {
        let dotted = prefix + "."
        return message.fields.compactMap { field in
            let value = field.value
            guard field.key.hasPrefix(dotted), value.count > 2, value[1] == UInt8(ascii: " "), value[2] == UInt8(ascii: "/"),
                  value[0] == UInt8(ascii: "w") || value[0] == UInt8(ascii: "r") else { return nil }
            return ClaimLine(isWrite: value[0] == UInt8(ascii: "w"), path: FilePath(platformBytes: value.dropFirst(2)))
        }
    }
}

extension SpaceProtocol.PresenterRecord {
    func encoded() -> SpaceMessage {
        var record = SpaceMessage(kind: SpaceProtocol.Kind.presenterRecord.rawValue)
        record.set("from", from)
        record.set("pid", "\(pid)")
        record.set("presenter", "\(presenter)")
        record.set("path", path)
        return record
    }

    init(decoding record: SpaceMessage) throws(SpaceProtocol.Invalid) {
        guard record.kind == SpaceProtocol.Kind.presenterRecord.rawValue else { throw .unknownKind(record.kind) }
        from = try record.required("from", record.string)
        pid = try record.required("pid", record.pid)
        presenter = try record.required("presenter", record.number)
        path = try record.required("path", record.path)
    }
}

extension SpaceProtocol.ProcessRecord {
    func encoded() -> SpaceMessage {
        var record = SpaceMessage(kind: SpaceProtocol.Kind.processRecord.rawValue, fields: SpaceProtocol.claimFields("claim", claims) + SpaceProtocol.claimFields("waiting", waiting))
        record.set("pid", "\(pid)")
        record.set("listening", listening ? "1" : "0")
        if let pidNamespace { record.set(SpaceProtocol.pidNamespaceKey, "\(pidNamespace)") }
        return record
    }

    init(decoding record: SpaceMessage) throws(SpaceProtocol.Invalid) {
        guard record.kind == SpaceProtocol.Kind.processRecord.rawValue else { throw .unknownKind(record.kind) }
        pid = try record.required("pid", record.pid)
        listening = record.string("listening") != "0"
        claims = SpaceProtocol.claimLines("claim", in: record)
        waiting = SpaceProtocol.claimLines("waiting", in: record)
        pidNamespace = record.string(SpaceProtocol.pidNamespaceKey).flatMap { UInt64($0) }
    }
}

// MARK: Decoding

extension SpaceProtocol.Message {
    /// The message a decoded file holds.
    package init(decoding message: SpaceMessage) throws(SpaceProtocol.Invalid) {
        header = SpaceProtocol.Header(from: try message.required(SpaceProtocol.fromKey, message.string),
                                      id: try message.required("id", message.number),
                                      pid: try message.required("pid", message.pid))
        switch SpaceProtocol.Kind(rawValue: message.kind) {
        case .reply?:
            let result = try message.required("result", message.string)
            guard result == "ok" || result == "error" else { throw .missing("result") }
            body = .reply(.init(re: try message.required("re", message.number),
                                failure: result == "ok" ? nil : message.string("text") ?? "no reason given"))
        case .status?:
            body = .status
        case .statusReply?:
            body = .statusReply(.init(re: try message.required("re", message.number),
                                      claims: SpaceProtocol.claimLines("claim", in: message),
                                      waiting: SpaceProtocol.claimLines("waiting", in: message),
                                      presenters: message.indexed("presenter")))
        default:
            body = .presenter(try SpaceProtocol.PresenterMessage(decoding: message))
        }
    }
}

extension SpaceProtocol.PresenterMessage {
    init(decoding message: SpaceMessage) throws(SpaceProtocol.Invalid) {
        let call: SpaceProtocol.Call
        switch SpaceProtocol.Kind(rawValue: message.kind) {
        case .relinquish?:
            let access = try message.required("access") { message.string($0).flatMap(SpaceProtocol.Relinquish.Access.init(rawValue:)) }
            var then: SpaceProtocol.Relinquish.FollowUp?
            if let value = message.string("then") {
                guard let known = SpaceProtocol.Relinquish.FollowUp(rawValue: value) else { throw .missing("then") }
                then = known
            }
            call = .relinquish(.init(access: access, purpose: try message.required("purpose", message.string),
                                     re: try message.required("re", message.number), then: then,
                                     subitemDeletions: message.indexed("subitem")))
        case .save?: call = .save
        case .accommodateDeletion?: call = .accommodateDeletion
        case .accommodateSubitemDeletion?: call = .accommodateSubitemDeletion
        case .didChange?: call = .didChange
        case .didMove?: call = .didMove(to: try message.required("to", message.path))
        case .subitemDidAppear?: call = .subitemDidAppear
        case .subitemDidChange?: call = .subitemDidChange
        case .subitemDidMove?: call = .subitemDidMove(to: try message.required("to", message.path))
        case .reacquire?: call = .reacquire(re: try message.required("re", message.number))
        default: throw .unknownKind(message.kind)
        }
        self.init(presenter: try message.required("presenter", message.number), path: try message.required("path", message.path),
                  call: call)
    }
}

extension SpaceMessage {
    /// The field `key` read by `read`, or the error naming it.
    fileprivate func required<T>(_ key: String, _ read: (String) -> T?) throws(SpaceProtocol.Invalid) -> T {
        guard let value = read(key) else { throw .missing(key) }
        return value
    }

    fileprivate func pid(_ key: String) -> Int32? { string(key).flatMap { Int32($0) } }

    /// The paths in `prefix.0`, `prefix.1`, ... up to the first missing number.
    fileprivate func indexed(_ prefix: String) -> [FilePath] {
        var paths: [FilePath] = []
        while let path = path("\(prefix).\(paths.count)") { paths.append(path) }
        return paths
    }
}
