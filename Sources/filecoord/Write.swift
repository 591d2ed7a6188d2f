import ArgumentParser
import AsyncFileIO
import CFileCoordinationShims
import FileCoordination
import Foundation
import SystemCalls

struct Write: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "write",
        abstract: "Copy stdin into a file under a coordinated write intent.",
        discussion: """
            Presenters of PATH (and of its directories), in any process of the space, are \
            asked to relinquish it and must acknowledge before the file changes; they hear \
            didChange after. stdin is read to its end before the claim is taken, so a slow \
            producer never holds it, and it is never held in memory whole: without \
            --append it streams into an unnamed temporary file beside PATH, which is renamed \
            over PATH under the claim (atomic: a reader sees the old content or the new, \
            never a mix, even if the writer is killed); with --append it is kept aside (in \
            memory up to 8 MiB, past that in an unnamed temporary file) and appended under \
            the claim. A failure (a full disk, a read error) exits 1 and leaves PATH as it was.
            """
    )

    @Argument(help: "The file to write.", completion: .file())
    var path: String

    @Flag(help: "Append to the file instead of replacing it.")
    var append = false

    @Flag(name: .customLong("no-coordination"), help: "Write without taking a coordinated write intent.")
    var noCoordination = false

    @OptionGroup var coordination: CoordinationOptions

    /// The size of each read of stdin and write of the file.
    static let chunkSize = 1 << 20

    /// The values given, apart from the parser.
    var settings: WriteSettings {
        WriteSettings(path: path, append: append, noCoordination: noCoordination, coordination: coordination.settings)
    }

    func run() async throws { try await settings.run() }
}

/// What ``Write`` holds, and what it does: a plain value, which ``QuickArguments`` makes
/// from the usual arguments without the parser.
struct WriteSettings: Sendable {
    var path: String
    var append: Bool
    var noCoordination: Bool
    var coordination: CoordinationSettings

    func run() async throws {
        let target = RawArguments.path(path)
        let input = DescriptorWriter(fd: 0, label: "filecoord.stdin")
        // The claim names the file that changes: through a symbolic link, its target (an
        // atomic replacement renames over the name it is given).
        let resolved: FilePath
        do { resolved = try await runOnIOThread { try target.resolvingSymbolicLinks() } } catch let error as FileCoordinationError {
            Output.report(error)
            throw Status.failed
        }
        if append {
            let spool: Spool
            do { spool = try await Spool.fill(from: input, beside: resolved) } catch {
                Output.report(error)
                throw Status.failed
            }
            try await write(to: resolved) { url in
                let file = try FilePath(fileURL: url)
                // A failed append (a full disk) is cut back to where it started (under the
                // claim, nobody else appended meanwhile), and a file it made is removed.
                let start: off_t? = try await runOnIOThread {
                    var info = stat()
                    return file.withPlatformString { stat($0, &info) } == 0 ? info.st_size : nil
                }
                var output: AsyncFileStream<WriteMode>? = try await file.openForWriting(options: [.append])
                do {
                    try await spool.forEachChunk { chunk in try await output!.write(chunk) }
                    try await output.take()!.close()
                } catch {
                    if let output = output.take() { try? await output.close() }
                    _ = try? await runOnIOThread {
                        file.withPlatformString { path in
                            if let start { _ = truncate(path, start) } else { _ = Syscall.unlink(path) }
                        }
                    }
                    throw error
                }
            }
            return
        }
        var output: AsyncFileStream<WriteMode>?
        do {
            output = try await resolved.openForWriting(options: [.atomic])
            while true {
                let chunk = try await input.readChunk(upToCount: Write.chunkSize)
                if chunk.isEmpty { break }
                try await output!.write(chunk)
            }
            // On the device before the claim is taken: only the rename is left for it.
            try await output!.synchronize()
        } catch let error as FileCoordinationError {
            // Dropped unpublished: the temporary file goes, PATH is untouched.
            Output.report(error)
            throw Status.failed
        }
        try await write(to: resolved) { _ in try await output.take()!.close() }
    }

