import CFileCoordinationShims
import Synchronization

/// `Synchronization.Mutex`, made visible to ThreadSanitizer: the sanitizer does not see
/// the Mutex as a lock (on Linux it parks on a futex inside an uninstrumented library),
/// so every access inside `withLock` looked racy to it, and real races hid among those
/// reports. Each critical section acquires the Mutex's address on entry and releases it
/// on exit; outside sanitizer builds the two calls do nothing
/// (`fc_tsan_acquire`). Every lock of the library is one of these (`docs/reliability.md`),
/// named `Locked` inside the package.
///
/// Public, in a module that no product exports, so that `withLock` is inlined and
/// specialized where it is called: Swift 6.3.1 inlines no `@inlinable` member of a
/// `package` type into another module, and as `package` every critical section in the
/// other modules called the generic `withLock`, which looks up `Mutex<Value>`'s metadata
/// at run time on each call (docs/performance.md, "Locks inlined where they are taken").
public struct LockedValue<Value: ~Copyable>: ~Copyable {
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

extension LockedValue: Sendable where Value: ~Copyable {}
