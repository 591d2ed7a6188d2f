import Foundation
import Testing
import TestSupport

/// What a user trying to break `filecoord` tries: input that is long, odd or hostile, and
/// ends that are not the usual ones. Each case answers with a clear error or the
/// documented behaviour, and the process never crashes.
@Suite("filecoord against a hostile user")
struct HostileUseTests {
    /// A name under a missing directory with 1,200 missing components (2.4 KB, well
    /// under PATH_MAX): the resolution of directories not made yet walks them one by one.
    static func deeplyMissing(in scratch: Scratch) -> String {
        scratch.path + "/nonexist/" + String(repeating: "y/", count: 1200) + "z"
    }

    @Test("a name under 1,200 missing directories is treated as any name under a missing directory: ENOENT (exit 1) where a file is opened, the command run by exec (which claims names not made yet), and the process's files leave the space",
          arguments: ["read --cat", "read", "write --append", "write", "exec --read", "exec --write", "exec --delete"])
    func deeplyMissingName(command: String) async throws {
        let scratch = Scratch()
        let space = scratch.path + "/space"
        let name = Self.deeplyMissing(in: scratch)
        let words = command.split(separator: " ").map(String.init)
        var arguments = [words[0], "--space", space] + words.dropFirst()
        let runsCommand = command.hasPrefix("exec")
        arguments += runsCommand ? [name, "--", "echo", "ran"] : [name]
        let result = try await run(filecoordBinary, arguments, stdin: Data("x\n".utf8))
        if runsCommand {
            #expect(result.status == 0 && result.outputText == "ran\n", "\(command): status \(result.status): \(result.errorText.prefix(300))")
        } else {
            #expect(result.status == 1, "\(command): status \(result.status): \(result.errorText.prefix(300))")
            #expect(result.errorText.contains("ENOENT"), "\(command): \(result.errorText.prefix(300))")
        }
        // No record of the process is left behind for the next one to clean up.
        let procs = (try? FileManager.default.contentsOfDirectory(atPath: space + "/procs")) ?? []
        #expect(procs.isEmpty, "\(command): left \(procs)")
    }
}
