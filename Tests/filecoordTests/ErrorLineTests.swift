import AsyncFileIO
@testable import filecoord
import SystemPackage
import Testing

/// The one line an error or a summary is on stderr.
@Suite("filecoord's error and summary lines")
struct ErrorLineTests {
    @Test("a control character in a library message (a newline in a name it quotes) is escaped: the error stays one line")
    func messageEscaped() {
        let failure = FileCoordinationError(.open, code: .io, path: FilePath("/srv/a\nb/f"),
                                            message: "no temporary file can be made beside it, in /srv/a\nb")
        let line = String(decoding: Output.reportLine(failure), as: UTF8.self)
        #expect(line.filter { $0 == "\n" }.count == 1 && line.hasSuffix("\n"), "\(line)")
        #expect(line.contains("/srv/a\\nb"), "\(line)")
    }

    @Test("read's summary counts past 2^32 bytes and files")
    func readSummary() {
        #expect(ReadSettings.summary(files: 5_000_000_000, bytes: 4_831_838_208, failed: 3, seconds: 2)
                == "read 5000000000 files, 4831838208 bytes in 2.000 s (2500000000 files/s, 2304.0 MiB/s), 3 failed\n")
    }
}
