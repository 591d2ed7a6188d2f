import SystemPackage
import Testing
@testable import FileCoordination

/// The coordination space's message format (docs/protocol.md).
@Suite("Space messages")
struct SpaceMessageTests {
    @Test("encoded as the protocol gives it: version line, kind, fields sorted and percent-encoded, end line")
    func encoding() {
        var message = SpaceMessage(kind: "relinquish")
        message.set("path", FilePath("/tmp/a b/50%"))
        message.set("access", "write")
        let text = String(decoding: message.encoded(), as: UTF8.self)
        #expect(text == "filecoord 1\nkind relinquish\naccess write\npath /tmp/a%20b/50%25\nend\n")
    }

    @Test("fields set in any order, replaced or removed, are encoded once each, sorted; a file's order does not matter")
    func fieldOrder() {
        var message = SpaceMessage(kind: "reply")
        for key in ["re", "b", "result", "a", "text", "c"] { message.set(key, key.uppercased()) }
        message.set("b", "again")
        message["text"] = nil
        message.set("z", "last")
        let text = String(decoding: message.encoded(), as: UTF8.self)
        #expect(text == "filecoord 1\nkind reply\na A\nb again\nc C\nre RE\nresult RESULT\nz last\nend\n")
        let shuffled = "filecoord 1\nkind reply\nz last\nb first\nre RE\na A\nresult RESULT\nc C\nb again\nend\n"
        #expect(SpaceMessage.decode(Array(shuffled.utf8)) == .success(message))
        let bulk = SpaceMessage(kind: "reply", fields: message.fields.reversed())
        #expect(bulk == message)
    }

    @Test("any bytes survive a round trip; truncated and foreign files are told apart")
    func roundTrip() {
        var message = SpaceMessage(kind: "did-move")
        message["to"] = [UInt8(ascii: "/"), 0xFF, 0x0A, 0x7F, 0x20, UInt8(ascii: "%"), UInt8(ascii: "~")]
        message.set("id", "42")
        let bytes = message.encoded()
        #expect(SpaceMessage.decode(bytes) == .success(message))
        #expect(SpaceMessage.decode(bytes.dropLast(4)) == .failure(.truncated))
        #expect(SpaceMessage.decode(Array("filecoord 2\nkind x\nend\n".utf8)) == .failure(.unsupportedVersion))
        #expect(SpaceMessage.decode(Array("hello\nworld\nand\nmore\n".utf8)) == .failure(.notAMessage))
        #expect(SpaceMessage.decode(bytes.dropLast()) == .failure(.truncated))
        #expect(SpaceMessage.decode(bytes + Array("id 43\nend\n".utf8)) == .failure(.truncated))
        #expect(SpaceMessage.decode(Array("filecoord 1\nkind x\nno-value\nend\n".utf8)) == .failure(.badField))
        #expect(SpaceMessage.decode(Array("filecoord 1\nid 1\nend\n".utf8)) == .failure(.badField))
    }
}
