import SystemPackage
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Sockets (the etcd space's connections to its members).
extension Syscall {
    /// A new socket (`type` may carry `SOCK_CLOEXEC` and `SOCK_NONBLOCK`).
    package static func socket(_ domain: Int32, _ type: Int32, _ protocol: Int32) -> Result<Int32, Errno> {
        if let fault = Faults.check(.socket) { return .failure(fault) }
        return retrying { Glibc.socket(domain, type, `protocol`) }
    }

    /// Starts connecting `fd` to `address`; a non-blocking socket answers `EINPROGRESS`
    /// and goes on in the background. Not retried on `EINTR`: the connection goes on in
    /// the background then too, and a second call answers `EALREADY`.
    package static func connect(_ fd: Int32, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t) -> Result<Void, Errno> {
        if let fault = Faults.check(.connect) { return .failure(fault) }
        if Glibc.connect(fd, address, length) == 0 { return .success(()) }
        return .failure(Errno(rawValue: Glibc.errno))
    }

    /// Sends what it can of `count` bytes: how many (`MSG_NOSIGNAL` in `flags`: a closed
    /// peer is `EPIPE`, no signal).
    package static func send(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ flags: Int32) -> Result<Int, Errno> {
        if let fault = Faults.check(.send) { return .failure(fault) }
        return retrying { Glibc.send(fd, buffer, count, flags) }
    }

    /// Receives up to `count` bytes: how many, 0 when the peer closed the connection
    /// (`MSG_PEEK` in `flags`: they stay to be received again).
    package static func recv(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ flags: Int32) -> Result<Int, Errno> {
        if let fault = Faults.check(.recv) { return .failure(fault) }
        return retrying { Glibc.recv(fd, buffer, count, flags) }
    }

    /// Sets an integer socket option (`SO_KEEPALIVE`, `TCP_NODELAY`, ...).
    package static func setsockopt(_ fd: Int32, _ level: Int32, _ option: Int32, _ value: Int32) -> Result<Void, Errno> {
        if let fault = Faults.check(.setsockopt) { return .failure(fault) }
        var setting = value
        return retrying { Glibc.setsockopt(fd, level, option, &setting, socklen_t(MemoryLayout<Int32>.size)) }.map { _ in () }
    }

    /// The error a non-blocking connect ended with (`SO_ERROR`), 0 when it connected.
    package static func socketError(_ fd: Int32) -> Result<Int32, Errno> {
        if let fault = Faults.check(.getsockopt) { return .failure(fault) }
        var failure: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        return retrying { getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &size) }.map { _ in failure }
    }

    /// Ends the connection's sending, receiving or both (`SHUT_RDWR`): a call blocked on
    /// it in another thread returns.
    package static func shutdown(_ fd: Int32, _ how: Int32) -> Result<Void, Errno> {
        if let fault = Faults.check(.shutdown) { return .failure(fault) }
        return retrying { Glibc.shutdown(fd, how) }.map { _ in () }
    }
}
