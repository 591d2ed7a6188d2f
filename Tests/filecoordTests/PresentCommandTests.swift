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
        #expect(await present.endsBy(SIGTERM))
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
        #expect(await present.endsBy(SIGTERM))
    }

    @Test("names with a newline, a tab, a backslash or bytes that are not UTF-8: a text line each, escaped; JSON gives the exact bytes",
          .timeLimit(.minutes(3)))
    func awkwardNames() async throws {
        let scratch = Scratch(), space = Scratch()
        let json = try LineProcess(["present", scratch.path, "--json", "--space", space.path])
        let text = try LineProcess(["present", scratch.path, "--space", space.path])
        var jsonLines = json.lines.makeAsyncIterator(), textLines = text.lines.makeAsyncIterator()
        #expect(await jsonLines.next()?.contains(#""event":"ready""#) == true)
        #expect(await textLines.next() == "ready \(scratch.path)")
        let names: [[UInt8]] = [Array("new\nline".utf8), Array("tab\there".utf8), Array(#"back\slash"#.utf8), [0x63, 0xfe, 0xff], Array("café".utf8)]
        for name in names {
            let path = Array(scratch.path.utf8) + [UInt8(ascii: "/")] + name + [0]
            let fd = path.withUnsafeBufferPointer { open(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self), O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) }
            try #require(fd >= 0)
            close(fd)
        }
        // JSON: every name's exact bytes, from `path`, or `pathBase64` when not UTF-8.
        var heard: Set<[UInt8]> = []
        while heard.count < names.count, let line = await jsonLines.next() {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            guard object["event"] as? String == "subitemDidAppear" else { continue }
            let bytes = try (object["pathBase64"] as? String).map { try #require(Data(base64Encoded: $0)).map { $0 } }
                ?? Array(try #require(object["path"] as? String).utf8)
            #expect((object["pathBase64"] != nil) == (String(validating: bytes, as: UTF8.self) == nil))
            heard.insert(Array(bytes.dropFirst(scratch.path.utf8.count + 1)))
        }
        #expect(heard == Set(names))
        // Text: one line per event, the awkward bytes escaped as `ls -b` does.
        var shown: Set<String> = []
        while shown.count < names.count, let line = await textLines.next() {
            guard line.hasPrefix("subitemDidAppear ") else { continue }
            shown.insert(String(line.dropFirst("subitemDidAppear \(scratch.path)/".count)))
        }
        #expect(shown == [#"new\nline"#, #"tab\there"#, #"back\\slash"#, #"c\376\377"#, "café"])
        json.signal(SIGTERM)
        text.signal(SIGTERM)
        #expect(await json.endsBy(SIGTERM))
        #expect(await text.endsBy(SIGTERM))
    }

    @Test("a path that does not exist is a one-line error, exit 1")
    func missing() async throws {
        let result = try await filecoord("present", "/nonexistent-\(UInt32.random(in: 0 ... .max))")
        #expect(result.status == 1)
        #expect(result.errorText.contains("No such file or directory (ENOENT)"))
    }
}
