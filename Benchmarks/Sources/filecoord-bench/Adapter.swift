// The cost of NSFileCoordination: Apple's blocking form through the adapter against the
// same coordination through FileCoordination's own blocking form, in one run.
import Dispatch
import FileCoordination
import Foundation
import NSFileCoordination

/// One uncontended blocking read coordination with an empty accessor, through
/// `NSFileCoordinator.coordinate(readingItemAt:options:error:byAccessor:)` and through
/// `FileCoordinator.coordinateBlocking(readingItemAt:)`, alternating in each round, on a
/// thread of their own (they block it), in this process only.
func runAdapter(_ paths: [String]) async throws {
    await FileCoordinator.leaveCoordinationSpace()
    let url = URL(fileURLWithPath: paths[0])
    let iterations = 20_000
    let (adapter, engine, ratios) = await onOwnThread { () -> ([Double], [Double], [Double]) in
        let wrapped = NSFileCoordinator(), direct = FileCoordinator()
        func throughAdapter(_ count: Int) -> Double {
            var error: NSError?
            let start = DispatchTime.now().uptimeNanoseconds
            for _ in 0 ..< count { wrapped.coordinate(readingItemAt: url, error: &error) { _ in } }
            precondition(error == nil, "\(error!)")
            return Double(DispatchTime.now().uptimeNanoseconds - start) / Double(count) / 1000
        }
        func throughEngine(_ count: Int) -> Double {
            let start = DispatchTime.now().uptimeNanoseconds
            for _ in 0 ..< count { try! direct.coordinateBlocking(readingItemAt: url) { _ in } }
            return Double(DispatchTime.now().uptimeNanoseconds - start) / Double(count) / 1000
        }
        _ = throughAdapter(1000) // warm
        _ = throughEngine(1000)
        var adapter: [Double] = [], engine: [Double] = [], ratios: [Double] = []
        for _ in 0 ..< rounds {
            let a = throughAdapter(iterations), e = throughEngine(iterations)
            adapter.append(a)
            engine.append(e)
            ratios.append(a / e)
        }
        return (adapter, engine, ratios)
    }
    func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
    let ratio = median(ratios)
    print("\nadapter (NSFileCoordination; one uncontended blocking read coordination, empty accessor, in process, no presenters; median of \(rounds) rounds of \(iterations))")
    print(String(format: "  NSFileCoordinator.coordinate(readingItemAt:error:byAccessor:)   %6.2f us", median(adapter)))
    print(String(format: "  FileCoordinator.coordinateBlocking(readingItemAt:)               %6.2f us   adapter/engine %.2fx   goal <= 1.3x: %@",
                 median(engine), ratio, ratio <= 1.3 ? "met" : "NOT MET"))
}

/// Runs `work` on a thread of its own and gives its result.
private func onOwnThread<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: work()) }
    }
}
