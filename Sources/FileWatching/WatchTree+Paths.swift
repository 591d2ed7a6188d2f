@_spi(FileCoordinationInternal) import AsyncFileIO
import CInotifyTools
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Paths of the watched tree, and the blocking helpers its watcher thread calls.
extension WatchTree {
    // MARK: Paths

    /// The relative bytes of `name` inside `directory`.
    func child(_ directory: WatchNode, _ name: [UInt8]) -> [UInt8] {
        let base = directory.relativeBytes
        return base.isEmpty ? name : base + [UInt8(ascii: "/")] + name
    }

    /// The absolute path of a node, for system calls.
    func absolute(_ node: WatchNode) -> FilePath {
        absolute(relative: node.relativeBytes)
    }

    /// The path below the watched directory given by its relative bytes.
    func absolute(relative: [UInt8]) -> FilePath {
        relative.isEmpty ? syncDirectory : FilePath(platformBytes: rootBytes + [UInt8(ascii: "/")] + relative)
    }

    func emit(_ kind: FileEvent.Kind, path relative: [UInt8], isDirectory: Bool,
                      destination: [UInt8]? = nil, absolute: FilePath? = nil) {
        let event = FileEvent(kind, absolute ?? self.absolute(relative: relative), relativePath: FilePath(platformBytes: relative),
                              destination: destination.map { self.absolute(relative: $0) },
                              relativeDestination: destination.map { FilePath(platformBytes: $0) }, isDirectory: isDirectory)
        if filter?.accepts(event) ?? true { buffer.append(event) }
    }

    // MARK: Helpers (watcher thread; blocking calls are fine on this thread)

    /// The inode number of `path` (not following a link), 0 when nothing is there.
    static func inode(_ path: FilePath) -> UInt64 {
        var info = stat()
        return path.withPlatformString { lstat($0, &info) } == 0 ? UInt64(info.st_ino) : 0
    }

    static func exists(_ path: FilePath) -> Bool { inode(path) != 0 }

    /// The entries of a directory with whether each is a directory (not following links)
    /// and its inode number.
    static func list(_ directory: FilePath) -> [(name: [UInt8], isDirectory: Bool, inode: UInt64)] {
        guard let handle = directory.withPlatformString({ opendir($0) }) else { return [] }
        defer { closedir(handle) }
        var entries: [(name: [UInt8], isDirectory: Bool, inode: UInt64)] = []
        while let entry = readdir(handle) {
            let name = directoryEntryName(entry)
            if name == [0x2E] || name == [0x2E, 0x2E] { continue }
            var isDirectory = entry.pointee.d_type == UInt8(DT_DIR)
            if entry.pointee.d_type == UInt8(DT_UNKNOWN) {
                var info = stat()
                let full = FilePath(platformBytes: directory.platformBytes + [UInt8(ascii: "/")] + name)
                isDirectory = full.withPlatformString { lstat($0, &info) } == 0 && info.st_mode & S_IFMT == S_IFDIR
            }
            entries.append((name, isDirectory, UInt64(entry.pointee.d_ino)))
        }
        return entries
    }
}
