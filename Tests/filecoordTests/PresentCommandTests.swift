import Foundation
import Testing

@Suite("filecoord present")
struct PresentCommandTests {
    @Test("prints ready, then JSON lines for changes made by any program, and exits 0 on SIGTERM")
    func presentDirectory() async throws {
        let scratch = Scratch()
        let present = try LineProcess(["present", scratch.path, "--json"])
        var lines = present.lines.makeAsyncIterator()
        let ready = try #require(await lines.next())
        let object = try #require(try JSONSerialization.jsonObject(with: Data(ready.utf8)) as? [String: Any])
        #expect(object["event"] as? String == "ready")
        #expect(object["path"] as? String == scratch.path)
        #expect(object["pid"] is Int && object["time"] is Double)

        _ = try await shell("cd '\(scratch.path)' && printf a > new.txt && mv new.txt renamed.txt && rm renamed.txt")
        var events: [String] = []
        while events.count < 4, let line = await lines.next() {
            let event = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            events.append("\(event["event"]!) \((event["path"] as? String ?? "").split(separator: "/").last!)\((event["to"] as? String).map { " " + $0.split(separator: "/").last! } ?? "")")
        }
        // Created, then written (printf opens, then writes), renamed, removed.
        #expect(events == ["subitemDidAppear new.txt", "subitemDidChange new.txt", "subitemDidMove new.txt renamed.txt",
                           "accommodateSubitemDeletion renamed.txt"])
        present.signal(SIGTERM)
        #expect(await present.wait().status == 0)
    }

    @Test("ready is the first line even when changes arrive while the presenter is being set up", .timeLimit(.minutes(3)))
    func readyFirst() async throws {
        let scratch = Scratch()
        let tree = scratch.path + "/tree"
        for index in 0 ..< 1000 {
            try FileManager.default.createDirectory(atPath: "\(tree)/d\(index)", withIntermediateDirectories: true)
        }
        // Changes all over the tree while the watches are added, one directory at a time.
        let writer = try LineProcess(["-c", "echo go; i=0; while [ $i -lt 4000 ]; do echo x > '\(tree)'/d$((i % 1000))/f; i=$((i+1)); done"],
                                     executable: "/bin/sh")
        var writerLines = writer.lines.makeAsyncIterator()
        #expect(await writerLines.next() == "go")
        let present = try LineProcess(["present", tree, "--json", "--space", scratch.path + "/space"])
        var lines = present.lines.makeAsyncIterator()
        let first = try #require(await lines.next())
        #expect(first.contains(#""event":"ready""#), "\(first)")
        _ = await writer.wait()
        present.signal(SIGTERM)
        #expect(await present.wait().status == 0)
    }

    @Test("a path that does not exist is a one-line error, exit 1")
    func missing() async throws {
        let result = try await filecoord("present", "/nonexistent-\(UInt32.random(in: 0 ... .max))")
        #expect(result.status == 1)
        #expect(result.errorText.contains("No such file or directory (ENOENT)"))
    }
}
