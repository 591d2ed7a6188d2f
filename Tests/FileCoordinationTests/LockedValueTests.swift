import Foundation
import Testing

/// Swift 6.3.1 re-abstracts a function value kept directly as a `Mutex`'s value on every
/// `withLock { $0 }`: the stored closure becomes a thunk around the previous one, one layer
/// per read, and a call goes through every layer. It needs no library code to show
/// (`let m = Mutex<@Sendable () -> Bool>({ true })`, then `m.withLock { $0 }()` in a loop:
/// each call runs deeper in the stack than the one before). The space's "start watching"
/// hook was read once per request, so a process's remote writes grew slower with every
/// write (docs/performance.md, "A closure kept in a lock"). Kept inside a struct, the
/// closure is never re-abstracted.
@Suite("values kept in locks")
struct LockedValueTests {
    static let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Sources")

    @Test("no Locked or Mutex keeps a function value (or a tuple or optional of one) directly: each read would wrap it in one more thunk")
    func noFunctionValuesInLocks() throws {
        var offenders: [String] = []
        let files = FileManager.default.enumerator(atPath: Self.sources.path)?.compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") } ?? []
        #expect(files.count > 50, "the sources were not found at \(Self.sources.path)")
        for file in files {
            let text = try String(contentsOf: Self.sources.appendingPathComponent(file), encoding: .utf8)
            for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                for value in Self.lockedValueTypes(in: String(line)) where Self.isFunctionAtTop(value) {
                    offenders.append("\(file):\(number + 1): \(value)")
                }
            }
        }
        #expect(offenders.isEmpty, "\(offenders.joined(separator: "\n"))")
    }

    @Test("the check finds what it is for")
    func checkFindsOffenders() {
        #expect(Self.lockedValueTypes(in: "let hook = Locked<@Sendable () async -> Bool>({ false })") == ["@Sendable () async -> Bool"])
        #expect(Self.isFunctionAtTop("@Sendable () async -> Bool"))
        #expect(Self.isFunctionAtTop("(@Sendable () -> Void)?"))
        #expect(Self.isFunctionAtTop("(at: Int, run: () -> Void)"))
        #expect(!Self.isFunctionAtTop("[String: [@Sendable () -> Void]]"))
        #expect(!Self.isFunctionAtTop("(url: URL, path: FilePath, key: PathKey)?"))
        #expect(Self.lockedValueTypes(in: "let m = Mutex<[Int: (Int) -> Void]>([:])") == ["[Int: (Int) -> Void]"])
    }

    /// The type arguments of `Locked<…>` and `Mutex<…>` on a line.
    static func lockedValueTypes(in line: String) -> [String] {
        var found: [String] = []
        for name in ["Locked<", "Mutex<"] {
            var rest = line[...]
            while let range = rest.range(of: name) {
                var depth = 1, end = range.upperBound
                while end < rest.endIndex, depth > 0 {
                    switch rest[end] {
                    case "<": depth += 1
                    case ">" where rest[rest.index(before: end)] != "-": depth -= 1
                    default: break
                    }
                    if depth > 0 { end = rest.index(after: end) }
                }
                found.append(String(rest[range.upperBound ..< end]))
                rest = rest[(end < rest.endIndex ? rest.index(after: end) : end)...]
            }
        }
        return found
    }

    /// Whether a type is a function, or a tuple or optional holding one, rather than a
    /// collection or a nominal type that holds it.
    static func isFunctionAtTop(_ type: String) -> Bool {
        var brackets = 0
        var previous: Character = " "
        for character in type {
            switch character {
            case "[": brackets += 1
            case "]": brackets -= 1
            case ">" where previous == "-" && brackets == 0: return true
            default: break
            }
            previous = character
        }
        return false
    }
}
