import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Open descriptors of this process that point into `directory` (other tests running in
/// parallel open their own files, so a plain count would not be stable).
public func openDescriptors(under directory: FilePath) -> Int {
    let prefix = directory.string
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return entries.filter { entry in
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(entry)") else { return false }
        return target.hasPrefix(prefix)
    }.count
}

/// The kernel's own account of this process's inotify watches, read from
/// `/proc/self/fdinfo` (one `inotify wd:… ino:…` line per watch), independent of any
/// table the library keeps: a watch the library lost track of still shows here.
public enum KernelWatches {
    /// The inode numbers watched by every inotify instance of the process.
    public static func watchedInodes() -> [UInt64] {
        var inodes: [UInt64] = []
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return [] }
        for entry in entries {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(entry)"),
                  target == "anon_inode:inotify",
                  let info = try? String(contentsOfFile: "/proc/self/fdinfo/\(entry)", encoding: .utf8)
            else { continue }
            for line in info.split(separator: "\n") where line.hasPrefix("inotify wd:") {
                guard let field = line.split(separator: " ").first(where: { $0.hasPrefix("ino:") }),
                      let inode = UInt64(field.dropFirst(4), radix: 16) else { continue }
                inodes.append(inode)
            }
        }
        return inodes
    }

    /// How many kernel watches of the process are on the inodes of these paths (the
    /// paths must exist; a watch on a deleted directory's inode is gone with it).
    public static func count(on paths: [FilePath]) -> Int {
        let wanted = Set(paths.compactMap { path -> UInt64? in
            var info = stat()
            return lstat(path.string, &info) == 0 ? UInt64(info.st_ino) : nil
        })
        return watchedInodes().filter { wanted.contains($0) }.count
    }
}
