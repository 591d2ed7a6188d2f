// Large files consumed in chunks (hash, scan, copy): each of the library's streaming
// paths, as a user calls it, beside a C program that streams each file through one
// reused buffer with read(2), on the same number of threads, in the same run.
import CPeers
import Dispatch
import FileCoordination
import Foundation

/// The C stream: every file through one reused `chunk`-byte buffer per thread.
func cStream(_ paths: [String], threads: Int, chunk: Int) -> Tally {
    var sum: UInt64 = 0
    let bytes = withCPaths(paths) { peer_stream_files($0, $1, Int32(threads), chunk, &sum) }
    return Tally(bytes: Int(bytes), sum: sum)
}

/// `paths` split between `tasks` child tasks (file k to task k % tasks), each running
/// `body` over its files; the tallies summed.
func splitBetween(_ tasks: Int, _ paths: [FilePath], _ body: @escaping @Sendable ([FilePath]) async throws -> Tally) async throws -> Tally {
    try await withThrowingTaskGroup(of: Tally.self) { group in
        for task in 0 ..< tasks {
            let mine = stride(from: task, to: paths.count, by: tasks).map { paths[$0] }
            group.addTask { try await body(mine) }
        }
        var total = Tally()
        for try await tally in group {
            total.bytes += tally.bytes
            total.sum &+= tally.sum
        }
        return total
    }
}

/// Each file through `AsyncFileStream.chunks(ofSize:)`.
@Sendable func streamChunks(_ paths: [FilePath], chunk: Int) async throws -> Tally {
    var tally = Tally()
    for path in paths {
        let stream = try await path.openForReading()
        for try await data in stream.chunks(ofSize: chunk) { tally.add(data) }
        try await stream.close()
    }
    return tally
}

/// Each file as a loop of `RandomAccessFile.read(byteRange:)`, one chunk after another.
@Sendable func rangeReads(_ paths: [FilePath], chunk: Int) async throws -> Tally {
    var tally = Tally()
    for path in paths {
        let file = try await RandomAccessFile(path: path)
        var offset: Int64 = 0
        while offset < file.size {
            let data = try await file.read(byteRange: offset ..< min(file.size, offset + Int64(chunk)))
            guard !data.isEmpty else { break }
            tally.add(data)
            offset += Int64(data.count)
        }
        try await file.close()
    }
    return tally
}

/// Each file as a loop of `RandomAccessFile.read(fromOffset:into:)` into one buffer the
/// caller reuses, as the C stream does.
@Sendable func rangeReadsIntoBuffer(_ paths: [FilePath], chunk: Int) async throws -> Tally {
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 4096)
    defer { buffer.deallocate() }
    var tally = Tally()
    for path in paths {
        let file = try await RandomAccessFile(path: path)
        var offset: Int64 = 0
        while true {
            let n = try await file.read(fromOffset: offset, into: buffer)
            guard n > 0 else { break }
            tally.bytes += n
            tally.sum &+= UInt64(buffer[0]) &+ UInt64(buffer[n - 1]) &+ UInt64(n)
            offset += Int64(n)
        }
        try await file.close()
    }
    return tally
}

/// The large files streamed in 1 MiB chunks: on one task against the C stream on one
/// thread, on two tasks (the files split between them) against it on two threads.
func runStreaming(_ paths: [String]) async throws {
    let filePaths = paths.map { FilePath($0) }
    let chunk = 1 << 20
    let cOne = "c read stream, 1 MiB buffer (1 thread)", cTwo = "c read stream, 1 MiB buffer (2 threads)"
    // (name, its peer, how it runs)
    let allMethods: [(String, String, () async throws -> Tally)] = [
        (cOne, cOne, { cStream(paths, threads: 1, chunk: chunk) }),
        ("filecoord chunks(ofSize: 1 MiB), 1 task", cOne, { try await streamChunks(filePaths, chunk: chunk) }),
        ("filecoord read(byteRange:) loop, 1 task", cOne, { try await rangeReads(filePaths, chunk: chunk) }),
        ("filecoord read(fromOffset:into:), 1 task", cOne, { try await rangeReadsIntoBuffer(filePaths, chunk: chunk) }),
        (cTwo, cTwo, { cStream(paths, threads: 2, chunk: chunk) }),
        ("filecoord chunks(ofSize: 1 MiB), 2 tasks", cTwo, { try await splitBetween(2, filePaths) { try await streamChunks($0, chunk: chunk) } }),
        ("filecoord read(byteRange:) loop, 2 tasks", cTwo, { try await splitBetween(2, filePaths) { try await rangeReads($0, chunk: chunk) } }),
        ("filecoord read(fromOffset:into:), 2 tasks", cTwo, { try await splitBetween(2, filePaths) { try await rangeReadsIntoBuffer($0, chunk: chunk) } }),
    ]
    let methods = allMethods.filter { only == nil || $0.0.hasPrefix(only!) || ($0.0.hasPrefix("c ") && ProcessInfo.processInfo.environment["FILECOORD_BENCH_NOPEER"] == nil) }
    var samples = methods.map { Sample(method: $0.0) }
    var expected: Tally?
    for _ in 0 ..< rounds {
        for (index, method) in methods.enumerated() {
            warmPageCache(paths)
            var tally = Tally()
            let time = try await seconds { tally = try await method.2() }
            if let expected, expected.bytes != tally.bytes || expected.sum != tally.sum {
                print("  checksum mismatch in \(method.0): \(tally) vs \(expected)")
            }
            expected = expected ?? tally
            samples[index].values.append(Double(tally.bytes) / 1_048_576 / time)
        }
    }
    // Every library path: >= 0.8x of the C stream on as many threads.
    let goals = Dictionary(uniqueKeysWithValues: methods.filter { !$0.0.hasPrefix("c ") }.map { ($0.0, 0.8) })
    print("\n8 files of 64 MiB streamed in 1 MiB chunks  (median of \(rounds) rounds; ratio against the C stream on as many threads: median of the rounds' ratios, range in brackets)")
    for (index, sample) in samples.enumerated() {
        guard let base = samples.first(where: { $0.method == methods[index].1 }) else { continue }
        let ratios = zip(sample.values, base.values).map { $0 / $1 }.sorted()
        let ratio = ratios[ratios.count / 2]
        var line = "  \(sample.method.padding(toLength: 44, withPad: " ", startingAt: 0))"
        line += String(format: "%8.0f MiB/s   %.2fx", sample.median, ratio)
        if ratios.count > 1 { line += String(format: " (%.2f-%.2f)", ratios[0], ratios[ratios.count - 1]) }
        if let goal = goals[sample.method] { line += String(format: "   goal >= %.2fx: %@", goal, ratio >= goal ? "met" : "NOT MET") }
        print(line)
    }
}
