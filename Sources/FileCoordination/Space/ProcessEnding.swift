/// What this process does when another process of the space may have ended (its record
/// was closed or removed, or events were lost to a queue overflow): pure, so that the
/// directory space (``SpaceMail``) and the simulator decide with the same code.
///
/// A process found gone owes this one nothing more: each request awaiting its answer ends
/// with none (the coordination goes on without that presenter), and what it left behind
/// in the space is cleaned up. And this process owes it nothing: the relinquishes it asked
/// of this process's presenters are given back (``ServingLedger/senderDied(_:)``), or a
/// writer killed after a presenter relinquished would leave that presenter without its
/// item and deaf to every later change of it.
package enum ProcessEnding {
    /// What to do about one process that may have ended.
    package struct Outcome: Equatable {
        /// The requests awaiting its answer, to end with none.
        package var unanswered: [UInt64] = []
        /// Whether what it asked of this process's presenters is given back.
        package var givesBack = false
        /// Whether its files in the space are cleaned up (a request found it gone).
        package var cleansUp = false
    }

    /// The outcome for a process that `waiting` requests await and that this process
    /// `owes` something. `isAlive` (a look at the file system) is asked only when either
    /// holds, and once: a live process is left alone.
    package static func decide(waiting: [UInt64], owes: Bool, isAlive: () -> Bool) -> Outcome {
        guard !waiting.isEmpty || owes, !isAlive() else { return Outcome() }
        return Outcome(unanswered: waiting, givesBack: owes, cleansUp: !waiting.isEmpty)
    }

    /// After a queue overflow, the deaths among the events lost are unknown: the processes
    /// to look at again are every one this process awaits or owes, in order of name.
    package static func toRecheck(awaited: Set<String>, owed: [String]) -> [String] {
        awaited.union(owed).sorted()
    }
}
