import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage

/// The kernel's own account of this process's inotify watches, read from
/// `/proc/self/fdinfo` (one `inotify wd:… ino:…` line per watch), independent of any
/// table the library keeps: a watch the library lost track of still shows here.
enum KernelWatches {
    /// The inode numbers watched by every inotify instance of the process.
    static func watchedInodes() -> [UInt64] {
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
    static func count(on paths: [FilePath]) -> Int {
        let wanted = Set(paths.compactMap { path -> UInt64? in
            var info = stat()
            return lstat(path.string, &info) == 0 ? UInt64(info.st_ino) : nil
        })
        return watchedInodes().filter { wanted.contains($0) }.count
    }
}

/// Runs `body`, failing with `what` if it takes longer than `limit`: a bound on a wait
/// that a defect would make endless, so that the test fails instead of hanging the suite.
/// The body runs in a task of its own, left behind if it never ends (a task group would
/// wait for it).
func within<T: Sendable>(_ limit: Duration, _ what: String,
                         _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let once = Locked<CheckedContinuation<T, any Error>?>(nil)
    let resume: @Sendable (Result<T, any Error>) -> Void = { result in
        once.withLock { continuation in
            continuation?.resume(with: result)
            continuation = nil
        }
    }
    return try await withCheckedThrowingContinuation { continuation in
        once.withLock { $0 = continuation }
        let work = Task { resume(await Result(catching: { try await body() })) }
        Task {
            try? await Task.sleep(for: limit) // ok: the bound on a hang, not a stand-in for an event
            resume(.failure(Hang(what: what, limit: limit)))
            work.cancel()
        }
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

struct Hang: Error, CustomStringConvertible {
    let what: String, limit: Duration
    var description: String { "\(what) did not finish within \(limit)" }
}
