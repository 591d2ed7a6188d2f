import Foundation
import SystemPackage
import Testing
import TestSupport
@testable import FileWatching

/// A randomized checker over the public API: seeded random creates, writes, renames,
/// reused names, subtrees moved out and back, and deletions in a watched directory. After
/// every step, `settle()`'s events are applied to a model of the tree, which must agree
/// with them (no item created twice, none deleted or moved that was not there) and then
/// with the tree on disk. After the run, no kernel watch is left on any of its directories.
///
/// `make test` runs a few thousand steps; `make watch-check` runs more
/// (`FILECOORD_WATCH_CHECK_STEPS`, `FILECOORD_WATCH_CHECK_SEEDS`). A failure names its seed;
/// `FILECOORD_WATCH_CHECK_SEED=N` replays it.
@Suite("FileWatcher model check")
struct WatcherModelCheck {
    static var environment: [String: String] { ProcessInfo.processInfo.environment }

    @Test("random changes, settle after each: the events rebuild the tree exactly")
    func randomRuns() async throws {
        let steps = Self.environment["FILECOORD_WATCH_CHECK_STEPS"].flatMap(Int.init) ?? 1500
        let seeds: [UInt64]
        if let seed = Self.environment["FILECOORD_WATCH_CHECK_SEED"].flatMap(UInt64.init) {
            seeds = [seed]
        } else {
            let count = Self.environment["FILECOORD_WATCH_CHECK_SEEDS"].flatMap(Int.init) ?? 2
            let base = UInt64.random(in: 0 ..< 1 << 32)
            seeds = (0 ..< UInt64(count)).map { base + $0 }
        }
        for seed in seeds {
            let failure = try await Self.check(seed: seed, steps: steps)
            #expect(failure == nil, "seed \(seed) (replay: FILECOORD_WATCH_CHECK_SEED=\(seed)): \(failure ?? "")")
            if failure != nil { break }
        }
    }

    /// Runs one seed; returns what went wrong, with the last steps taken.
    static func check(seed: UInt64, steps: Int) async throws -> String? {
        let dir = WatchedDirectory(), outside = WatchedDirectory()
        var random = SplitMix64(seed: seed)
        var model: [String: Bool] = [:] // relative path -> is a directory
        var log: [String] = []
        let watcher = try await FileWatcher(watching: dir.path)
        defer { watcher.cancel() }
        for step in 0 ..< steps {
            let action = try Self.randomStep(in: dir, outside: outside, &random)
            log.append("\(step): \(action)")
            let events = try await watcher.settle()
            for event in events {
                if let problem = apply(event, to: &model) {
                    return "step \(step) (\(action)): \(problem)\nevents: \(events)\nlast steps:\n" + log.suffix(8).joined(separator: "\n")
                }
            }
            let disk = Self.listTree(dir.path)
            if disk != model {
                let missing = disk.filter { model[$0.key] != $0.value }.keys.sorted()
                let extra = model.filter { disk[$0.key] != $0.value }.keys.sorted()
                return "step \(step) (\(action)): the events disagree with the disk: not reported \(missing), "
                    + "reported but not there \(extra)\nevents: \(events)\nlast steps:\n" + log.suffix(8).joined(separator: "\n")
            }
        }
        watcher.cancel()
        _ = await watcher.watchCount()
        let directories = [dir.path] + model.filter(\.value).keys.map { dir.at($0) }
        let left = KernelWatches.count(on: directories)
        return left == 0 ? nil : "\(left) kernel watches left after cancel()"
    }

    /// Applies one event to the model; a description of the inconsistency, if any.
    static func apply(_ event: FileEvent, to model: inout [String: Bool]) -> String? {
        let path = event.relativePath.string
        switch event.kind {
        case .created:
            guard model[path] == nil else { return "created twice: \(path)" }
            model[path] = event.isDirectory
        case .deleted:
            guard model[path] == event.isDirectory else { return "deleted but unknown (or of another kind): \(path)" }
            model = model.filter { $0.key != path && !$0.key.hasPrefix(path + "/") }
        case .moved:
            guard let destination = event.relativeDestination?.string, model[path] == event.isDirectory else {
                return "moved but unknown: \(path)"
            }
            model = model.filter { $0.key != destination && !$0.key.hasPrefix(destination + "/") }
            var moved: [String: Bool] = [:]
            for (key, isDirectory) in model where key == path || key.hasPrefix(path + "/") {
                moved[destination + key.dropFirst(path.count)] = isDirectory
                model[key] = nil
            }
            model.merge(moved) { $1 }
        case .modified, .attributesChanged:
            guard model[path] != nil else { return "\(event.kind) but unknown: \(path)" }
        case .resync:
            return "unexpected resync: \(event)"
        }
        return nil
    }

    /// The tree below `root`, as relative paths.
    static func listTree(_ root: FilePath) -> [String: Bool] {
        var tree: [String: Bool] = [:]
        func walk(_ relative: String) {
            let path = relative.isEmpty ? root.string : root.string + "/" + relative
            guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else { return }
            for name in names {
                let child = relative.isEmpty ? name : relative + "/" + name
                var info = stat()
                guard lstat(root.string + "/" + child, &info) == 0 else { continue }
                let isDirectory = info.st_mode & S_IFMT == S_IFDIR
                tree[child] = isDirectory
                if isDirectory { walk(child) }
            }
        }
        walk("")
        return tree
    }

    /// One random change: a small namespace, so that names are reused all the time.
    static func randomStep(in dir: WatchedDirectory, outside: WatchedDirectory, _ random: inout SplitMix64) throws -> String {
        let names = ["a", "b", "c", "d"]
        func randomPath(depth: Int) -> String {
            (0 ..< depth).map { _ in names[Int(random.next() % UInt64(names.count))] }.joined(separator: "/")
        }
        let depth = 1 + Int(random.next() % 3)
        let path = randomPath(depth: depth)
        let full = dir.at(path).string
        let parentExists = depth == 1 || FileManager.default.fileExists(atPath: dir.at(path).removingLastComponent().string)
        var info = stat()
        let exists = lstat(full, &info) == 0
        let isDirectory = exists && info.st_mode & S_IFMT == S_IFDIR
        switch random.next() % 7 {
        case 0 where parentExists && !exists:
            touch(dir.at(path))
            return "create \(path)"
        case 1 where exists && !isDirectory:
            touch(dir.at(path), "x")
            return "write \(path)"
        case 2 where !exists || isDirectory:
            let leaf = path + "/" + randomPath(depth: 1)
            // A component may be a file: then mkdir -p fails, as in a shell.
            guard (try? FileManager.default.createDirectory(atPath: dir.at(leaf).string, withIntermediateDirectories: true)) != nil else {
                return "mkdir -p \(leaf) (refused)"
            }
            return "mkdir -p \(leaf)"
        case 3 where exists:
            let target = randomPath(depth: 1 + Int(random.next() % 2))
            guard rename(full, dir.at(target).string) == 0 else { return "rename \(path) -> \(target) (refused)" }
            return "rename \(path) -> \(target)"
        case 4 where exists:
            try FileManager.default.removeItem(atPath: full)
            return "rm -rf \(path)"
        case 5 where exists:
            // Out of the tree and, under another name, back in.
            let away = outside.at("away").string
            try? FileManager.default.removeItem(atPath: away)
            rename(full, away)
            let back = randomPath(depth: 1)
            if rename(away, dir.at(back).string) != 0 { try? FileManager.default.removeItem(atPath: away) }
            return "move \(path) out, back as \(back)"
        default:
            touch(dir.at(names[Int(random.next() % 4)]))
            return "touch"
        }
    }
}
