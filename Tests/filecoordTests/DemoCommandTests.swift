import Foundation
import Testing
import TestSupport

@Suite("filecoord demo")
struct DemoCommandTests {
    @Test("runs to the end on its own and never shows a torn file; its processes use the --space given")
    func demo() async throws {
        let scratch = Scratch()
        let result = try await filecoord("demo", "--files", "300", "--space", scratch.path + "/space")
        #expect(result.status == 0, "\(result.errorText)")
        #expect(FileManager.default.fileExists(atPath: scratch.path + "/space/claims.lock"))
        #expect(result.outputText.contains("0 torn files"))
        #expect(result.outputText.contains("ENOENT"))
        // Coordination, in order: the writer only writes after the reader is done, and the
        // presenter hears relinquish and save before the write, didChange after it.
        let lines = result.outputText.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        func position(_ prefix: String) -> Int { lines.firstIndex { $0.hasPrefix(prefix) } ?? -1 }
        let order = ["reader:    read ", "presenter: relinquish to a writer", "presenter: save", "writer:    writing",
                     "presenter: the item changed", "presenter: reacquire after the write"].map(position)
        #expect(!order.contains(-1) && order == order.sorted(), "\(order)")
    }

    @Test("a presenter process that ends before it is ready (its space is a symbolic link) is named, and the demo exits 1")
    func presenterFails() async throws {
        let scratch = Scratch()
        try FileManager.default.createDirectory(atPath: scratch.path + "/real", withIntermediateDirectories: false)
        try FileManager.default.createSymbolicLink(atPath: scratch.path + "/link", withDestinationPath: scratch.path + "/real")
        let result = try await run(filecoordBinary, ["demo", "--files", "50", "--space", scratch.path + "/link"],
                                   environment: ["TMPDIR": scratch.path + "/real"])
        #expect(result.status == 1)
        #expect(result.errorText.contains("the presenter process (pid ") && result.errorText.contains(") ended with status 1 before it was ready"),
                "\(result.errorText)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path + "/real") == [])
    }

    @Test("SIGTERM while its presenter process runs: that process stops, the directory goes, and the demo dies by the signal (the shell sees 143)")
    func interrupted() async throws {
        let scratch = Scratch()
        let demo = try LineProcess(["demo", "--files", "300"], environment: ["TMPDIR": scratch.path])
        // Sent as the presenter process prints `ready` (it then runs until it is sent a
        // signal), however late this task runs.
        demo.signal(SIGTERM) { $0.contains("presenter (pid") }
        let (status, stderr) = await demo.wait()
        #expect(demo.process.terminationReason == .uncaughtSignal && status == SIGTERM, "\(stderr)")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: scratch.path)) == [])
        // No process of the demo's runs on (each names the demo's directory in its arguments).
        let survivors = try FileManager.default.contentsOfDirectory(atPath: "/proc").filter { entry in
            guard Int32(entry) != nil, let arguments = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline") else { return false }
            return String(decoding: arguments, as: UTF8.self).contains(scratch.path)
        }
        #expect(survivors.isEmpty, "\(survivors)")
    }
}
