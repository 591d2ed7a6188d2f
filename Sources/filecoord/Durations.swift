import ArgumentParser

/// A length of time on the command line, one rule for every option that takes one: a
/// number is seconds (`1.5`), or it carries its unit (`500ms`, `2s`, `1m`, `1h`);
/// `inf` is forever. A negative value parses, so that the option's own check can name it
/// ("must be zero or more") instead of the parser calling the value missing.
struct CommandDuration: ExpressibleByArgument, Sendable, Equatable {
    /// Seconds; infinity for forever.
    var seconds: Double

    init(seconds: Double) { self.seconds = seconds }

    init?(argument: String) {
        let text = argument.lowercased()
        let units: [(suffix: String, scale: Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)]
        var number = Substring(text), scale = 1.0
        if let unit = units.first(where: { text.hasSuffix($0.suffix) }) {
            number = text.dropLast(unit.suffix.count)
            scale = unit.scale
        }
        // Decimal only: `Double` also reads hexadecimal (`0x10` is 16) and `nan`.
        guard Self.isDecimal(number) || number == "inf", let value = Double(number) else { return nil }
        seconds = value * scale
    }

    /// `[+-]DIGITS[.DIGITS][e[+-]DIGITS]` (digits on at least one side of the point).
    private static func isDecimal(_ text: Substring) -> Bool {
        var rest = text.utf8[...]
        func digits() -> Int {
            let count = rest.prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }.count
            rest = rest.dropFirst(count)
            return count
        }
        if rest.first == UInt8(ascii: "+") || rest.first == UInt8(ascii: "-") { rest = rest.dropFirst() }
        var count = digits()
        if rest.first == UInt8(ascii: ".") {
            rest = rest.dropFirst()
            count += digits()
        }
        guard count > 0 else { return false }
        if rest.first == UInt8(ascii: "e") {
            rest = rest.dropFirst()
            if rest.first == UInt8(ascii: "+") || rest.first == UInt8(ascii: "-") { rest = rest.dropFirst() }
            guard digits() > 0 else { return false }
        }
        return rest.isEmpty
    }

    static var defaultCompletionKind: CompletionKind { .list(["0.5", "1", "500ms", "2s", "1m", "inf"]) }

    /// The value as a `Duration`; nil for forever (beyond 30 years counts as forever).
    var duration: Duration? {
        seconds.isFinite && seconds < 1e9 ? .seconds(seconds) : nil
    }

    /// A usage error naming `option` unless the value is zero or more.
    func requireNonNegative(_ option: String) throws {
        guard seconds >= 0 else { throw ValidationError("\(option) must be zero or more (seconds, or with a unit: 500ms, 2s)") }
    }

    /// How `--help` shows a default: as it would be typed.
    var defaultValueDescription: String { seconds.isFinite ? number + "s" : "inf" }

    /// The value as the tool prints it: `0.3 s`, `2 s`, `forever`.
    var description: String { seconds.isFinite ? number + " s" : "forever" }

    /// The seconds without a needless `.0`.
    private var number: String {
        seconds == seconds.rounded() && abs(seconds) < 1e15 ? "\(Int(seconds))" : "\(seconds)"
    }
}
