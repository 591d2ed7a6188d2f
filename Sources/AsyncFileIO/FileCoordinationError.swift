import SystemPackage

/// The one error type of FileCoordination: what failed, on which path, and why.
///
/// Every failure the library reports carries a ``Code`` to switch on, the ``path``
/// involved, the ``operation`` that failed (a system call such as `open`, or a
/// library step such as `coordinate`), the ``errno`` when the kernel reported one,
/// and an optional underlying ``cause``.
///
/// Its ``description`` has the shape the `filecoord` tool prints:
/// `/data/a.bin: open failed: No such file or directory (ENOENT)`.
public struct FileCoordinationError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is, independent of the exact errno.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Kind: Hashable, Sendable {
            case notFound, permissionDenied, isDirectory, notDirectory, unsupportedFileType
            case notFileURL, fileExists, fileTooLarge, tooManyOpenFiles, noSpace
            case closed, invalidArgument, cancelled, timedOut, presenterFailed
            case watchLimitReached, insecureSpace, malformedMessage, io, unknown
            case unreachable, claimLost
        }
        fileprivate let kind: Kind

        /// No file or directory exists at the path (`ENOENT`).
        public static let notFound = Code(kind: .notFound)
        /// The caller may not access the path (`EACCES`, `EPERM`).
        public static let permissionDenied = Code(kind: .permissionDenied)
        /// A file was expected but the path names a directory (`EISDIR`).
        public static let isDirectory = Code(kind: .isDirectory)
        /// A component of the path is not a directory (`ENOTDIR`).
        public static let notDirectory = Code(kind: .notDirectory)
        /// The path names a FIFO, socket or other file this operation cannot use.
        public static let unsupportedFileType = Code(kind: .unsupportedFileType)
        /// The URL is not a `file:` URL.
        public static let notFileURL = Code(kind: .notFileURL)
        /// The path already exists and the operation would not replace it (`EEXIST`).
        public static let fileExists = Code(kind: .fileExists)
        /// The file is larger than the caller allowed, or than memory can hold (`EFBIG`).
        public static let fileTooLarge = Code(kind: .fileTooLarge)
        /// The process or system ran out of file descriptors (`EMFILE`, `ENFILE`).
        public static let tooManyOpenFiles = Code(kind: .tooManyOpenFiles)
        /// The device is full or a quota is exhausted (`ENOSPC`, `EDQUOT`).
        public static let noSpace = Code(kind: .noSpace)
        /// The handle was already closed.
        public static let closed = Code(kind: .closed)
        /// An argument was out of range (a negative offset, a zero concurrency...).
        public static let invalidArgument = Code(kind: .invalidArgument)
        /// The operation was cancelled before it took effect.
        public static let cancelled = Code(kind: .cancelled)
        /// A wait ended because its time limit expired.
        public static let timedOut = Code(kind: .timedOut)
        /// A file presenter refused or failed a request; the message is the presenter's.
        public static let presenterFailed = Code(kind: .presenterFailed)
        /// The kernel's inotify watch or instance limit is exhausted.
        public static let watchLimitReached = Code(kind: .watchLimitReached)
        /// The coordination space is not private to this user.
        public static let insecureSpace = Code(kind: .insecureSpace)
        /// No server of the coordination space answered (an etcd space's endpoints).
        public static let unreachable = Code(kind: .unreachable)
        /// The process's claims stopped holding while it held them: its etcd lease was
        /// lost (a partition, or a pause longer than the lease's TTL), so another process
        /// may have been granted the same items.
        public static let claimLost = Code(kind: .claimLost)
        /// A file in the coordination space could not be parsed.
        public static let malformedMessage = Code(kind: .malformedMessage)
        /// The device reported an input/output error, or another system call failed.
        public static let io = Code(kind: .io)
        /// A failure that fits no other code.
        public static let unknown = Code(kind: .unknown)

        /// The code's name (`notFound`, `permissionDenied`, ...).
        public var description: String { "\(kind)" }

        /// The code that best describes an errno value.
        public init(_ errno: Errno) {
            switch errno {
            case .noSuchFileOrDirectory: self = .notFound
            case .permissionDenied, .notPermitted, .readOnlyFileSystem: self = .permissionDenied
            case .isDirectory: self = .isDirectory
            case .notDirectory: self = .notDirectory
            case .fileExists: self = .fileExists
            case .fileTooLarge, .noMemory: self = .fileTooLarge
            case .tooManyOpenFiles, .tooManyOpenFilesInSystem: self = .tooManyOpenFiles
            case .noSpace, .diskQuotaExceeded: self = .noSpace
            case .invalidArgument: self = .invalidArgument
            case .noSuchAddressOrDevice: self = .unsupportedFileType
            case .canceled: self = .cancelled
            case .timedOut: self = .timedOut
            default: self = .io
            }
        }

        fileprivate init(kind: Kind) { self.kind = kind }
    }

    /// What kind of failure this is.
    public var code: Code
    /// The path the failing operation was working on, if any. It keeps the exact bytes
    /// of the name, including ones that are not valid UTF-8.
    public var path: FilePath?
    /// The operation that failed: a system call (`open`, `read`, `fsync`) or a library
    /// step (`coordinate`, `relinquish`).
    public var operation: String
    /// The errno the kernel reported, when the failure came from a system call.
    public var errno: Errno?
    /// A human-readable explanation of the cause.
    public var message: String
    /// The underlying error, when this one wraps another (a presenter's thrown error, say).
    public var cause: (any Error & Sendable)?

    /// Creates an error from its parts.
    public init(
        code: Code,
        path: FilePath?,
        operation: String,
        errno: Errno? = nil,
        message: String,
        cause: (any Error & Sendable)? = nil
    ) {
        self.code = code
        self.path = path
        self.operation = operation
        self.errno = errno
        self.message = message
        self.cause = cause
    }

    /// The operations the package's own errors name, each spelled once: a system call, or
    /// a step of the library. (``operation`` holds its text.)
    package enum Operation: String, Sendable {
        case open
        case read
        case write
        case close
        case stat
        case fstat
        case readlink
        case fsync
        case fcntl
        case fchmod
        case ftruncate
        case link
        case rename
        case opendir
        case mkdir
        case mmap
        case lockQuery = "F_OFD_GETLK"
        case lock = "F_OFD_SETLK"
        case mkdtemp
        case pipe
        case waitpid
        case sigaction
        case pthreadCreate = "pthread_create"
        case exec
        case inotifyAddWatch = "inotify_add_watch"
        case inotifyInit = "inotify_init"
        case coordinate
        case join
        case joinTheSpace = "join the coordination space"
        case sync
        case status
        case present
        case readTheList = "read the list"
        case waitForAnEvent = "wait for an event"
        case zip
        case copy
        case atomicReplace = "atomic replace"
    }

    /// An error of `operation`, from its parts.
    package init(_ operation: Operation, code: Code, path: FilePath?, errno: Errno? = nil, message: String,
                 cause: (any Error & Sendable)? = nil) {
        self.init(code: code, path: path, operation: operation.rawValue, errno: errno, message: message, cause: cause)
    }

    /// A failed system call of `operation`: the code and message derive from `errno`.
    package init(_ operation: Operation, errno: Errno, path: FilePath?) {
        self.init(operation.rawValue, errno: errno, path: path)
    }

    /// An error for a failed system call: the code and message derive from `errno`.
    public init(_ operation: String, errno: Errno, path: FilePath?) {
        self.init(code: Code(errno), path: path, operation: operation, errno: errno,
                  message: Self.strerror(errno))
    }

    /// `<path>: <operation> failed: <message> (<ERRNO>)`, with the errno name only when
    /// there is one.
    public var description: String {
        var text = ""
        if let path { text += "\(path.description): " }
        text += "\(operation) failed: \(message)"
        if let errno { text += " (\(errno.symbolicName))" }
        return text
    }

    static func strerror(_ errno: Errno) -> String {
        // Errno's description is strerror(3)'s text.
        errno.description
    }
}

