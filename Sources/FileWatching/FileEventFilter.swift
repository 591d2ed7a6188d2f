import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Which events a ``FileWatcher`` delivers. Events that do not pass are dropped on the
/// watcher thread, before the buffer: they count toward no limit and wake no consumer.
///
/// Patterns are matched against ``FileEvent/relativePath`` (`sub/a.txt`) with
/// `fnmatch(3)`, where `*` and `?` also match `/`: `*.swift` matches `Sources/a.swift`.
/// A ``FileEvent/Kind/moved`` event passes when either of its paths passes; a
/// ``FileEvent/Kind/resync`` always passes (it says that events, of any kind, were lost).
///
/// ```swift
/// let watcher = try await FileWatcher(watching: dir, filter: .init(
///     kinds: [.created, .deleted], include: ["*.json"], includeHidden: false))
/// ```
public struct FileEventFilter: Sendable, Hashable {
    /// The kinds delivered.
    public var kinds: Set<FileEvent.Kind>
    /// When not empty, only paths that match one of these patterns are delivered.
    public var include: [String]
    /// Paths that match one of these patterns are not delivered.
    public var exclude: [String]
    /// When not empty, only items at or inside one of these subtrees (relative to the
    /// watched directory) are delivered.
    public var subtrees: [FilePath]
    /// Whether items whose relative path has a component starting with `.` are delivered.
    public var includeHidden: Bool

    /// Every event.
    public static let all = FileEventFilter()

    /// A filter; by default it delivers everything.
    public init(kinds: Set<FileEvent.Kind> = Set(FileEvent.Kind.allCases), include: [String] = [],
                exclude: [String] = [], subtrees: [FilePath] = [], includeHidden: Bool = true) {
        self.kinds = kinds
        self.include = include
        self.exclude = exclude
        self.subtrees = subtrees
        self.includeHidden = includeHidden
    }

    /// Whether `event` is delivered.
    public func accepts(_ event: FileEvent) -> Bool {
        if event.kind == .resync { return true }
        guard kinds.contains(event.kind) else { return false }
        if accepts(path: event.relativePath) { return true }
        return event.relativeDestination.map { accepts(path: $0) } ?? false
    }

    private func accepts(path: FilePath) -> Bool {
        if !includeHidden, path.components.contains(where: { $0.string.hasPrefix(".") }) { return false }
        if !subtrees.isEmpty, !subtrees.contains(where: { path.starts(with: $0) }) { return false }
        let text = path.string
        if !include.isEmpty, !include.contains(where: { fnmatch($0, text, 0) == 0 }) { return false }
        return !exclude.contains { fnmatch($0, text, 0) == 0 }
    }
}
