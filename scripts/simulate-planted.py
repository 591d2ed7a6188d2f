#!/usr/bin/env python3
"""Plants known defects in the production code, one at a time, and runs the simulator's
seeds against each: every one must be found within the seeds `make test` runs (3,000).
Each file is restored from the copy read before the change, whatever happens.

    make simulate-planted            # every defect
    make simulate-planted BUGS="2 5" # some of them
"""
import subprocess, re, sys, os
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
SWIFT = os.environ.get('SWIFT', 'swift')
M='Sources/FileCoordination/Rules/CoordinationMachine.swift'
S='Sources/FileCoordination/Space/ServingMachine.swift'
bugs = [
 ("an answer's reacquirer dropped (machine)", M,
  "case .success(let reacquirer?): reacquirers.append((steps.entry, reacquirer))",
  "case .success(.some): break"),
 ("claims released before the did-change is told (machine)", M,
  "case endSuppressing, tell, giveBack, release, end",
  "case endSuppressing, release, tell, giveBack, end"),
 ("a dead asker's relinquishes never given back (ledger)", 'Sources/FileCoordination/Space/ServingLedger.swift',
  "return keys.compactMap { kept.removeValue(forKey: $0) }",
  "return keys.compactMap { _ in nil }"),
 ("a presenter asked twice (plan)", 'Sources/FileCoordination/Rules/PresenterPlan.swift',
  "if let known = positions[entry.id] {",
  "if false, let known = positions[entry.id] {"),
 ("a reader's claim leaves its item's byte free to another process's writer (claim plan)", 'Sources/FileCoordination/Space/SpaceLocks+Slots.swift',
  "plan.bytes.append(Byte(offset: slot, exclusive: false))",
  "plan.bytes.append(Byte(offset: slot + 3, exclusive: false))"),
 ("a cancellation lost (machine)", M,
  "failure = FileCoordinationError.coordinatorCancelled(path: items.first?.path)",
  "phase = .accessing\n                return .runAccessor(urls)"),
 ("a reacquirer kept for a dead asker (ledger)", 'Sources/FileCoordination/Space/ServingLedger.swift',
  "guard running.remove(key) != nil else { return value }",
  "guard running.remove(key) != nil else { kept[key] = value; return nil }"),
 ("reacquirers not run when a presenter refuses (machine)", M,
  "case .giveBack where !reacquirers.isEmpty: return .giveBack(reacquirers)",
  "case .giveBack where !reacquirers.isEmpty && failure == nil: return .giveBack(reacquirers)"),
 ("a writer's presenters never told didChange (machine)", M,
  "case .tell where !messages.isEmpty: return .tell(messages)",
  "case .tell where !messages.isEmpty && false: return .tell(messages)"),
 ("a save that fails after the relinquish does not give the item back (server)", S,
  "return undo(ledger.reacquire(key).map { [$0] } ?? [], thenReply: .some(failure))",
  "_ = ledger.reacquire(key)\n            return finish(.reply(failure: failure))"),
 ("a reacquire served without running the reacquirer (server)", S,
  "return (machine, .reacquire(kept))",
  "_ = kept\n            return (machine, .end)"),
 ("a relinquish whose asker died while it ran is not undone (server)", S,
  "if let orphan = ledger.relinquished(key, keeping: kept) { return undo([orphan], thenReply: .some(nil)) }",
  "if ledger.relinquished(key, keeping: kept) != nil { return finish(.reply(failure: nil)) }"),
 ("a process found dead is not given back what it asked (process ending)", 'Sources/FileCoordination/Space/ProcessEnding.swift',
  "Outcome(unanswered: waiting, givesBack: owes, cleansUp: !waiting.isEmpty)",
  "Outcome(unanswered: waiting, givesBack: false, cleansUp: !waiting.isEmpty)"),
 ("after an overflow, nobody looked at again (process ending)", 'Sources/FileCoordination/Space/ProcessEnding.swift',
  "awaited.union(owed).sorted()",
  "[]"),
]
only = set(int(a) for a in sys.argv[1:]) if len(sys.argv) > 1 else None
missed = []
for n, (name, path, old, new) in enumerate(bugs, 1):
    if only and n not in only: continue
    s = open(path).read()
    assert s.count(old) == 1, (name, old)
    open(path, 'w').write(s.replace(old, new))
    try:
        b = subprocess.run([SWIFT, 'build', '--build-tests'], capture_output=True, text=True)
        if b.returncode != 0:
            print(f"{n}. {name}: BUILD FAILED\n{b.stdout[-2000:]}", flush=True); continue
        env = dict(os.environ, FILECOORD_SIM_SEEDS='3000')
        t = subprocess.run([SWIFT, 'test', '--skip-build', '--filter', 'SimulationTests/seeds'], capture_output=True, text=True, env=env)
        found = re.findall(r'simulation seed (\d+) failed at step (\d+): (.*)', t.stdout)
        if found:
            seed, step, inv = found[0]
            print(f"{n}. {name}: caught at seed {seed} (step {step}): {inv}", flush=True)
        else:
            print(f"{n}. {name}: NOT caught in 3000 seeds", flush=True)
            missed.append(n)
    finally:
        open(path, 'w').write(s)
subprocess.run([SWIFT, 'build', '--build-tests'], capture_output=True)
sys.exit(1 if missed else 0)
