import AsyncFileIO
import ArgumentParser
import FileCoordination
import Foundation

/// `--event`, `--include`, `--exclude` and `--fromfile`'s `@` lines: which events
/// `present` prints (or, with a command, which changes run it).
struct EventFilter: Sendable {
    /// Passes every event.
    static let all = try! EventFilter()

    /// The presenter's callbacks, as `present` names them.
    static let names = ["relinquishToReader", "relinquishToWriter", "reacquire", "save", "accommodateDeletion", "didChange",
                        "didMove", "subitemDidAppear", "subitemDidChange", "subitemDidMove", "accommodateSubitemDeletion", "resync"]

    /// inotify's event names (as `inotifywait -e` takes them), each for the callbacks that
    /// report what it reports. A presenter hears one kind of change: `modify`,
    /// `close_write` and `attrib` select the same callbacks.
    static let inotifyNames: KeyValuePairs<String, [String]> = [
        "create": ["subitemDidAppear"],
        "modify": ["didChange", "subitemDidChange"],
        "close_write": ["didChange", "subitemDidChange"],
        "attrib": ["didChange", "subitemDidChange"],
        "delete": ["accommodateSubitemDeletion"],
        "delete_self": ["accommodateDeletion"],
        "moved_from": ["subitemDidMove"],
        "moved_to": ["subitemDidMove"],
        "move": ["subitemDidMove"],
        "move_self": ["didMove"],
    ]

    /// Every name `-e` takes, for help and completion.
    static var allNames: [String] { names + inotifyNames.map(\.key) }

    /// Nil: every event.
    let events: Set<String>?
    let include: PosixRegex?
    let exclude: PosixRegex?
    /// Subtrees whose events are left out (`--fromfile`'s `@PATH` lines, as inotifywait's).
    let excludedTrees: [FilePath]

    init(events given: [String] = [], include: String? = nil, exclude: String? = nil, excludedTrees: [FilePath] = []) throws {
        var events: Set<String> = []
        let known = "the events are \(Self.names.joined(separator: ", ")), and inotify's \(Self.inotifyNames.map(\.key).joined(separator: ", "))"
        // `split` would drop empty names (`-e ''`, `-e a,,b`): each must name an event.
        for name in given.flatMap({ $0.split(separator: ",", omittingEmptySubsequences: false) }).map({ $0.trimmingCharacters(in: .whitespaces) }) {
            guard !name.isEmpty else { throw ValidationError("--event: an empty event name; \(known)") }
            if let apple = Self.names.first(where: { $0.lowercased() == name.lowercased() }) {
                events.insert(apple)
            } else if let inotify = Self.inotifyNames.first(where: { $0.key == name.lowercased() }) {
                events.formUnion(inotify.value)
            } else {
                throw ValidationError("--event: no event named '\(name)'; \(known)")
            }
        }
        self.events = given.isEmpty ? nil : events
        self.include = try include.map { try PosixRegex($0, option: "--include") }
        self.exclude = try exclude.map { try PosixRegex($0, option: "--exclude") }
        self.excludedTrees = excludedTrees
    }

    /// Whether an event is printed: its name is wanted, one of its paths included (when
    /// `--include` is given), and not all of them excluded.
    func passes(_ event: String, paths: [FilePath]) -> Bool {
        if let events, !events.contains(event) { return false }
        if let include, !paths.contains(where: include.matches) { return false }
        if let exclude, paths.allSatisfy(exclude.matches) { return false }
        if !excludedTrees.isEmpty, paths.allSatisfy({ path in excludedTrees.contains { path.starts(with: $0) } }) { return false }
        return true
    }
}

/// A POSIX extended regular expression (`regcomp(3)`, as `grep -E` and `inotifywait`
/// take them), matched against a path's bytes.
final class PosixRegex: Sendable {
    private nonisolated(unsafe) let compiled: UnsafeMutablePointer<regex_t>

    init(_ pattern: String, option: String) throws {
        // Compiled before it is stored: a failed init of a class still runs its deinit.
        let compiled = UnsafeMutablePointer<regex_t>.allocate(capacity: 1)
        // The argument's own bytes: a pattern that is not UTF-8 matches the names it spells.
        let bytes = RawArguments.bytes(pattern).map { CChar(bitPattern: $0) } + [0]
        let result = regcomp(compiled, bytes, REG_EXTENDED | REG_NOSUB)
        guard result == 0 else {
            var message = [UInt8](repeating: 0, count: 256)
            message.withUnsafeMutableBufferPointer { buffer in
                _ = buffer.withMemoryRebound(to: CChar.self) { regerror(result, compiled, $0.baseAddress, $0.count) }
            }
            compiled.deallocate()
            let text = String(decoding: message.prefix { $0 != 0 }, as: UTF8.self)
            throw ValidationError("\(option) '\(Output.displayed(FilePath(platformBytes: RawArguments.bytes(pattern))))': \(text)")
        }
        self.compiled = compiled
    }

    deinit {
        regfree(compiled)
        compiled.deallocate()
    }

    /// `regexec` on a compiled pattern is safe from several threads (glibc locks it).
    func matches(_ path: FilePath) -> Bool {
        path.withPlatformString { regexec(compiled, $0, 0, nil, 0) == 0 }
    }
}
