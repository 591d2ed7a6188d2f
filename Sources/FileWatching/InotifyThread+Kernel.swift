import AsyncFileIO
import CInotifyTools
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// What the watcher thread reads of the kernel's inotify state and says of its failures:
/// the watches of an instance (`/proc/self/fdinfo`), libinotifytools' own instance, an
/// event copied out of its buffer, and the error of a watch that could not be had.
extension InotifyThread {
    /// The `(wd, inode)` of each watch listed in the fdinfo of descriptor `fd`.
    static func fdinfoWatches(_ fd: Int32) -> [(wd: Int32, inode: UInt64)] {
        guard case .success(let text) = Syscall.contents(path: "/proc/self/fdinfo/\(fd)") else { return [] }
        var watches: [(Int32, UInt64)] = []
        for line in text.split(separator: UInt8(ascii: "\n")) {
            // inotify wd:1 ino:2a sdev:… (hexadecimal)
            let fields = String(decoding: line, as: UTF8.self).split(separator: " ")
            guard fields.first == "inotify",
                  let wd = fields.first(where: { $0.hasPrefix("wd:") }).flatMap({ Int32($0.dropFirst(3), radix: 16) }),
                  let inode = fields.first(where: { $0.hasPrefix("ino:") }).flatMap({ UInt64($0.dropFirst(4), radix: 16) })
            else { continue }
            watches.append((wd, inode))
        }
        return watches
    }

    /// libinotifytools' instance: the inotify descriptor of this process that holds the
    /// doorbell's watch (libinotifytools does not publish it).
    static func findInstance(watching wd: Int32, of doorbell: Int32) -> Int32? {
        guard case .success(let info) = Syscall.fstat(doorbell),
              case .success(let entries) = Syscall.listDirectory(path: "/proc/self/fd") else { return nil }
        for entry in entries {
            guard let fd = Int32(String(decoding: entry.name, as: UTF8.self)) else { continue }
            if fdinfoWatches(fd).contains(where: { $0.wd == wd && $0.inode == UInt64(info.st_ino) }) { return fd }
        }
        return nil
    }

    /// `raw`, read by libinotifytools, copied out of its buffer.
    static func copy(_ raw: UnsafeMutablePointer<inotify_event>) -> InotifyEvent {
        let length = Int(raw.pointee.len)
        var name: [UInt8] = []
        if length > 0 {
            let bytes = UnsafeRawPointer(raw).advanced(by: MemoryLayout<inotify_event>.size)
                .assumingMemoryBound(to: UInt8.self)
            let buffer = UnsafeBufferPointer(start: bytes, count: length)
            name = Array(buffer.prefix { $0 != 0 })
        }
        return InotifyEvent(wd: raw.pointee.wd, mask: raw.pointee.mask, cookie: raw.pointee.cookie, name: name)
    }

    /// The error of a watch of `path` (or of the instance) that failed with `errno`,
    /// naming the limit reached.
    static func watchError(_ path: FilePath, _ errno: Errno) -> FileCoordinationError {
        switch errno {
        case .noSpace:
            let limit = inotifytools_get_max_user_watches()
            return FileCoordinationError(.inotifyAddWatch, 
                code: .watchLimitReached, path: path, errno: errno,
                message: "the inotify watch limit (fs.inotify.max_user_watches = \(limit)) is reached; "
                    + "raise it with sysctl fs.inotify.max_user_watches=N")
        case .tooManyOpenFiles:
            let limit = inotifytools_get_max_user_instances()
            return FileCoordinationError(.inotifyInit, 
                code: .watchLimitReached, path: path, errno: errno,
                message: "the inotify instance limit (fs.inotify.max_user_instances = \(limit)) is reached")
        default:
            return FileCoordinationError(.inotifyAddWatch, errno: errno, path: path)
        }
    }
}
