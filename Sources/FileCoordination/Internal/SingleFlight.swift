import AsyncFileIO

/// One piece of work per key at a time, its result shared: a task that asks for a key
/// whose work is under way waits for that work instead of starting its own.
final class SingleFlight<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private let waiting = Locked<[Key: [CheckedContinuation<Value, Never>]]>([:])

    /// `make`'s value for `key`, made by this task, or by one that asked first while it
    /// was being made. `late` answers a task that finds the work ended between its two
    /// looks (where the value was kept, such as a cache).
    func value(for key: Key, late: @Sendable () -> Value, isolation: isolated (any Actor)? = #isolation,
               make: @Sendable () async -> Value) async -> Value {
        let first = waiting.withLock { waiting in
            guard waiting[key] == nil else { return false }
            waiting[key] = []
            return true
        }
        guard first else {
            return await withCheckedContinuation { continuation in
                let joined = waiting.withLock { waiting -> Bool in
                    guard waiting[key] != nil else { return false }
                    waiting[key]!.append(continuation)
                    return true
                }
                if !joined { continuation.resume(returning: late()) }
            }
        }
        let value = await make()
        for waiter in waiting.withLock({ $0.removeValue(forKey: key) ?? [] }) { waiter.resume(returning: value) }
        return value
    }

    /// Tasks waiting for `key`'s value (for tests).
    func waiters(for key: Key) -> Int { waiting.withLock { $0[key]?.count ?? 0 } }
}
