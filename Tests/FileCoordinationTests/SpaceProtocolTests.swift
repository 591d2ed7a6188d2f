import Foundation
import SystemPackage
import Testing
@testable import FileCoordination

/// Every message and record of `docs/protocol.md`, as a type and as the text on the wire:
/// each row encodes to exactly that text and decodes back, with no I/O.
@Suite("Space protocol")
struct SpaceProtocolTests {
    typealias P = SpaceProtocol

    /// One row: the typed message and its text, header lines included.
    struct Row: CustomTestStringConvertible, Sendable {
        var body: P.Body
        var text: String
        var testDescription: String { body.kind }
    }

    static let header = P.Header(from: "41-beef", id: 7, pid: 41)

    /// `fields` are the lines after `kind`, sorted by key as the sender writes them.
    static func row(_ body: P.Body, _ fields: String) -> Row {
        Row(body: body, text: "filecoord 1\nkind \(body.kind)\n\(fields)end\n")
    }

    static func presenter(_ call: P.Call, path: String = "/data/a b") -> P.Body {
        .presenter(.init(presenter: 3, path: FilePath(path), call: call))
    }

    static let rows: [Row] = [
        row(presenter(.relinquish(.init(access: .write, purpose: "editor", re: 9))),
            "access write\nfrom 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\npurpose editor\nre 9\n"),
        row(presenter(.relinquish(.init(access: .read, purpose: "a b", re: 9, then: .accommodateDeletion,
                                        subitemDeletions: [FilePath("/data/a b/x"), FilePath("/data/a b/y")]))),
            "access read\nfrom 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\npurpose a%20b\nre 9\n"
                + "subitem.0 /data/a%20b/x\nsubitem.1 /data/a%20b/y\nthen accommodate-deletion\n"),
        row(presenter(.relinquish(.init(access: .write, purpose: "p", re: 1, then: .save))),
            "access write\nfrom 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\npurpose p\nre 1\nthen save\n"),
        row(presenter(.save), "from 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\n"),
        row(presenter(.accommodateDeletion), "from 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\n"),
        row(presenter(.accommodateSubitemDeletion, path: "/data/a b/50%"), "from 41-beef\nid 7\npath /data/a%20b/50%25\npid 41\npresenter 3\n"),
        row(presenter(.didChange), "from 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\n"),
        row(presenter(.didMove(to: FilePath("/data/c"))), "from 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\nto /data/c\n"),
        row(presenter(.subitemDidAppear, path: "/data/a b/n"), "from 41-beef\nid 7\npath /data/a%20b/n\npid 41\npresenter 3\n"),
        row(presenter(.subitemDidChange, path: "/data/a b/n"), "from 41-beef\nid 7\npath /data/a%20b/n\npid 41\npresenter 3\n"),
        row(presenter(.subitemDidMove(to: FilePath("/data/a b/m")), path: "/data/a b/n"),
            "from 41-beef\nid 7\npath /data/a%20b/n\npid 41\npresenter 3\nto /data/a%20b/m\n"),
        row(presenter(.reacquire(re: 9)), "from 41-beef\nid 7\npath /data/a%20b\npid 41\npresenter 3\nre 9\n"),
        row(.reply(.init(re: 5)), "from 41-beef\nid 7\npid 41\nre 5\nresult ok\n"),
        row(.reply(.init(re: 5, failure: "disk full\nreally")), "from 41-beef\nid 7\npid 41\nre 5\nresult error\ntext disk%20full%0Areally\n"),
        row(.status, "from 41-beef\nid 7\npid 41\n"),
        row(.statusReply(.init(re: 5, claims: [.init(isWrite: true, path: FilePath("/w")), .init(isWrite: false, path: FilePath("/r"))],
                               waiting: [.init(isWrite: true, path: FilePath("/q"))], presenters: [FilePath("/p")])),
            "claim.0 w%20/w\nclaim.1 r%20/r\nfrom 41-beef\nid 7\npid 41\npresenter.0 /p\nre 5\nwaiting.0 w%20/q\n"),
    ]

    @Test("each message encodes to its text and decodes back", arguments: rows)
    func roundTrip(_ row: Row) throws {
        var message = row.body.encoded()
        Self.header.stamp(&message)
        #expect(String(decoding: message.encoded(), as: UTF8.self) == row.text)
        let decoded = try SpaceMessage.decode(Array(row.text.utf8)).get()
        #expect(try P.Message(decoding: decoded) == P.Message(header: Self.header, body: row.body))
    }

