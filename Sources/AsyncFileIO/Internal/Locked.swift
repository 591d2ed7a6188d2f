import CFileCoordinationShims
import Synchronization

/// `Synchronization.Mutex`, made visible to ThreadSanitizer: the sanitizer does not see
/// the Mutex as a lock (on Linux it parks on a futex inside an uninstrumented library),
/// so every access inside `withLock` looked racy to it, and real races hid among those
/// reports. Each critical section acquires the Mutex's address on entry and releases it
/// on exit; outside sanitizer builds the two calls do nothing
/// (`fc_tsan_acquire`). Every lock of the library is one of these (`docs/reliability.md`).
package struct Locked<Value: ~Copyable>: ~Copyable {
    @usableFromInline let mutex: Mutex<Value>

    /// A lock protecting `initialValue`.
    public init(_ initialValue: consuming sending Value) {
        mutex = Mutex(initialValue)
    }

    /// Runs `body` with the value, under the lock.
    @inlinable @inline(__always)
    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        // The Mutex's own address, taken outside the critical section: an access to the
        // value inside it would be seen before the acquire.
        let address = withUnsafePointer(to: mutex) { UnsafeMutableRawPointer(mutating: $0) }
        return try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            fc_tsan_acquire(address)
            defer { fc_tsan_release(address) }
            return try body(&value)
        }
    }
}

extension Locked: Sendable where Value: ~Copyable {}
