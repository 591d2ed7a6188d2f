import AsyncFileIO
import CFileCoordinationShims
import FileWatching
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The space's open files, checked as they are opened. Runs on an I/O thread.
///
/// They are closed when the last of the space's parts that use them is gone (``deinit``),
/// not when the process leaves: a task still under way in the space when it leaves (a
/// wait polling, a message being written) goes on with descriptors that are still these
/// files, where closed ones could by then name a file opened for something else.
final class SpaceFiles: Sendable {
    let directory: FilePath
    let processName: String
    /// This process's id, and the effective uid the space was checked against when it
    /// joined: the owner of every file in it. Kept, so that each message written does not
    /// ask the kernel for its `pid`, nor each message read for the file's expected owner.
    let pid = getpid()
    let owner = geteuid()
    let directoryFD: Int32
    let lockFD: Int32
    let processFD: Int32
    let sequenceFD: Int32
    nonisolated(unsafe) let sequence: UnsafeMutablePointer<UInt64>
    var mailboxPath: FilePath { directory.appending(SpaceLayout.mailbox(processName)) }

    init(directory: FilePath, processName: String) throws {
        self.directory = directory
        self.processName = processName
        var opened: [Int32] = []
        // What this process made of its own, removed again if joining fails: nobody else
        // should have to clean up after a process that never joined.
        var madeHidden = false
        var dirFD: Int32 = -1
        var mapped: UnsafeMutableRawPointer?
        func undoJoin() {
            if madeHidden { _ = Syscall.unlinkat(dirFD, SpaceLayout.hiddenRecord(processName)) }
            if let mapped { _ = Syscall.unmap(mapped, 4096) }
            for fd in opened { _ = Syscall.close(fd) }
        }
        func fail(_ operation: FileCoordinationError.Operation, _ path: FilePath, _ code: Errno) -> FileCoordinationError {
            undoJoin()
            return FileCoordinationError(operation, errno: code, path: path)
        }
        /// Opens a folder or file of the space (`name` relative to the space), refusing
        /// one that is not ours alone.
        func openOwned(_ name: String, _ flags: Int32, kind: OwnedFiles.Kind) throws -> Int32 {
            let path = name.isEmpty ? directory : directory.appending(name)
            switch OwnedFiles.open(name.isEmpty ? fc_AT_FDCWD : dirFD, name.isEmpty ? directory.string : name, flags,
                                   kind: kind, privateOnly: true) {
            case .success(let fd):
                opened.append(fd)
                return fd
            case .failure(.system(let errno)) where name.isEmpty && (errno == .tooManySymbolicLinkLevels || errno == .notDirectory):
                undoJoin()
                throw FileCoordinationError(.open, code: .insecureSpace, path: path, errno: errno,
                                            message: "the coordination space is not a directory (a symbolic link?)")
            case .failure(.system(let errno)):
                throw fail(.open, path, errno)
            case .failure(let problem):
                undoJoin()
                throw FileCoordinationError.refused(.joinTheSpace, problem, path: path)
            }
        }
        func make(_ name: String) throws {
            let path = name.isEmpty ? directory : directory.appending(name)
            let result = name.isEmpty ? Syscall.mkdirat(fc_AT_FDCWD, directory.string, 0o700) : Syscall.mkdirat(dirFD, name, 0o700)
            if case .failure(let errno) = result, errno != .fileExists { throw fail(.mkdir, path, errno) }
        }
        // The space itself, then its folders: created 0700, refused if not ours alone.
        try make("")
        dirFD = try openOwned("", O_RDONLY, kind: .directory)
        directoryFD = dirFD
        for name in SpaceLayout.folders {
            try make(name)
            let fd = try openOwned(name, O_RDONLY, kind: .directory)
            opened.removeLast()
            _ = Syscall.close(fd)
        }
        lockFD = try openOwned(SpaceLayout.claimsLock, O_CREAT | O_RDWR, kind: .regularFile)
        let seqFD = try openOwned(SpaceLayout.registrySequence, O_CREAT | O_RDWR, kind: .regularFile)
        sequenceFD = seqFD
        let size = (try? Syscall.fstat(seqFD).get().st_size) ?? 0
        if size < 4096, case .failure(let errno) = Syscall.ftruncate(seqFD, 4096) {
            throw fail(.ftruncate, directory.appending(SpaceLayout.registrySequence), errno)
        }
        let map: UnsafeMutableRawPointer
        switch Syscall.mapShared(seqFD, 4096) {
        case .success(let made): (map, mapped) = (made, made)
        case .failure(let errno): throw fail(.mmap, directory.appending(SpaceLayout.registrySequence), errno)
        }
        // This process's record, locked for as long as it lives. The record is locked
        // under a hidden name and renamed into place, so no other process can find it
        // unlocked (and take this process for dead). The mailbox comes when the process
        // first needs one (``makeMailbox()``).
        let hidden = SpaceLayout.hiddenRecord(processName)
        let procFD = try openOwned(hidden, O_CREAT | O_EXCL | O_RDWR, kind: .regularFile)
        madeHidden = true
        let bytes = SpaceProtocol.ProcessRecord(pid: pid, listening: false).encoded().encoded()
        switch bytes.withUnsafeBytes({ Syscall.write(procFD, $0.baseAddress!, $0.count) }) {
        case .success(let written) where written == bytes.count: break
        case .success: throw fail(.write, directory.appending(hidden), .noSpace)
        case .failure(let errno): throw fail(.write, directory.appending(hidden), errno)
        }
        if case .failure(let errno) = Syscall.lock(procFD, fc_F_WRLCK, 0, 1) { throw fail(.lock, directory.appending(hidden), errno) }
        if case .failure(let errno) = Syscall.renameat(dirFD, hidden, SpaceLayout.record(processName)) {
            throw fail(.rename, directory.appending(SpaceLayout.record(processName)), errno)
        }
        // Set last: once every property is, a failure would run `deinit` too, and close
        // what `undoJoin` closed.
        sequence = map.assumingMemoryBound(to: UInt64.self)
        processFD = procFD
    }

