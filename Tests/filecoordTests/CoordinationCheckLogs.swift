import Foundation

/// What ``CoordinationCheck`` reads in its workers' logs, and the promises it checks there.
///
/// A worker's log has one line per event, times on `CLOCK_MONOTONIC` in nanoseconds:
/// `B <seq> <operation> <reads> <writes> <ns>` and `E <seq> <ns>` around each accessor,
/// `A <item> <asker pid> <ns> <purpose>` each time its presenter is asked (the purpose
/// is the asking coordinator's: each worker makes one coordinator per coordination, so
/// it names the coordination), `W <ns>` once its steps are done, and `U <ns>` / `H <ns>`
/// for the change made at the end and its presenter hearing it.
extension CoordinationCheck {
    /// What the logs showed: the problems, and counts for the round's summary.
    struct Findings {
        var problems: [String] = []
        var accesses = 0
        var increments = 0
        var asks = 0
    }

    /// Checks the logs of one round: no writer's interval overlaps another access to the
    /// same item, the counter counts every completed increment (and at most the ones
    /// killed inside their accessor besides), no presenter was asked twice for one
    /// coordination, and every worker that lived to the end heard the last change within
    /// 1 s. `killed`: when each killed worker was killed; `hung`: the round was stopped
    /// as a hang (the workers' ends are not checked then).
    static func findings(_ logs: [(pid: Int32, text: String)], killed: [Int32: Int64], hung: Bool, counter: Int) -> Findings {
        var found = Findings()
        var intervals: [Interval] = []
        var asks: [(presenter: Int32, item: String, asker: Int32, at: Int64, purpose: String)] = []
        var completedIncrements = 0, openIncrements = 0
        for (pid, text) in logs {
            var open: [Int: Interval] = [:]
            var (changedAt, heardAt): (Int64?, Int64?) = (nil, nil)
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ").map(String.init)
                guard fields.count >= 2 else { continue }
                switch fields[0] {
                case "B" where fields.count == 6:
                    let set: (String) -> Set<String> = { $0 == "-" ? [] : Set($0.split(separator: ",").map(String.init)) }
                    open[Int(fields[1])!] = Interval(pid: pid, writes: set(fields[4]), reads: set(fields[3]),
                                                     begin: Int64(fields[5])!, end: nil, operation: fields[2])
                case "E" where fields.count == 3:
                    if var interval = open.removeValue(forKey: Int(fields[1])!) {
                        interval.end = Int64(fields[2])!
                        if interval.operation == "increment" { completedIncrements += 1 }
                        intervals.append(interval)
                    }
                case "A" where fields.count == 5:
                    asks.append((pid, fields[1], Int32(fields[2])!, Int64(fields[3])!, fields[4]))
                case "U": changedAt = Int64(fields[1])
                case "H": heardAt = Int64(fields[1])
                default: break
                }
            }
            // Begun and never ended: the worker was killed inside the accessor.
            for (_, var interval) in open {
                interval.end = killed[pid]
                if interval.operation == "increment" { openIncrements += 1 }
                intervals.append(interval)
            }
            // A worker that lived to the end: its presenter heard a fresh change in 1 s.
            if killed[pid] == nil, !hung {
                if let changedAt, let heardAt {
                    if heardAt - changedAt > 1_000_000_000 {
                        found.problems.append("worker \(pid)'s presenter heard a change after \(Double(heardAt - changedAt) / 1e9) s")
                    }
                } else {
                    found.problems.append("worker \(pid)'s presenter never heard the change made at the end (deaf)")
                }
            }
        }
        // No writer overlaps another access to the same item.
        var byItem: [String: [Interval]] = [:]
        for interval in intervals {
            for item in interval.writes.union(interval.reads) { byItem[item, default: []].append(interval) }
        }
        for (item, list) in byItem {
            let sorted = list.sorted { $0.begin < $1.begin }
            for (index, first) in sorted.enumerated() {
                let end = first.end ?? .max
                for second in sorted[(index + 1)...] {
                    guard second.begin < end else { break }
                    guard first.writes.contains(item) || second.writes.contains(item) else { continue }
                    found.problems.append("overlap on \(item): \(first.operation) by \(first.pid) [\(first.begin), \(String(describing: first.end))] "
                        + "and \(second.operation) by \(second.pid) from \(second.begin)")
                }
            }
        }
        // No update lost.
        if counter < completedIncrements || counter > completedIncrements + openIncrements {
            found.problems.append("lost update: the counter is \(counter) after \(completedIncrements) completed increments (\(openIncrements) killed inside)")
        }
        // A presenter is asked once per coordination: no two asks of one presenter for
        // one item carry the same coordination's purpose. (Not told by the times: an
        // asker that gave up on a presenter after its timeout runs its accessor, and a
        // presenter that was stopped or starved meanwhile logs that ask later, after it.)
        for group in Dictionary(grouping: asks, by: { "\($0.presenter) \($0.item) \($0.asker) \($0.purpose)" }).values where group.count > 1 {
            let times = group.map(\.at).sorted().map(String.init).joined(separator: " and ")
            found.problems.append("presenter \(group[0].presenter) of \(group[0].item) asked \(group.count) times by \(group[0].asker) for one coordination (at \(times))")
        }
        found.accesses = intervals.count
        found.increments = completedIncrements
        found.asks = asks.count
        return found
    }
}

/// Tells a hung round from a slow one: hung once no worker has written a line for
/// `limit` (a deadlock writes nothing), however long the round has run. A machine so
/// loaded that a round takes minutes is slow, not hung.
struct ProgressWatch {
    let limit: Duration
    private var lastSize = -1
    private var lastChange: ContinuousClock.Instant?

    init(limit: Duration) { self.limit = limit }

    /// The logs' total size at `now`; returns whether the round is hung.
    mutating func observe(size: Int, at now: ContinuousClock.Instant) -> Bool {
        if size != lastSize || lastChange == nil {
            lastSize = size
            lastChange = now
        }
        return now - lastChange! >= limit
    }
}
