import AsyncFileIO
import Foundation
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The file-system questions a coordination asks, answered on the library's I/O threads
/// (a `stat` on a hung mount must not hold a cooperative-pool thread).
enum FileSystemQueries {
    static func exists(_ path: FilePath) async throws -> Bool {
        try await runOnIOThread { existsNow(path) }
    }

    /// Whether `path` exists, looked at on an I/O thread whatever becomes of the calling
    /// task (what a coordination tells its presenters after the access depends on it).
    static func existsToCompletion(_ path: FilePath) async -> Bool {
        await runOnIOThreadToCompletion { existsNow(path) }
    }

    private static func existsNow(_ path: FilePath) -> Bool {
        if case .success = path.withPlatformString({ Syscall.lstat(path: $0) }) { true } else { false }
    }

    static func isDirectory(_ path: FilePath) async throws -> Bool {
        try await runOnIOThread {
            guard case .success(let info) = path.withPlatformString({ Syscall.stat(path: $0) }) else { return false }
            return info.st_mode & S_IFMT == S_IFDIR
        }
    }

    /// The path with its last component's symbolic links followed (once per link, up to 40).
    static func resolveSymbolicLink(_ path: FilePath) async throws -> FilePath {
        try await runOnIOThread { () throws -> FilePath in
            var current = path
            for _ in 0 ..< 40 {
                let target: FilePath
                switch current.withPlatformString({ Syscall.readlink(path: $0) }) {
                case .success(let bytes): target = FilePath(platformBytes: bytes)
                case .failure(.invalidArgument), .failure(.noSuchFileOrDirectory): return current
                case .failure(let errno): throw FileCoordinationError(.readlink, errno: errno, path: current)
                }
                current = target.isAbsolute
                    ? target.normalizedKeepingParents()
                    : current.removingLastComponent().pushing(target).normalizedKeepingParents()
            }
            throw FileCoordinationError(.readlink, errno: .tooManySymbolicLinkLevels, path: path)
        }
    }

    // MARK: Snapshots (forUploading)

    /// Copies each item into a fresh private directory: a file as a file, a directory as
    /// one `.zip` archive of its contents.
    static func snapshots(of paths: [FilePath]) async throws -> [FilePath] {
        try await runOnIOThread { () throws -> [FilePath] in
            var made: [FilePath] = []
            do {
                for path in paths { made.append(try snapshot(of: path)) }
            } catch {
                removeSnapshotsBlocking(made)
                throw error
            }
            return made
        }
    }

    static func removeSnapshots(_ snapshots: [FilePath]) {
        guard !snapshots.isEmpty else { return }
        Task { _ = try? await runOnIOThread { removeSnapshotsBlocking(snapshots) } }
    }

    private static func removeSnapshotsBlocking(_ snapshots: [FilePath]) {
        for snapshot in snapshots {
            try? FileManager.default.removeItem(atPath: snapshot.removingLastComponent().string)
        }
    }

    private static func snapshot(of path: FilePath) throws -> FilePath {
        var template = Array("\(NSTemporaryDirectory())/filecoord-upload-XXXXXX".utf8CString)
        if case .failure(let errno) = Syscall.mkdtemp(&template) { throw FileCoordinationError(.mkdtemp, errno: errno, path: path) }
        let directory = template.withUnsafeBufferPointer { FilePath(platformString: $0.baseAddress!) }
        let name = path.lastComponent?.string ?? "item"
        let info = try path.withPlatformString { Syscall.stat(path: $0) }.mapError(.stat, path).get()
        if info.st_mode & S_IFMT == S_IFDIR {
            let archive = directory.appending(name + ".zip")
            try ZipWriter.archive(directory: path, to: archive)
            return archive
        }
        let copy = directory.appending(name)
        do {
            try FileManager.default.copyItem(atPath: path.string, toPath: copy.string)
        } catch {
            throw FileCoordinationError(.copy, code: .io, path: path, message: "\(error)", cause: error)
        }
        return copy
    }
}

/// Writes a `.zip` archive of a directory with stored (uncompressed) entries: enough for
/// a faithful snapshot any unzip tool reads. Entries over 4 GiB are refused (no ZIP64).
enum ZipWriter {
    static func archive(directory: FilePath, to archive: FilePath) throws {
        guard let output = FileHandle(forWritingAtPath: archive.string) ?? {
            _ = FileManager.default.createFile(atPath: archive.string, contents: nil)
            return FileHandle(forWritingAtPath: archive.string)
        }() else {
            throw FileCoordinationError(.open, errno: Errno(rawValue: errno), path: archive)
        }
        defer { try? output.close() }
        var central = Data()
        var offset: UInt32 = 0
        var count: UInt16 = 0
        let base = directory.string
        let enumerator = FileManager.default.enumerator(atPath: base)
        var relatives: [String] = []
        while let relative = enumerator?.nextObject() as? String { relatives.append(relative) }
        for relative in relatives.sorted() {
            let full = base + "/" + relative
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: full, isDirectory: &isDirectory) else { continue }
            let name = Data((isDirectory.boolValue ? relative + "/" : relative).utf8)
            let content = isDirectory.boolValue ? Data() : try Data(contentsOf: URL(fileURLWithPath: full))
            guard content.count < Int(UInt32.max) else {
                throw FileCoordinationError(.zip, code: .fileTooLarge, path: FilePath(full), message: "entries over 4 GiB need ZIP64, which the snapshot writer does not produce")
            }
            let crc = crc32(content)
            var local = Data()
            local.append(le32: 0x0403_4B50); local.append(le16: 20); local.append(le16: 0x0800) // UTF-8 names
            local.append(le16: 0); local.append(le16: 0); local.append(le16: 0x21)
            local.append(le32: crc); local.append(le32: UInt32(content.count)); local.append(le32: UInt32(content.count))
            local.append(le16: UInt16(name.count)); local.append(le16: 0)
            local.append(name)
            try output.write(contentsOf: local)
            try output.write(contentsOf: content)
            var entry = Data()
            entry.append(le32: 0x0201_4B50); entry.append(le16: 0x0314); entry.append(le16: 20); entry.append(le16: 0x0800)
            entry.append(le16: 0); entry.append(le16: 0); entry.append(le16: 0x21)
            entry.append(le32: crc); entry.append(le32: UInt32(content.count)); entry.append(le32: UInt32(content.count))
            entry.append(le16: UInt16(name.count)); entry.append(le16: 0); entry.append(le16: 0)
            entry.append(le16: 0); entry.append(le16: 0)
            entry.append(le32: (isDirectory.boolValue ? 0o040755 : 0o100644) << 16)
            entry.append(le32: offset)
            entry.append(name)
            central.append(entry)
            offset += UInt32(local.count + content.count)
            count += 1
        }
        var end = Data()
        end.append(le32: 0x0605_4B50); end.append(le16: 0); end.append(le16: 0)
        end.append(le16: count); end.append(le16: count)
        end.append(le32: UInt32(central.count)); end.append(le32: offset); end.append(le16: 0)
        try output.write(contentsOf: central)
        try output.write(contentsOf: end)
    }

    private static let table: [UInt32] = (0 ..< 256).map { index in
        var value = UInt32(index)
        for _ in 0 ..< 8 { value = value & 1 != 0 ? 0xEDB8_8320 ^ (value >> 1) : value >> 1 }
        return value
    }

    static func crc32(_ data: Data) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in data { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
        return crc ^ 0xFFFF_FFFF
    }
}

private extension Data {
    mutating func append(le16 value: UInt16) { Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) } }
    mutating func append(le32 value: UInt32) { Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) } }
}