    /// Runs `publish` under a coordinated write of `path` (or without one, with
    /// --no-coordination); a failure is reported and exits 1 (3 for a timeout).
    private func write(to path: FilePath, _ publish: (URL) async throws -> Void) async throws {
        if noCoordination {
            do { try await publish(path.fileURL) } catch let error as FileCoordinationError {
                Output.report(error)
                throw Status.failed
            }
            return
        }
        let coordinator = try await coordination.coordinator()
        try await coordination.run(wanted: [InTheWay.Wanted(path: path, isWrite: true)]) { reporter in
            try await coordinator.coordinate(writingItemAt: path.fileURL, options: []) { url in
                reporter.granted()
                return try await publish(url)
            }
        }
    }
}

/// Input kept aside until it is appended: in memory up to ``memoryLimit``, past that in an
/// unnamed temporary file (`O_TMPFILE`) beside the target, which vanishes with its
/// descriptor, whatever happens.
final class Spool: Sendable {
    static let memoryLimit = 8 << 20

    private let memory: Data
    private let fd: Int32
    private let path: FilePath

    private init(memory: Data, fd: Int32, path: FilePath) {
        self.memory = memory
        self.fd = fd
        self.path = path
    }

    deinit { if fd >= 0 { close(fd) } }

    /// Reads `input` to its end.
    static func fill(from input: DescriptorWriter, beside target: FilePath) async throws(FileCoordinationError) -> Spool {
        var memory = Data()
        while memory.count <= memoryLimit {
            let chunk = try await input.readChunk(upToCount: Write.chunkSize)
            if chunk.isEmpty { return Spool(memory: memory, fd: -1, path: target) }
            memory += chunk
        }
        // Beside the target (its file system has room for what it takes), else in the
        // temporary directory: appending needs no right to the target's directory, and
        // some file systems (NFS, vfat) have no `O_TMPFILE`.
        let directory = target.removingLastComponent().isEmpty ? FilePath(".") : target.removingLastComponent()
        let temporary = FilePath(environmentVariable("TMPDIR").flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp")
        let opened: Result<Int32, FileCoordinationError> = await (try? runOnIOThread {
            var first: FileCoordinationError?
            for place in [directory, temporary] {
                let fd = place.withPlatformString { fc_open($0, fc_O_TMPFILE | O_RDWR | O_CLOEXEC, 0o600) }
                if fd >= 0 { return .success(fd) }
                first = first ?? FileCoordinationError(.open, errno: Errno(rawValue: errno), path: place)
            }
            return .failure(first!)
        }) ?? .failure(FileCoordinationError(.write, code: .cancelled, path: target, message: "cancelled"))
        let fd = try opened.get()
        let spool = Spool(memory: Data(), fd: fd, path: target)
        var pending = memory
        while !pending.isEmpty {
            try await spool.writeToFile(pending)
            pending = try await input.readChunk(upToCount: Write.chunkSize)
        }
        return spool
    }

    private func writeToFile(_ data: Data) async throws(FileCoordinationError) {
        let (fd, path) = (fd, path)
        let result: Result<Void, FileCoordinationError> = await (try? runOnIOThread {
            data.withUnsafeBytes { raw -> Result<Void, FileCoordinationError> in
                var offset = 0
                while offset < raw.count {
                    let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                    if n < 0 && errno == EINTR { continue }
                    if n < 0 { return .failure(FileCoordinationError(.write, errno: Errno(rawValue: errno), path: path)) }
                    offset += n
                }
                return .success(())
            }
        }) ?? .failure(FileCoordinationError(.write, code: .cancelled, path: path, message: "cancelled"))
        try result.get()
    }

    /// Hands the input over in pieces of at most ``Write/chunkSize`` bytes.
    func forEachChunk(_ body: (Data) async throws -> Void) async throws {
        guard fd >= 0 else {
            if !memory.isEmpty { try await body(memory) }
            return
        }
        var offset: off_t = 0
        while true {
            let (fd, path, start) = (fd, path, offset)
            let chunk: Data = try await runOnIOThread {
                var buffer = Data(count: Write.chunkSize)
                let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, Write.chunkSize, start) }
                guard n >= 0 else { throw FileCoordinationError(.read, errno: Errno(rawValue: errno), path: path) }
                buffer.count = n
                return buffer
            }
            if chunk.isEmpty { return }
            try await body(chunk)
            offset += off_t(chunk.count)
        }
    }
}
