import Testing
@testable import FileCoordinationEtcd
import FileCoordination

/// The etcd client's parsers of bytes from the network: an answer's head, a chunked
/// body, a watch's messages. Pure: driven here byte by byte and in every cut.
@Suite("etcd space: the wire parsers")
struct EtcdWireTests {
    let limits = EtcdLimits(headBytes: 256, answerBytes: 1000, lineBytes: 32)

    func head(_ text: String) throws(EtcdWireError) -> EtcdHTTPHead? {
        try EtcdHTTPHead.parse(Array(text.utf8)[...], limits: limits)?.head
    }

    @Test("a head gives the status, the framing and whether the connection stays; an incomplete one asks for more")
    func heads() throws {
        #expect(try head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n") == EtcdHTTPHead(status: 200, framing: .length(12), keepsConnection: true))
        #expect(try head("HTTP/1.1 200 OK\nTransfer-Encoding: Chunked\n\n") == EtcdHTTPHead(status: 200, framing: .chunked, keepsConnection: true))
        #expect(try head("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: keep-alive, Close\r\n\r\n")
            == EtcdHTTPHead(status: 503, framing: .length(0), keepsConnection: false))
        #expect(try head("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n")?.keepsConnection == false)
        #expect(try head("HTTP/1.1 200 OK\r\n\r\n") == EtcdHTTPHead(status: 200, framing: .untilClose, keepsConnection: false))
        #expect(try head("HTTP/1.1 100 Continue\r\n\r\n")?.framing == .length(0))
        #expect(try head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n") == nil)
        #expect(try head("") == nil)
        let full = Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}".utf8)
        #expect(try EtcdHTTPHead.parse(full[...], limits: limits)?.size == full.count - 2)
    }

    @Test("a head with a negative, signed, overflowing or oversized length, an unknown coding, or no end within the limit is refused",
          arguments: [
              ("HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", true),
              ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", false),
              ("HTTP/1.1 20 OK\r\n\r\n", false),
              ("HTTP/2 200 OK\r\n\r\n", false),
              ("HTTP/1.1 999 What\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nno colon\r\n\r\n", false),
              ("HTTP/1.1 200 OK\r\nX: " + String(repeating: "a", count: 300), true),
          ])
    func refusedHeads(_ text: String, tooLarge: Bool) {
        #expect(throws: EtcdWireError.self, "\(text.debugDescription)") { try head(text) }
        do {
            _ = try head(text)
        } catch {
            if case .tooLarge = error { #expect(tooLarge, "\(error)") } else { #expect(!tooLarge, "\(error)") }
        }
    }

    /// `input` through a chunk decoder in pieces of `piece` bytes (the unused rest kept
    /// for the next piece, as the connection does): the body, and the bytes left after it.
    func decodeChunked(_ input: [UInt8], piece: Int, bodyLimit: Int? = 1000) throws(EtcdWireError) -> (body: [UInt8], rest: [UInt8]) {
        var decoder = EtcdChunkDecoder(limits: limits, bodyLimit: bodyLimit)
        var body: [UInt8] = []
        var pending: [UInt8] = []
        var offset = 0
        while !decoder.isDone, offset < input.count {
            pending += input[offset..<min(input.count, offset + piece)]
            offset += piece
            let used = try decoder.decode(pending[...], into: &body)
            pending.removeFirst(used)
        }
        return (body, pending + input[min(input.count, offset)...])
    }

    @Test("a chunked body decodes alike whatever pieces it arrives in; extensions and trailers are skipped; what follows is left")
    func chunkedBody() throws {
        let input = Array("5;name=value\r\nhello\r\n1\r\n,\r\n0006\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT".utf8)
        for piece in 1...input.count {
            let (body, rest) = try decodeChunked(input, piece: piece)
            #expect(body == Array("hello, world".utf8), "pieces of \(piece)")
            #expect(rest == Array("NEXT".utf8), "pieces of \(piece)")
        }
    }

    @Test("a chunk size of -1, a size that is not hexadecimal or overflows, a chunk longer than its size, a size line or body past its limit is refused",
          arguments: ["-1\r\nxx\r\n0\r\n\r\n", "zz\r\n", "\r\n", "ffffffffffffffffff\r\n", "8000000000000000\r\n",
                      "2\r\nabc\r\n0\r\n\r\n", "1" + String(repeating: "0", count: 40) + "\r\n", "3e9\r\n", "fff\r\n"])
    func refusedChunks(_ text: String) {
        #expect(throws: EtcdWireError.self, "\(text.debugDescription)") { _ = try decodeChunked(Array(text.utf8), piece: 3) }
    }

    @Test("a stream's messages are split at newlines whatever the chunks; a message past the limit is refused")
    func messages() throws {
        let stream = Array("{\"a\":1}\n\n{\"b\":\n2}\n{\"c\":3}".utf8)
        for piece in 1...stream.count {
            var splitter = EtcdMessageSplitter(limit: 16)
            var found: [[UInt8]] = []
            var offset = 0
            while offset < stream.count {
                found += try splitter.messages(stream[offset..<min(stream.count, offset + piece)])
                offset += piece
            }
            if let last = splitter.finish() { found.append(last) }
            #expect(found == [Array("{\"a\":1}".utf8), Array("{\"b\":".utf8), Array("2}".utf8), Array("{\"c\":3}".utf8)], "pieces of \(piece)")
        }
        var splitter = EtcdMessageSplitter(limit: 4)
        #expect(throws: EtcdWireError.tooLarge("a watch message", limit: 4)) { try splitter.messages(Array("abc".utf8)[...] + Array("de".utf8)) }
    }

    @Test("a watch message is events (with the last revision), progress, created, cancelled or a failure; anything else is refused")
    func watchMessages() throws {
        func decode(_ text: String) throws(EtcdWireError) -> EtcdWatchMessage { try EtcdWatchMessage.decode(Array(text.utf8)) }
        guard case .created = try decode(#"{"result":{"header":{"revision":"3"},"created":true}}"#) else { Issue.record("not created"); return }
        guard case .events(let events, let last) = try decode(
            #"{"result":{"header":{"revision":"9"},"events":[{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"8"}},{"kv":{"mod_revision":"7"}}]}}"#)
        else { Issue.record("not events"); return }
        #expect(events.count == 2 && last == 8)
        guard case .progress(12) = try decode(#"{"result":{"header":{"revision":"12"}}}"#) else { Issue.record("not progress"); return }
        guard case .canceled = try decode(#"{"result":{"canceled":true,"compact_revision":"5"}}"#) else { Issue.record("not cancelled"); return }
        guard case .failure(14, "etcdserver: no leader") = try decode(
            #"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#)
        else { Issue.record("not a failure"); return }
        for bad in ["", "{", "[]", #"{"result":{}}"#, #"{"result":{"header":{"revision":"x"}}}"#, "{\"result\":\u{1}}"] {
            #expect(throws: EtcdWireError.self, "\(bad.debugDescription)") { try decode(bad) }
        }
    }

    @Test("an error answer is classed by its code: Unavailable and DeadlineExceeded go to another member, Unauthenticated renews the token, the rest fail")
    func answerCodes() {
        func answer(_ status: Int, _ body: String) -> EtcdAnswer { EtcdAnswer.parse(status: status, body: Array(body.utf8)) }
        let noLeader = answer(503, #"{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}"#)
        #expect(noLeader.code == 14 && noLeader.message == "etcdserver: no leader" && noLeader.isUnavailable && !noLeader.isRefusal)
        #expect(answer(504, #"{"message":"context deadline exceeded","code":4}"#).isUnavailable)
        // Words in the message decide nothing.
        let notFound = answer(404, #"{"message":"etcdserver: requested lease not found on the leader","code":5}"#)
        #expect(!notFound.isUnavailable && !notFound.isUnauthenticated && !notFound.isRefusal)
        let expired = answer(401, #"{"message":"etcdserver: token has expired","code":16}"#)
        #expect(expired.isUnauthenticated && expired.isRefusal && !expired.isUnavailable)
        #expect(answer(403, #"{"message":"etcdserver: permission denied","code":7}"#).isRefusal)
        #expect(answer(400, #"{"message":"etcdserver: user name is empty","code":3}"#).isUserMissing)
        #expect(!answer(400, #"{"message":"etcdserver: key is not provided","code":3}"#).isUserMissing)
        // No JSON: the status decides, the body is shown.
        let proxy = answer(502, "<html>Bad Gateway</html>")
        #expect(proxy.code == nil && proxy.isUnavailable && proxy.message == "<html>Bad Gateway</html>")
        #expect(!answer(400, "nonsense").isUnavailable)
    }
}
