import CFileCoordinationShims
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension Result where Failure == Errno {
    /// Turns the errno into a ``FileCoordinationError`` naming the operation and path.
    @inline(__always)
    package func mapError(_ operation: FileCoordinationError.Operation, _ path: FilePath?) -> Result<Success, FileCoordinationError> {
        mapError { FileCoordinationError(operation, errno: $0, path: path) }
    }
}

/// Monotonic nanoseconds (`CLOCK_MONOTONIC` through the vDSO: no system call).
func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
}

/// The file type bits of `st_mode`.
enum FileType: Equatable {
    case regular, directory, fifo, socket, characterDevice, blockDevice, symbolicLink, unknown

    // The `st_mode` type bits, as literals: Glibc's `S_IF*` macros import as computed
    // properties, a call each, and this runs for every file a batch reads.
    private static let typeMask: mode_t = 0o170000
    private static let regularBits: mode_t = 0o100000

    init(mode: mode_t) {
        switch mode & Self.typeMask {
        case Self.regularBits: self = .regular
        case 0o040000: self = .directory
        case 0o010000: self = .fifo
        case 0o140000: self = .socket
        case 0o020000: self = .characterDevice
        case 0o060000: self = .blockDevice
        case 0o120000: self = .symbolicLink
        default: self = .unknown
        }
    }

    /// Whether `mode` is a regular file's.
    static func isRegular(_ mode: mode_t) -> Bool { mode & typeMask == regularBits }

    /// "a character device", and so on (for messages).
    var description: String {
        switch self {
        case .regular: "a regular file"
        case .directory: "a directory"
        case .fifo: "a FIFO"
        case .socket: "a socket"
        case .characterDevice: "a character device"
        case .blockDevice: "a block device"
        case .symbolicLink: "a symbolic link"
        case .unknown: "not a regular file"
        }
    }
}
