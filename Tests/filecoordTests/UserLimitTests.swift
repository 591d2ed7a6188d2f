import Foundation
import Testing
import TestSupport

extension CrossProcessTests {
    /// Per-user kernel limits (inotify instances, inotify watches) exhausted by a dedicated
    /// unprivileged uid each. Their limits are nobody else's, but the hundreds of processes
    /// and the 190,000 directories they make load the machine: they run in the serialized
    /// suite, not beside the timing-sensitive ones.
    @Suite("per-user kernel limits, each under a uid of its own")
    struct UserLimitTests: CrossProcessFixture {
        let scratch = Scratch()
    }
}

extension CrossProcessTests.UserLimitTests {
    @Test("under a user's inotify instance limit (128), with 125 presenters running: concurrent exec writers (each waits) all succeed with no lost update, and write and status still work",
          .enabled(if: getuid() == 0, "needs root to run as a dedicated unprivileged user"), .timeLimit(.minutes(10)))
    func manyProcessesUnderInstanceLimit() async throws {
        // A uid of its own: the per-user limits it exhausts are nobody else's.
        let uid = 64123
        let directory = scratch.path + "/limits"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        #expect(chown(directory, uid_t(uid), gid_t(uid)) == 0)
        #expect(chmod(scratch.path, 0o755) == 0)
        let writers = Self.manyWriters
        // Every presenter ready within 240 s in all (4,800 polls), or the script ends them and fails.
        let script = """
            S="$PWD/space" && echo 0 > counter && echo x > doc
            presenters=""
            for i in $(seq 1 125); do echo x > p$i; "$FILECOORD" present --space "$S" p$i > p$i.out 2>&1 & presenters="$presenters $!"; done
            polls=0
            for i in $(seq 1 125); do
              until grep -q ready p$i.out; do # polling files, bounded (// ok)
                grep -q filecoord: p$i.out && { cat p$i.out >&2; kill $presenters; exit 9; }
                polls=$((polls + 1)); [ $polls -le 4800 ] || { echo "p$i: no ready line after 240 s" >&2; kill $presenters; exit 9; }
                sleep 0.05
              done
            done
            writers=""
            for i in $(seq 1 \(writers)); do
              "$FILECOORD" exec --space "$S" --write counter -- sh -c 'n=$(cat counter); echo $((n+1)) > counter' || echo "exec failed: $?" >&2 &
              writers="$writers $!"
            done
            echo new | "$FILECOORD" write --space "$S" p1 || echo "write failed: $?" >&2
            "$FILECOORD" status --space "$S" > status.out || echo "status failed: $?" >&2
            wait $writers
            kill $presenters; wait $presenters 2>/dev/null # each dies by SIGTERM, which sh reports
            cat counter
            """
        let result = try await shell(asUser: uid, in: directory, script)
        #expect(result.status == 0, "\(result.errorText)")
        // Writers that wait over a second say for whom; nothing else is said.
        let unexpected = result.errorText.split(separator: "\n").filter { !$0.hasPrefix("filecoord: waiting for pid ") }
        #expect(unexpected.isEmpty, "\(result.errorText)")
        #expect(result.outputText.trimmingCharacters(in: .whitespacesAndNewlines) == "\(writers)")
        let status = (try? String(contentsOfFile: directory + "/status.out", encoding: .utf8)) ?? ""
        // Under the load of a thousand processes a presenter may not answer `status` within
        // its 2 s (it is then listed as not answering): some must.
        #expect(status.contains("presenters:") && status.contains("/p"), "\(status)")
    }
}

extension CrossProcessTests.UserLimitTests {
    @Test("a presenter of a tree with more directories than the user's watch limit says which part is unwatched (a warning, and a callback at the start and for each directory created later), and leaves watches for the user's other processes",
          .enabled(if: getuid() == 0, "needs root to run as a dedicated unprivileged user"), .timeLimit(.minutes(5)))
    func watchLimitIsReportedWithHeadroom() async throws {
        // A uid of its own: the watches it exhausts are nobody else's.
        let uid = 64124
        let limit = Int((try? String(contentsOfFile: "/proc/sys/fs/inotify/max_user_watches", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 8192
        let directory = scratch.path + "/watches"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        #expect(chown(directory, uid_t(uid), gid_t(uid)) == 0)
        #expect(chmod(scratch.path, 0o755) == 0)
        let groups = limit / 1000 + 2 // a thousand directories each: more than the limit
        // The tree's presenter ready within 240 s (1,200 polls), the other within 60 s, or the
        // script ends them and fails (a presenter that cannot start says why on its stderr).
        let script = """
            S="$PWD/space" && echo x > small
            for i in $(seq 1 \(groups)); do mkdir -p tree/d$i && (cd tree/d$i && seq 1 1000 | sed 's/^/e/' | xargs mkdir); done
            : > big.out; : > big.err; : > small.out; : > small.err # before the loops below read them
            "$FILECOORD" present --space "$S" tree > big.out 2> big.err & big=$!
            polls=0
            until grep -q ready big.out; do # polling files, bounded (// ok)
                grep -q 'filecoord: /' big.err && break
                polls=$((polls + 1)); [ $polls -le 1200 ] || { cat big.err >&2; echo "tree: no ready line after 240 s" >&2; kill $big; exit 9; }
                sleep 0.2
            done
            "$FILECOORD" present --space "$S" small > small.out 2> small.err & small=$!
            polls=0
            until grep -q ready small.out; do # polling files, bounded (// ok)
                grep -q 'filecoord: /' small.err && break
                polls=$((polls + 1)); [ $polls -le 600 ] || { cat small.err >&2; echo "small: no ready line after 60 s" >&2; kill $small $big; exit 9; }
                sleep 0.1
            done
            for late in late1 late2 late3 late4 late5; do
                mkdir tree/$late
                for i in $(seq 1 100); do grep -qx "unwatched $PWD/tree/$late" big.out && break; sleep 0.1; done # polling a file, bounded (// ok)
            done
            kill $small $big; wait
            cat big.out small.out; cat big.err small.err >&2
            """
        let result = try await shell(asUser: uid, in: directory, script)
        #expect(result.status == 0, "\(result.errorText)")
        #expect(result.outputText.contains("ready \(directory)/tree") && result.outputText.contains("ready \(directory)/small"), "\(result.outputText)")
        // The presenter hears it too: each directory left out, at the start and when
        // one is created later (each one the last event for a while).
        let unwatched = result.outputText.split(separator: "\n").filter { $0.hasPrefix("unwatched ") }
        #expect(unwatched.contains { $0.hasPrefix("unwatched \(directory)/tree/d") }, "\(result.outputText.prefix(2000))")
        for late in 1...5 {
            #expect(unwatched.contains("unwatched \(directory)/tree/late\(late)"), "\(unwatched.suffix(6))")
        }
        #expect(!result.outputText.contains("unwatched \(directory)/small"))
        let lines = result.errorText.split(separator: "\n")
        #expect(lines.count == 1 && lines[0].contains("watch limit") && lines[0].contains("\(directory)/tree/d"),
                "one warning naming the unwatched part, none for the other presenter: \(result.errorText)")
        removeTreeLater(directory)
    }
}