    deinit {
        _ = Syscall.unmap(sequence, 4096)
        for fd in [lockFD, processFD, sequenceFD, directoryFD] { _ = Syscall.close(fd) }
    }

    /// Creates this process's mailbox (`0700`) and opens it, refusing one that is not ours
    /// alone; returns its descriptor. Blocking. A process makes it when it first needs
    /// it: to hear replies, or requests for its presenters (``SpaceMail/openMailbox()``).
    /// One that only claims never does: no other process writes to a process that does
    /// not listen and has asked nothing.
    func makeMailbox() throws(FileCoordinationError) -> Int32 {
        let name = SpaceLayout.mailbox(processName)
        let path = directory.appending(name)
        if case .failure(let errno) = Syscall.mkdirat(directoryFD, name, 0o700) {
            throw FileCoordinationError(.mkdir, errno: errno, path: path)
        }
        switch OwnedFiles.open(directoryFD, name, O_RDONLY, kind: .directory, privateOnly: true) {
        case .success(let fd):
            return fd
        case .failure(.system(let errno)):
            _ = Syscall.unlinkat(directoryFD, name, directory: true)
            throw FileCoordinationError(.open, errno: errno, path: path)
        case .failure(let problem):
            throw FileCoordinationError.refused(.joinTheSpace, problem, path: path)
        }
    }

    /// Rewrites this process's record in place (its descriptor holds the liveness lock).
    /// Blocking. Through ``CoordinationSpace/writeRecord(listening:claims:)``.
    func writeRecord(_ record: SpaceProtocol.ProcessRecord) throws {
        let bytes = record.encoded().encoded()
        let path = directory.appending(SpaceLayout.record(processName))
        switch bytes.withUnsafeBytes({ Syscall.pwrite(processFD, $0.baseAddress!, $0.count, 0) }) {
        case .success(let count) where count == bytes.count: break
        case .success: throw FileCoordinationError(.write, errno: .noSpace, path: path)
        case .failure(let errno): throw FileCoordinationError(.write, errno: errno, path: path)
        }
        try Syscall.ftruncate(processFD, Int64(bytes.count)).mapError(.ftruncate, path).get()
    }


    /// The registry's change counter (shared memory).
    func loadSequence() -> UInt64 { fc_atomic_load_u64(sequence) }
    func bumpSequence() { _ = fc_atomic_add_u64(sequence, 1) }
}

extension FileCoordinationError {
    /// A file or folder of the space refused for not being this user's alone
    /// (``OwnedFiles``): `insecureSpace`, naming what is wrong with it.
    static func refused(_ operation: Operation, _ problem: OwnedFiles.Problem, path: FilePath) -> FileCoordinationError {
        FileCoordinationError(operation, code: .insecureSpace, path: path, message: "refused: it \(problem.text)")
    }
}
