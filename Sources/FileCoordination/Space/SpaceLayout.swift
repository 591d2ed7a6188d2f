/// The names of the directory space's files (`docs/protocol.md`, "The space's
/// directory"), each spelled here only. Paths are relative to the space's directory,
/// for the `*at` calls on its descriptor.
enum SpaceLayout {
    /// Each live process's record: `procs/<process>`, made as `procs/.<process>`.
    static let records = "procs"
    /// Each process's mailbox: `mail/<process>/`.
    static let mailboxes = "mail"
    /// Each published presenter: `presenters/<process>-<number>`.
    static let presenters = "presenters"
    /// The claim shards.
    static let claims = "claims"
    /// The lock a joining process takes, and the doorbell of waits.
    static let claimsLock = "claims.lock"
    /// The counter that moves whenever a presenter record changes.
    static let registrySequence = "registry.seq"
    /// The folders every space has.
    static let folders = [records, mailboxes, presenters, claims]
    /// The prefix of an entry set aside as not one of the space's own.
    static let foreignPrefix = ".foreign-"
    /// Between a sender's name and a slot's generation: `<sender>-r<generation>`.
    static let slotMark = "-r"

    static func record(_ process: String) -> String { "\(records)/\(process)" }
    static func hiddenRecord(_ process: String) -> String { "\(records)/.\(process)" }
    static func mailbox(_ process: String) -> String { "\(mailboxes)/\(process)" }
    /// An entry of `process`'s mailbox.
    static func mailboxEntry(_ process: String, _ name: String) -> String { "\(mailboxes)/\(process)/\(name)" }
    /// A one-shot message from `sender` to `target`.
    static func message(to target: String, from sender: String, id: UInt64) -> String { "\(mailboxes)/\(target)/\(sender)-\(id)" }
    /// `sender`'s slot in `target`'s mailbox.
    static func slot(to target: String, from sender: String, generation: UInt64) -> String {
        "\(mailboxes)/\(target)/\(sender)\(slotMark)\(generation)"
    }
    /// Whether a mailbox entry's name is one of `sender`'s slots.
    static func isSlot(_ name: String, of sender: String) -> Bool { name.hasPrefix(sender + slotMark) }
    static func presenterRecord(_ process: String, _ number: UInt64) -> String { "\(presenters)/\(process)-\(number)" }
    static func presenterRecord(named name: String) -> String { "\(presenters)/\(name)" }
    /// A presenter record while it is written, renamed into place once complete.
    static func newPresenterRecord(_ process: String, _ number: UInt64) -> String { "\(presenters)/.\(process)-\(number).new" }
    /// Whether a presenter record's name is one of `process`'s (published or being written).
    static func isPresenterRecord(_ name: String, of process: String) -> Bool {
        name.hasPrefix(process + "-") || name.hasPrefix(".\(process)-")
    }
}
