import ArgumentParser
import Foundation
import AsyncFileIO
@testable import filecoord
import SystemPackage
import Testing

/// `present PATH... -- COMMAND`'s decisions, without processes or clocks, and the split of
/// its command line.
@Suite("present's command: when it runs")
struct ChangeRunStateTests {
    let a = FilePath("/d/a")
    let b = FilePath("/d/b")

    @Test("changes settle into one run; a change during it waits for its end (queue), then settles again")
    func queue() {
        var state = ChangeRunState(onBusy: .queue)
        #expect(state.begin(initial: nil) == [.armIdle(1)])
        #expect(state.handle(.changed([a])) == [.armIdle(2), .armSettle(1)])
        #expect(state.handle(.changed([b, a])) == [.armIdle(3), .armSettle(2)])
        #expect(state.handle(.settled(1)).isEmpty, "an older timer")
        #expect(state.handle(.settled(2)) == [.start([a, b])])
        #expect(state.handle(.changed([b])) == [.armIdle(4)], "never two at once")
        #expect(state.handle(.settled(2)).isEmpty)
        #expect(state.handle(.runEnded(0)) == [.armIdle(5), .armSettle(3)])
        #expect(state.handle(.settled(3)) == [.start([b])])
        #expect(state.handle(.runEnded(0)) == [.armIdle(6)])
        #expect(state.handle(.idle(5)).isEmpty)
        #expect(state.handle(.idle(6)) == [.finish(2)])
    }

    @Test("restart ends the run once on a change; --count finishes with the last run's status; --initial runs at once")
    func restartAndCount() {
        var state = ChangeRunState(onBusy: .restart, limit: 2)
        #expect(state.begin(initial: [a]) == [.armIdle(1), .start([a])])
        #expect(state.handle(.changed([b])) == [.armIdle(2), .signalRun(SIGTERM)])
        #expect(state.handle(.changed([a])) == [.armIdle(3)], "told to end once")
        #expect(state.handle(.runEnded(143)) == [.armIdle(4), .armSettle(1)])
        #expect(state.handle(.settled(1)) == [.start([b, a])])
        #expect(state.handle(.runEnded(7)) == [.finish(7)])
    }

    @Test("a signal: a run not started is given up, one started is passed the signal unless the terminal sent it to the command too; the process dies once the run has ended")
    func signals() {
        var state = ChangeRunState()
        _ = state.begin(initial: nil)
        #expect(state.handle(.stop(SIGINT, fromTerminal: false)) == [.die(SIGINT)], "no run: at once")
        for fromTerminal in [false, true] {
            var running = ChangeRunState()
            _ = running.begin(initial: [a])
            #expect(running.handle(.stop(SIGTERM, fromTerminal: fromTerminal))
                    == (fromTerminal ? [.abandonRun(SIGTERM)] : [.abandonRun(SIGTERM), .signalRun(SIGTERM)]))
            #expect(running.handle(.changed([b])).isEmpty)
            #expect(running.handle(.runEnded(143)) == [.die(SIGTERM)])
        }
    }

    @Test("the command is split off at the first -- that is no option's value; other subcommands keep theirs")
    func commandLine() {
        #expect(PresentCommandLine.split(["present", "d", "--format", "--", "--", "sh", "-c", "x -- y"]) == ["present", "d", "--format", "--"])
        #expect(PresentCommandLine.command.withLock { $0 } == ["sh", "-c", "x -- y"])
        #expect(PresentCommandLine.split(["exec", "--write", "f", "--", "true"]) == ["exec", "--write", "f", "--", "true"])
    }

    @Test("the options that take a value are the parser's")
    func optionsTakingValues() throws {
        #expect(Set(try Self.presentOptions()) == PresentCommandLine.optionsTakingValues)
    }

    /// Every name of `present`'s options that take a value, from the parser's own description.
    static func presentOptions() throws -> [String] {
        let dump = Present.helpMessage(includeHidden: true, columns: 1000)
        // Each option's line starts with its names, then the value's name in angle brackets.
        return dump.split(separator: "\n").flatMap { line -> [String] in
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard trimmed.hasPrefix("-"), let value = trimmed.firstIndex(of: "<") else { return [] }
            return trimmed[..<value].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { $0.hasPrefix("-") }
        }
    }
}
