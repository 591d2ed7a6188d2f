import Foundation

/// Who is asking a presenter to relinquish its item, and for what.
public struct FileAccessRequest: Sendable, Hashable {
    /// Reading or writing.
    public enum Kind: Sendable, Hashable { case reading, writing }

    /// The item being accessed (the presented item itself, or something inside it).
    public var url: URL
    /// Reading or writing.
    public var kind: Kind
    /// The purpose identifier of the coordinator asking.
    public var purposeIdentifier: String
    /// The process asking (this one, for in-process coordination).
    public var processIdentifier: Int32

    /// A request description.
    public init(url: URL, kind: Kind, purposeIdentifier: String, processIdentifier: Int32) {
        self.url = url
        self.kind = kind
        self.purposeIdentifier = purposeIdentifier
        self.processIdentifier = processIdentifier
    }
}
