import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Blocks until `directory` holds an entry whose name satisfies `matches`, as seen by an
/// inotify instance of its own (the library's may be stalled or belong to the code under
/// test); throws `ETIMEDOUT` when none is there within `timeout`.
public func waitForCreation(in directory: String, within timeout: Duration, where matches: (String) -> Bool) throws {
    let fd = inotify_init1(Int32(IN_CLOEXEC))
    guard fd >= 0 else { throw FixtureError(path: directory, operation: "inotify_init1", errno: errno) }
    defer { close(fd) }
    guard inotify_add_watch(fd, directory, UInt32(IN_CREATE | IN_MOVED_TO)) >= 0 else {
        throw FixtureError(path: directory, operation: "inotify_add_watch", errno: errno)
    }
    // Made before the watch existed: already there.
    if let names = try? FileManager.default.contentsOfDirectory(atPath: directory), names.contains(where: matches) { return }
    var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    let deadline = ContinuousClock.now + timeout
    while true {
        let left = deadline - ContinuousClock.now
        var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard left > .zero, poll(&ready, 1, Int32(left.components.seconds * 1000 + 1)) != 0 else {
            throw FixtureError(path: directory, operation: "wait for a new entry", errno: ETIMEDOUT)
        }
        let length = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if length < 0 && errno == EINTR { continue }
        guard length > 0 else { throw FixtureError(path: directory, operation: "read", errno: errno) }
        var offset = 0
        while offset < length {
            let (nameLength, name) = buffer.withUnsafeBytes { raw -> (Int, String) in
                let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                let start = offset + MemoryLayout<inotify_event>.size
                let bytes = raw[start ..< start + Int(event.len)].prefix { $0 != 0 }
                return (Int(event.len), String(decoding: bytes, as: UTF8.self))
            }
            if matches(name) { return }
            offset += MemoryLayout<inotify_event>.size + nameLength
        }
    }
}
