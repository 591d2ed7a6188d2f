import Dispatch
import Foundation
import Synchronization
import SystemCalls
import SystemPackage

/// A `DispatchIO` channel bridged to async/await, the ``FileIOEngine/dispatchIO`` engine.
///
/// Unlike a bare channel, its ``close(stop:)`` waits for the cleanup handler and returns
/// the error the channel reported, together with the result of closing the descriptor.
final class DispatchChannel: Sendable {
    private final class Cleanup: Sendable {
        private struct State {
            var result: Errno??
            var waiter: CheckedContinuation<Errno?, Never>?
        }
        private let state = Locked(State())

        func finish(_ error: Errno?) {
            let waiter: CheckedContinuation<Errno?, Never>? = state.withLock { state in
                state.result = .some(error)
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume(returning: error)
        }

        func wait() async -> Errno? {
            await withCheckedContinuation { continuation in
                let ready: Errno?? = state.withLock { state in
                    if let result = state.result { return .some(result) }
                    state.waiter = continuation
                    return .none
                }
                if let ready { continuation.resume(returning: ready) }
            }
        }
    }

    private let io: DispatchIO
    private let queue: DispatchQueue
    private let cleanup = Cleanup()
    let path: FilePath?

    /// Takes ownership of `fd`: the cleanup handler closes it, then runs `afterClose`.
    init(fd: Int32, random: Bool, path: FilePath?, afterClose: (@Sendable () -> Void)? = nil) {
        let queue = DispatchQueue(label: "filecoord.dispatchio")
        let cleanup = self.cleanup
        self.queue = queue
        self.path = path
        io = DispatchIO(type: random ? .random : .stream, fileDescriptor: fd, queue: queue) { error in
            var failure: Errno? = error == 0 ? nil : Errno(rawValue: error)
            if case .failure(let errno) = Syscall.close(fd), failure == nil { failure = errno }
            afterClose?()
            cleanup.finish(failure)
        }
        if random { io.setLimit(lowWater: Int.max) }
    }

    /// Reads up to `length` bytes (at `offset` on a random-access channel; stream
    /// channels ignore it and read from the current position).
    func read(offset: Int64, length: Int) async throws -> Data {
        let io = self.io
        let path = self.path
        let accumulated: DispatchData = try await withCheckedThrowingContinuation { continuation in
            nonisolated(unsafe) var buffer = DispatchData.empty
            io.read(offset: off_t(offset), length: length, queue: queue) { done, data, error in
                if let data, !data.isEmpty { buffer.append(data) }
                guard done else { return }
                if error != 0 {
                    continuation.resume(throwing: FileCoordinationError(.read, errno: Errno(rawValue: error), path: path))
                } else {
                    continuation.resume(returning: buffer)
                }
            }
        }
        return Data(accumulated)
    }

    /// Writes all of `bytes`.
    func write(offset: Int64, _ bytes: some DataProtocol) async throws {
        let io = self.io
        let path = self.path
        let data = bytes.withContiguousStorageIfAvailable { DispatchData(bytes: UnsafeRawBufferPointer($0)) }
            ?? Data(bytes).withUnsafeBytes { DispatchData(bytes: $0) }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            io.write(offset: off_t(offset), data: data, queue: queue) { done, _, error in
                guard done else { return }
                if error != 0 {
                    continuation.resume(throwing: FileCoordinationError(.write, errno: Errno(rawValue: error), path: path))
                } else {
                    continuation.resume()
                }
            }
        }
    }

    /// Waits until every operation submitted before it has finished.
    func barrier() async {
        let io = self.io
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            io.barrier { continuation.resume() }
        }
    }

    /// Closes the channel and returns what its cleanup reported (nil: no error).
    func close(stop: Bool) async -> Errno? {
        io.close(flags: stop ? .stop : [])
        return await cleanup.wait()
    }

    /// Closes without waiting (from a `deinit`).
    func closeInBackground() {
        io.close(flags: .stop)
    }
}
