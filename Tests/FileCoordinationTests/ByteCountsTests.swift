import CFileCoordinationShims
import Testing
@testable import FileCoordination

/// The counting of one claim shard's bytes (``ByteCounts``): what the kernel is asked,
/// with no file and no lock.
@Suite("Byte counts")
struct ByteCountsTests {
    /// Takes `offset`, recording what the kernel was asked (and granting it).
    func take(_ bytes: inout ByteCounts, _ offset: Int64, exclusive: Bool, grant: Bool = true) -> (ByteCounts.Taken, [Int16]) {
        var asked: [Int16] = []
        let taken = bytes.take(at: offset, exclusive: exclusive) { type in
            asked.append(type)
            return grant
        }
        return (taken, asked)
    }

    @Test("the first task of a byte locks it; later ones ask nothing; a writer upgrades a shared lock; a refusal counts nothing")
    func taking() {
        var bytes = ByteCounts()
        let first = take(&bytes, 10, exclusive: false)
        #expect(first.0 == .taken(wasIdle: false) && first.1 == [fc_F_RDLCK])
        let second = take(&bytes, 10, exclusive: false)
        #expect(second.1.isEmpty)
        let refused = take(&bytes, 10, exclusive: true, grant: false)
        #expect(refused.0 == .refused && refused.1 == [fc_F_WRLCK] && bytes.kernelLock(at: 10) == fc_F_RDLCK)
        let upgrade = take(&bytes, 10, exclusive: true)
        #expect(upgrade.1 == [fc_F_WRLCK] && bytes.kernelLock(at: 10) == fc_F_WRLCK && bytes.isInUse)
        let more = take(&bytes, 10, exclusive: true)
        #expect(more.1.isEmpty)
    }

    @Test("giving back: the last writer downgrades, the last task unlocks, or keeps it idle when allowed")
    func giving() {
        var bytes = ByteCounts()
        _ = take(&bytes, 10, exclusive: false)
        _ = take(&bytes, 10, exclusive: true)
        let downgrade = bytes.give(at: 10, exclusive: true, mayKeepIdle: true)
        #expect(downgrade == .downgrade && bytes.kernelLock(at: 10) == fc_F_RDLCK)
        let kept = bytes.give(at: 10, exclusive: false, mayKeepIdle: true)
        #expect(kept == .none && bytes.idle == 1 && !bytes.isInUse && bytes.lockedCount == 1)
        let again = take(&bytes, 10, exclusive: false)
        #expect(again.0 == .taken(wasIdle: true) && again.1.isEmpty && bytes.idle == 0, "an idle byte is taken again with no kernel call")
        let unlock = bytes.give(at: 10, exclusive: false, mayKeepIdle: false)
        #expect(unlock == .unlock && bytes.isEmpty)
    }

    @Test("an exclusive byte is never kept idle")
    func exclusiveNotKept() {
        var bytes = ByteCounts()
        _ = take(&bytes, 4, exclusive: true)
        let release = bytes.give(at: 4, exclusive: true, mayKeepIdle: true)
        #expect(release == .unlock && bytes.idle == 0)
    }

    @Test("dropping the idle bytes: one unlock per run of them not interrupted by a byte in use")
    func dropRuns() {
        var bytes = ByteCounts()
        for offset: Int64 in [1, 2, 3, 5, 6, 9] {
            _ = take(&bytes, offset, exclusive: false)
        }
        for offset: Int64 in [1, 2, 3, 6, 9] { _ = bytes.give(at: offset, exclusive: false, mayKeepIdle: true) }
        #expect(bytes.idle == 5)
        let runs = bytes.dropIdle()
        // 7 and 8 are not locked by this process: unlocking them too costs nothing.
        #expect(runs == [1 ... 3, 6 ... 9])
        #expect(bytes.idle == 0 && bytes.lockedCount == 1 && bytes.kernelLock(at: 5) == fc_F_RDLCK)
        let none = bytes.dropIdle()
        #expect(none.isEmpty)
    }
}
