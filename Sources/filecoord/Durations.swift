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
        guard !number.isEmpty, let value = Double(number), !value.isNaN else { return nil }
        seconds = value * scale
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
