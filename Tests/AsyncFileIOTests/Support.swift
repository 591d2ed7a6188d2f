import CFileCoordinationShims
import Foundation
import SystemPackage
import SystemCalls
import Testing
@testable import AsyncFileIO
import TestSupport

/// A fresh directory under the system's temporary directory, removed on `deinit`.
final class TemporaryDirectory: Sendable {
    let path: FilePath

    /// Made under `base` (the system's temporary directory by default).
    init(_ name: String = "t", under base: String = NSTemporaryDirectory()) {
        var template = Array("\(base)/filecoord-\(name)-XXXXXX".utf8CString)
        let created = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(created != nil, "mkdtemp failed")
        path = template.withUnsafeBufferPointer { FilePath(platformString: $0.baseAddress!) }
    }

    deinit { removeTreeLater(path.string) }

    func file(_ name: String) -> FilePath { path.appending(name) }

    /// Writes `data` synchronously, without `fsync` (test set-up only).
    @discardableResult
    func make(_ name: String, _ data: Data) throws -> FilePath {
        let target = file(name)
        try writeFixture(data, toPath: target.string)
        return target
    }
}

/// Deterministic test bytes: `count` bytes seeded by `seed`, eight per xorshift step (a
/// step per byte took seconds for 32 MiB in a debug build, on the cooperative pool).
func pattern(_ count: Int, seed: UInt64 = 1) -> Data {
    var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
    var data = Data(count: count)
    data.withUnsafeMutableBytes { (raw: UnsafeMutableRawBufferPointer) in
        var index = 0
        while index < count {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17
            withUnsafeBytes(of: state.littleEndian) { word in
                let n = min(8, count - index)
                raw.baseAddress!.advanced(by: index).copyMemory(from: word.baseAddress!, byteCount: n)
                index += n
            }
        }
    }
    return data
}