    @Test("the records: a presenter's and a process's")
    func records() throws {
        let presenter = P.PresenterRecord(from: "41-beef", pid: 41, presenter: 2, path: FilePath("/data/ü"))
        let presenterText = "filecoord 1\nkind presenter\nfrom 41-beef\npath /data/%C3%BC\npid 41\npresenter 2\nend\n"
        #expect(String(decoding: presenter.encoded().encoded(), as: UTF8.self) == presenterText)
        #expect(try P.PresenterRecord(decoding: SpaceMessage.decode(Array(presenterText.utf8)).get()) == presenter)

        let process = P.ProcessRecord(pid: 41, listening: false, claims: [.init(isWrite: false, path: FilePath("/r"))], pidNamespace: 4026531836)
        let processText = "filecoord 1\nkind process\nclaim.0 r%20/r\nlistening 0\npid 41\npid-ns 4026531836\nend\n"
        #expect(String(decoding: process.encoded().encoded(), as: UTF8.self) == processText)
        #expect(try P.ProcessRecord(decoding: SpaceMessage.decode(Array(processText.utf8)).get()) == process)
        // A record of an earlier build has no namespace: it is taken as the reader's.
        let earlier = "filecoord 1\nkind process\nlistening 1\npid 41\nend\n"
        #expect(try P.ProcessRecord(decoding: SpaceMessage.decode(Array(earlier.utf8)).get()).pidNamespace == nil)
    }

    @Test("every kind in the protocol document's table has a row here, and no other kind")
    func documentTable() throws {
        let document = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/protocol.md")
        let text = try String(contentsOf: document, encoding: .utf8)
        // The table whose header starts `| kind |`: its first column lists kinds in backticks.
        let lines = text.split(separator: "\n").map(String.init)
        let start = try #require(lines.firstIndex { $0.hasPrefix("| kind |") })
        var documented: Set<String> = []
        for line in lines[(start + 2)...] {
            guard line.hasPrefix("|") else { break }
            // The kinds, without the fields named in parentheses beside some of them.
            let firstColumn = (line.split(separator: "|", omittingEmptySubsequences: true).first ?? "")
                .replacing(/\([^)]*\)/, with: "")
            for (index, part) in firstColumn.split(separator: "`").enumerated() where index % 2 == 1 {
                documented.insert(String(part))
            }
        }
        #expect(documented == Set(Self.rows.map(\.body.kind)))
    }

    @Test("a missing field or an unknown kind is named, not guessed")
    func invalid() throws {
        func decode(_ text: String) throws -> P.Invalid? {
            let message = try SpaceMessage.decode(Array(text.utf8)).get()
            do {
                _ = try P.Message(decoding: message)
                return nil
            } catch {
                return error
            }
        }
        #expect(try decode("filecoord 1\nkind did-change\nfrom 1-a\nid 1\npid 1\npresenter 1\nend\n") == .missing("path"))
        #expect(try decode("filecoord 1\nkind reacquire\nfrom 1-a\nid 1\npath /a\npid 1\npresenter 1\nend\n") == .missing("re"))
        #expect(try decode("filecoord 1\nkind did-change\nid 1\npath /a\npid 1\npresenter 1\nend\n") == .missing("from"))
        #expect(try decode("filecoord 1\nkind reply\nfrom 1-a\nid 1\npid 1\nre 1\nresult maybe\nend\n") == .missing("result"))
        #expect(try decode("filecoord 1\nkind relinquish\naccess all\nfrom 1-a\nid 1\npath /a\npid 1\npresenter 1\npurpose p\nre 1\nend\n")
                == .missing("access"))
        #expect(try decode("filecoord 1\nkind teleport\nfrom 1-a\nid 1\npath /a\npid 1\npresenter 1\nend\n") == .unknownKind("teleport"))
        // A relative path is not a path of the protocol.
        #expect(try decode("filecoord 1\nkind did-move\nfrom 1-a\nid 1\npath /a\npid 1\npresenter 1\nto b\nend\n") == .missing("to"))
    }
}

@Suite("spaces named by an address: the registration point")
struct SpaceKindsTests {
    @Test("a directory joins no registered kind; an address of a kind no module registered is an error naming it; a registered one joins")
    func kinds() throws {
        #expect(try SpaceKinds.joiner(for: "/tmp/space") == nil)
        #expect(try SpaceKinds.joiner(for: "relative/dir") == nil)
        #expect(try SpaceKinds.joiner(for: "/odd/a://b") == nil)
        let error = try #require(throws: FileCoordinationError.self) { try SpaceKinds.joiner(for: "nosuch://h/p") }
        #expect(error.code == .invalidArgument && error.message.contains("'nosuch'"), "\(error.message)")
        SpaceKinds.register(scheme: "test-kind://") { _, _, _ in throw CancellationError() }
        #expect(try SpaceKinds.joiner(for: "test-kind://h/p") != nil)
    }
}