extension Errno {
    /// The C name of the errno value (`ENOENT`), or `errno N` for one not listed.
    public var symbolicName: String {
        switch self {
        case .notPermitted: "EPERM"
        case .noSuchFileOrDirectory: "ENOENT"
        case .interrupted: "EINTR"
        case .ioError: "EIO"
        case .noSuchAddressOrDevice: "ENXIO"
        case .badFileDescriptor: "EBADF"
        case .resourceTemporarilyUnavailable: "EAGAIN"
        case .noMemory: "ENOMEM"
        case .permissionDenied: "EACCES"
        case .badAddress: "EFAULT"
        case .resourceBusy: "EBUSY"
        case .fileExists: "EEXIST"
        case .improperLink: "EXDEV"
        case .operationNotSupportedByDevice: "ENODEV"
        case .notDirectory: "ENOTDIR"
        case .isDirectory: "EISDIR"
        case .invalidArgument: "EINVAL"
        case .tooManyOpenFilesInSystem: "ENFILE"
        case .tooManyOpenFiles: "EMFILE"
        case .fileTooLarge: "EFBIG"
        case .noSpace: "ENOSPC"
        case .illegalSeek: "ESPIPE"
        case .readOnlyFileSystem: "EROFS"
        case .tooManyLinks: "EMLINK"
        case .brokenPipe: "EPIPE"
        case .deadlock: "EDEADLK"
        case .fileNameTooLong: "ENAMETOOLONG"
        case .noLocks: "ENOLCK"
        case .noFunction: "ENOSYS"
        case .directoryNotEmpty: "ENOTEMPTY"
        case .tooManySymbolicLinkLevels: "ELOOP"
        case .notSupported: "EOPNOTSUPP"
        case .timedOut: "ETIMEDOUT"
        case .diskQuotaExceeded: "EDQUOT"
        case .canceled: "ECANCELED"
        case .textFileBusy: "ETXTBSY"
        case .overflow: "EOVERFLOW"
        default: "errno \(rawValue)"
        }
    }
}
