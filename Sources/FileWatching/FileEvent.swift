import SystemPackage

/// A change seen in a watched file or directory tree.
public struct FileEvent: Sendable, Hashable, CustomStringConvertible {
    /// What happened.
    public enum Kind: Sendable, Hashable, CaseIterable {
        /// The item appeared (created, or moved in from outside the watched tree).
        case created
        /// The item's content changed (consecutive modifications are reported once).
        case modified
        /// The item's metadata changed (permissions, owner, timestamps, link count).
        case attributesChanged
        /// The item was renamed within the watched tree: from ``FileEvent/path`` to
        /// ``FileEvent/destination``. The two halves of the rename arrive as one event.
        case moved
        /// The item disappeared (deleted, or moved out of the watched tree).
        case deleted
        /// Events were lost (see ``FileEvent/Resync``). The watcher rescanned its tree,
        /// reporting what it found different as created or deleted, and the consumer
        /// should re-read whatever it derives from the tree.
        case resync
    }

    /// Why events were lost, for a ``Kind/resync`` event.
    public struct Resync: Sendable, Hashable, CustomStringConvertible {
        /// Where the events were lost.
        public enum Cause: Sendable, Hashable {
            /// The kernel's inotify queue overflowed (`fs.inotify.max_queued_events`): the
            /// process read its events too slowly. How many were lost is not known.
            case kernelQueue
            /// This watcher's buffer was full (``FileWatcher/bufferLimit``): its consumer
            /// took events too slowly.
            case buffer
            /// A file system mounted inside the tree was unmounted.
            case unmounted
        }

        /// Where the events were lost; when several causes came together, a kernel
        /// overflow or an unmount (which lose an unknown number) rather than the buffer.
        public var cause: Cause
        /// How many events were dropped, when known (always for ``Cause/buffer``).
        public var lostEvents: Int?

        /// A resync's cause.
        public init(cause: Cause, lostEvents: Int? = nil) {
            self.cause = cause
            self.lostEvents = lostEvents
        }

        /// `kernel queue overflow`, `buffer overflow (12 events lost)`, `unmount`.
        public var description: String {
            let what = switch cause {
            case .kernelQueue: "kernel queue overflow"
            case .buffer: "buffer overflow"
            case .unmounted: "unmount"
            }
            return lostEvents.map { "\(what) (\($0) events lost)" } ?? what
        }
    }

    /// What happened.
    public var kind: Kind
    /// The item (for ``Kind/moved``, where it was).
    public var path: FilePath
    /// For ``Kind/moved``: where it is now.
    public var destination: FilePath?
    /// Whether the item is a directory.
    public var isDirectory: Bool
    /// ``path`` relative to the watched directory (for a watched file, its directory):
    /// `sub/a.txt`. Empty for the watched directory itself.
    public var relativePath: FilePath
    /// ``destination`` relative to the watched directory.
    public var relativeDestination: FilePath?
    /// For ``Kind/resync``: why events were lost.
    public var resync: Resync?

    /// An event. The relative paths default to the last component of each path: a watcher
    /// sets them from its root.
    public init(_ kind: Kind, _ path: FilePath, destination: FilePath? = nil, isDirectory: Bool = false) {
        self.kind = kind
        self.path = path
        self.destination = destination
        self.isDirectory = isDirectory
        relativePath = path.lastComponent.map { FilePath(root: nil, [$0]) } ?? FilePath()
        relativeDestination = destination?.lastComponent.map { FilePath(root: nil, [$0]) }
    }

    /// An event with its relative paths, as a watcher makes it (one path built each).
    init(_ kind: Kind, _ path: FilePath, relativePath: FilePath, destination: FilePath?,
         relativeDestination: FilePath?, isDirectory: Bool) {
        self.kind = kind
        self.path = path
        self.destination = destination
        self.isDirectory = isDirectory
        self.relativePath = relativePath
        self.relativeDestination = relativeDestination
    }

    /// Events are equal when they report the same change of the same item: kind, paths
    /// and `isDirectory`. The relative paths follow from the paths, and a resync's
    /// cause is detail.
    public static func == (lhs: FileEvent, rhs: FileEvent) -> Bool {
        lhs.kind == rhs.kind && lhs.path == rhs.path && lhs.destination == rhs.destination
            && lhs.isDirectory == rhs.isDirectory
    }

    /// Hashes what ``==(_:_:)`` compares.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        hasher.combine(path)
        hasher.combine(destination)
        hasher.combine(isDirectory)
    }

    /// `KIND PATH[ -> DESTINATION][ (directory)]`, and a resync's cause.
    public var description: String {
        let directory = isDirectory ? " (directory)" : ""
        if let destination { return "\(kind) \(path) -> \(destination)\(directory)" }
        if let resync { return "\(kind) \(path) (\(resync))" }
        return "\(kind) \(path)\(directory)"
    }
}