/// The calling thread's name.
func currentThreadName() -> String {
    var buffer = [CChar](repeating: 0, count: 32)
    _ = buffer.withUnsafeMutableBufferPointer { fc_get_thread_name_for_tests($0.baseAddress!, $0.count) }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

func fc_get_thread_name_for_tests(_ buffer: UnsafeMutablePointer<CChar>, _ size: Int) -> Int32 {
    fc_get_thread_name(buffer, size)
}

let isRoot = getuid() == 0

/// Makes a FIFO (test set-up).
func makeFIFO(_ path: FilePath) throws {
    guard path.withPlatformString({ mkfifo($0, 0o600) }) == 0 else {
        throw FileCoordinationError("mkfifo", errno: Errno(rawValue: errno), path: path)
    }
}

/// Whether the root directory lies on a local disk's file system, as the library judges it.
let rootIsLocalDisk = Syscall.rootDeviceCached().map(CachedWholeFileReader.isLocalDisk) ?? false

/// Whether the kernel's mount IDs are never reused (Linux 6.8 and later: `statx` gives
/// `STATX_MNT_ID_UNIQUE`).
let uniqueMountIDs: Bool = {
    var name = utsname()
    uname(&name)
    let release = withUnsafeBytes(of: &name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    let numbers = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
    return numbers.count == 2 && (numbers[0], numbers[1]) >= (6, 8)
}()

/// Whether `path` lies on the root directory's mount: the mount whose point is the
/// longest prefix of its real path, in `/proc/self/mountinfo`, is `/`'s.
func onRootMount(_ path: FilePath) -> Bool {
    guard let real = realpath(path.string, nil) else { return false }
    defer { free(real) }
    let resolved = String(cString: real)
    let points = mountTable().split(separator: "\n").compactMap { line -> String? in
        let fields = line.split(separator: " ")
        return fields.count > 4 ? String(fields[4]) : nil
    }
    let longest = points.filter { point in
        point == "/" || resolved == point || resolved.hasPrefix(point + "/")
    }.max { $0.count < $1.count }
    return longest == "/"
}

/// This process's mount table, `/proc/self/mountinfo`, read to its end (Foundation's
/// reads of a file whose size is 0 stop after the first page).
func mountTable() -> String {
    guard case .success(let bytes) = Syscall.contents(path: "/proc/self/mountinfo") else { return "" }
    return String(decoding: bytes, as: UTF8.self)
}

/// Runs `mount` (or `umount`) with `arguments` and waits for it without holding a thread;
/// throws when it fails.
func runMount(_ arguments: [String], umount: Bool = false) async throws {
    _ = try await runTool(umount ? "/bin/umount" : "/bin/mount", arguments)
}

/// Mounts a test makes, undone by ``withPrivateMounts(in:_:)``.
final class TestMounts {
    private(set) var targets: [String] = []
    /// Run after the mounts are undone, last first.
    var cleanups: [() async -> Void] = []

    /// Mounts (`mount ARGUMENTS`), to be undone at the end.
    func mount(_ arguments: [String]) async throws {
        try await runMount(arguments)
        targets.append(arguments.last!)
    }

    /// Undoes the last mount now.
    func unmountLast() async throws {
        try await runMount([targets.last!], umount: true)
        targets.removeLast()
    }
}

/// Runs `body` with `base` bind-mounted on itself and made private, so that the mounts the
/// test makes in it stay there; undoes every mount (lazily, last first) and runs the
/// cleanups however `body` ends.
func withPrivateMounts(in base: TemporaryDirectory, _ body: (TestMounts) async throws -> Void) async throws {
    let mounts = TestMounts()
    let outcome: Result<Void, any Error>
    do {
        try await mounts.mount(["--bind", base.path.string, base.path.string])
        try await runMount(["--make-private", base.path.string])
        try await body(mounts)
        outcome = .success(())
    } catch {
        outcome = .failure(error)
    }
    for target in mounts.targets.reversed() { try? await runMount(["-l", target], umount: true) }
    for cleanup in mounts.cleanups.reversed() { await cleanup() }
    try outcome.get()
}

/// Runs the program at `path` with `arguments`, waits for it without holding a thread, and
/// returns its standard output; throws when it fails.
func runTool(_ path: String, _ arguments: [String]) async throws -> String {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    let status: Int32 = try await withCheckedThrowingContinuation { continuation in
        process.terminationHandler = { continuation.resume(returning: $0.terminationStatus) }
        do { try process.run() } catch { continuation.resume(throwing: error) }
    }
    // (The program has ended: its output is all in the pipe, which ends there.)
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    guard status == 0 else {
        throw FileCoordinationError(code: .invalidArgument, path: FilePath(arguments.last ?? ""),
                                    operation: URL(fileURLWithPath: path).lastPathComponent, message: "exited with \(status)")
    }
    return text.trimmingCharacters(in: .whitespacesAndNewlines)
}

/// Whether this process may mount: `mount` is there and a bind mount of a fresh
/// directory on itself succeeds (a capability alone does not say what a security module
/// allows).
let canBindMount: Bool = {
    guard FileManager.default.isExecutableFile(atPath: "/bin/mount") else { return false }
    let directory = TemporaryDirectory("can-mount")
    return directory.path.withPlatformString { point in
        guard mount(point, point, nil, UInt(MS_BIND), nil) == 0 else { return false }
        umount2(point, Int32(MNT_DETACH))
        return true
    }
}()

/// Odd inputs for a read that may run on the caller's thread, most of which it leaves to
/// the I/O threads (to be read there as always): a link to `target`, an empty file, one
/// of `overLimit` bytes, one missing, a directory, a FIFO, a file in `elsewhere` (a
/// tmpfs on some machines), a name without a directory and `file` with a trailing slash.
func oddInputs(in directory: TemporaryDirectory, elsewhere: TemporaryDirectory, linkTo target: FilePath,
               overLimit: Int, nextTo file: FilePath) throws -> [FilePath] {
    try FileManager.default.createSymbolicLink(atPath: directory.file("link").string, withDestinationPath: target.string)
    let empty = try directory.make("empty", Data())
    let large = try directory.make("large", pattern(overLimit))
    try makeFIFO(directory.file("fifo"))
    let other = try elsewhere.make("other", pattern(700))
    return [directory.file("link"), empty, large, directory.file("missing"), directory.path,
            directory.file("fifo"), other, FilePath("relative-missing"), FilePath(file.string + "/")]
}

/// Expects `read` (of `path`, on whichever thread) to be what the I/O threads' read of
/// `path` alone gives: the same bytes, or an error of the same code naming `path`.
func expectReadsAsAlone(_ read: Result<Data, any Error>, _ path: FilePath, maximumSize: Int,
                        sourceLocation: SourceLocation = #_sourceLocation) {
    switch (read, FileOperations.readWholeFile(path, maximumSize: maximumSize)) {
    case (.success(let data), .success(let expected)): #expect(data == expected, "\(path)", sourceLocation: sourceLocation)
    case (.failure(let error as FileCoordinationError), .failure(let expected)):
        #expect(error.code == expected.code, "\(path)", sourceLocation: sourceLocation)
        #expect(error.path == path, sourceLocation: sourceLocation)
    case (let read, let alone): Issue.record("\(path): \(read), \(alone) alone", sourceLocation: sourceLocation)
    }
}
