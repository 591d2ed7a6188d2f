import Foundation
import Testing

extension CrossProcessTests {
    @Test("100 processes at once x 2 increments under exec --write (each waits in the kernel behind the others): every one exits 0 and the counter ends at exactly 200",
          .timeLimit(.minutes(3)))
    func manyProcessesOnOneItem() async throws {
        let counter = scratch.write("many", "0")
        let script = """
            export FILECOORD_LOG_LEVEL=error
            p=0
            while [ $p -lt 100 ]; do
              ( for i in 1 2; do
                  "$FILECOORD" exec --space '\(space)' --write '\(counter)' -- sh -c 'n=$(cat "$0"); echo $((n+1)) > "$0"' '\(counter)' || echo "exec failed: $?" >&2
                done ) &
              p=$((p+1))
            done
            wait
            """
        let result = try await shell(script)
        #expect(result.status == 0 && result.errorText.isEmpty, "\(result.errorText)")
        let value = try String(contentsOfFile: counter, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(value == "200")
    }
}
