import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Keeps recently freed read buffers for reuse.
///
/// Reading many files makes one buffer per file. Handed straight back to `malloc`,
/// they make glibc trim and regrow its heaps, and every regrown page is a page fault
/// that the kernel must zero: measured here, that doubled the system time of a batch
/// of small files. Buffers come in power-of-two size classes from 4 KiB to 4 MiB; at
/// most 32 MiB is kept in all, so an idle process holds little.
enum BufferRecycler {
    private static let smallestClass = 12 // 4 KiB
    private static let largestClass = 22 // 4 MiB
    private static let maximumCachedBytes = 32 << 20

    private struct Cache: ~Copyable {
        /// Buffer addresses by size class (as integers: raw pointers are not `Sendable`).
        var free: [[UInt]] = Array(repeating: [], count: largestClass - smallestClass + 1)
        var cachedBytes = 0
    }
    /// The lock and its lists live in an object of their own: stored in the static
    /// itself, every lock and unlock wrote the cache line that also holds the static's
    /// lazy-initialisation token, which every call reads first (measured: a third of
    /// `allocate`'s time was that read missing the cache).
    private final class Shared: Sendable {
        let cache = Locked(Cache())
    }
    private static let shared = Shared()

    /// The size class index for `count` bytes, or nil when it is not recycled.
    private static func sizeClass(_ count: Int) -> Int? {
        guard count > 0, count <= 1 << largestClass else { return nil }
        let bits = max(smallestClass, Int.bitWidth - (count - 1).leadingZeroBitCount)
        return bits - smallestClass
    }

    /// A buffer of at least `count` bytes, to be released through ``data(_:count:)`` or ``release(_:count:)``.
    static func allocate(_ count: Int) -> UnsafeMutableRawPointer? {
        guard let index = sizeClass(count) else { return malloc(max(count, 1)) }
        let reused: UInt? = shared.cache.withLock { cache in
            guard let buffer = cache.free[index].popLast() else { return nil }
            cache.cachedBytes -= 1 << (index + smallestClass)
            return buffer
        }
        return reused.flatMap { UnsafeMutableRawPointer(bitPattern: $0) } ?? malloc(1 << (index + smallestClass))
    }

    /// Gives back a buffer from ``allocate(_:)`` whose requested size was `count`.
    static func release(_ buffer: UnsafeMutableRawPointer, count: Int) {
        guard let index = sizeClass(count) else {
            free(buffer)
            return
        }
        let size = 1 << (index + smallestClass)
        let address = UInt(bitPattern: buffer)
        let kept = shared.cache.withLock { cache in
            guard cache.cachedBytes + size <= maximumCachedBytes else { return false }
            cache.free[index].append(address)
            cache.cachedBytes += size
            return true
        }
        if !kept { free(buffer) }
    }

    /// Wraps `count` bytes of a buffer from ``allocate(_:)`` (allocated for exactly
    /// `count` bytes) as `Data` without copying; the buffer comes back here when the
    /// `Data` is freed.
    static func data(_ buffer: UnsafeMutableRawPointer, count: Int) -> Data {
        guard count > 0 else {
            release(buffer, count: 1)
            return Data()
        }
        return Data(bytesNoCopy: buffer, count: count, deallocator: .custom { pointer, count in
            BufferRecycler.release(pointer, count: count)
        })
    }
}
