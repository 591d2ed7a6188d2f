import SystemCalls

/// Every lock of the library: a `Synchronization.Mutex` that ThreadSanitizer sees
/// (``SystemCalls/LockedValue``, which says why it is public there).
package typealias Locked<Value: ~Copyable> = LockedValue<Value>
