import SystemCalls
#if canImport(Glibc)
import Glibc
#endif

/// Process identifiers across PID namespaces. A process records its pid as it sees it
/// (`getpid`) with its PID namespace; a process in another namespace (a container's
/// entrypoint is pid 1 there) is shown as the viewer's namespace numbers it, which the
/// kernel tells in `/proc/PID/status` (`NSpid`), or said to be another namespace's.
enum PIDNamespaces {
    /// This process's PID namespace (the inode of `/proc/self/ns/pid`); nil without `/proc`.
    static let current: UInt64? = namespace(of: "self")

    /// A pid as this process's namespace numbers it.
    struct Visible: Sendable, Equatable {
        var pid: Int32
        /// The pid is another namespace's: no process of this namespace's `/proc` has it
        /// there (the process is gone, or hidden from this namespace).
        var isForeign: Bool
    }

    /// `pid`, recorded by a process of PID namespace `namespace` (nil: not recorded, as
    /// by a process of an earlier build, taken as this namespace), as this process sees
    /// it. Blocking: it may look through `/proc`.
    static func visible(_ pid: Int32, in namespace: UInt64?) -> Visible {
        guard let namespace, let current, namespace != current else { return Visible(pid: pid, isForeign: false) }
        return translated(pid, from: namespace).map { Visible(pid: $0, isForeign: false) } ?? Visible(pid: pid, isForeign: true)
    }

    /// The namespace of process `process` (`self` or a pid in this `/proc`).
    private static func namespace(of process: String) -> UInt64? {
        // `pid:[4026531836]`
        guard case .success(let target) = Syscall.readlink(path: "/proc/\(process)/ns/pid"),
              let open = target.firstIndex(of: UInt8(ascii: "[")), target.last == UInt8(ascii: "]") else { return nil }
        return UInt64(String(decoding: target[(open + 1) ..< (target.count - 1)], as: UTF8.self))
    }

    /// The pid in this namespace of the process that is `pid` in `namespace`: the process
    /// of `/proc` in that namespace whose `NSpid` ends with `pid`.
    private static func translated(_ pid: Int32, from namespace: UInt64) -> Int32? {
        guard case .success(let entries) = Syscall.listDirectory(path: "/proc") else { return nil }
        for entry in entries {
            let name = String(decoding: entry.name, as: UTF8.self)
            guard let candidate = Int32(name), self.namespace(of: name) == namespace,
                  let numbers = nsPids(of: name), numbers.last == pid else { continue }
            return candidate
        }
        return nil
    }

    /// The `NSpid` line of `/proc/PROCESS/status`: the process's pid in each namespace,
    /// from the one `/proc` belongs to down to its own.
    private static func nsPids(of process: String) -> [Int32]? {
        guard case .success(let bytes) = Syscall.contents(path: "/proc/\(process)/status", limit: 1 << 16) else { return nil }
        for line in bytes.split(separator: UInt8(ascii: "\n")) where line.starts(with: Array("NSpid:".utf8)) {
            return String(decoding: line.dropFirst(6), as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\t" }).compactMap { Int32($0) }
        }
        return nil
    }
}
