import SystemPackage
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One entry of a directory, as ``Syscall/listDirectory(path:)`` reads it.
package struct DirectoryEntry: Sendable, Equatable {
    /// The entry's name, without a NUL.
    package var name: [UInt8]
    /// Its type as the directory records it (`DT_DIR`, `DT_REG`, ...; `DT_UNKNOWN` on a
    /// file system that does not record types, where `lstat` tells).
    package var type: UInt8
    package var inode: UInt64
}

extension Syscall {
    /// The entries of the directory `path`, without `.` and `..`. An error while reading
    /// it ends the listing: the entries read before it are returned.
    package static func listDirectory(path: UnsafePointer<CChar>) -> Result<[DirectoryEntry], Errno> {
        if let fault = Faults.check(.opendir, path) { return .failure(fault) }
        guard let directory = opendir(path) else { return .failure(Errno(rawValue: Glibc.errno)) }
        defer { closedir(directory) }
        var entries: [DirectoryEntry] = []
        while let entry = readdir(directory) {
            let name = directoryEntryName(entry)
            if name == [UInt8(ascii: ".")] || name == [UInt8(ascii: "."), UInt8(ascii: ".")] { continue }
            entries.append(DirectoryEntry(name: name, type: entry.pointee.d_type, inode: UInt64(entry.pointee.d_ino)))
        }
        return .success(entries)
    }
}
