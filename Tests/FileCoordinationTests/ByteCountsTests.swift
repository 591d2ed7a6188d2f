import CFileCoordinationShims
import Testing
@testable import FileCoordination

/// The counting of one claim shard's bytes (``ByteCounts``): what the kernel is asked,
/// with no file and no lock.
@Suite("Byte counts")
struct ByteCountsTests {
    @Test("the first task of a byte locks it; later ones ask nothing; a writer upgrades a shared lock")
    func taking() {
        var bytes = ByteCounts()
        #expect(bytes.lockNeeded(at: 10, exclusive: false) == fc_F_RDLCK)
        _ = bytes.take(at: 10, exclusive: false, granted: fc_F_RDLCK)
        #expect(bytes.lockNeeded(at: 10, exclusive: false) == nil)
        #expect(bytes.lockNeeded(at: 10, exclusive: true) == fc_F_WRLCK)
        _ = bytes.take(at: 10, exclusive: true, granted: fc_F_WRLCK)
        #expect(bytes.lockNeeded(at: 10, exclusive: true) == nil && bytes.lockNeeded(at: 10, exclusive: false) == nil)
        #expect(bytes.kernelLock(at: 10) == fc_F_WRLCK && bytes.isInUse)
    }

    @Test("giving back: the last writer downgrades, the last task unlocks, or keeps it idle when allowed")
    func giving() {
        var bytes = ByteCounts()
        _ = bytes.take(at: 10, exclusive: false, granted: fc_F_RDLCK)
        _ = bytes.take(at: 10, exclusive: true, granted: fc_F_WRLCK)
        let downgrade = bytes.give(at: 10, exclusive: true, mayKeepIdle: true)
        #expect(downgrade == .downgrade && bytes.kernelLock(at: 10) == fc_F_RDLCK)
        let kept = bytes.give(at: 10, exclusive: false, mayKeepIdle: true)
        #expect(kept == .none && bytes.idle == 1 && !bytes.isInUse && bytes.lockedCount == 1)
        let again = bytes.take(at: 10, exclusive: false, granted: bytes.lockNeeded(at: 10, exclusive: false))
        #expect(again && bytes.idle == 0, "an idle byte is taken again with no kernel call")
        let unlock = bytes.give(at: 10, exclusive: false, mayKeepIdle: false)
        #expect(unlock == .unlock && bytes.isEmpty)
    }

    @Test("an exclusive byte is never kept idle")
    func exclusiveNotKept() {
        var bytes = ByteCounts()
        _ = bytes.take(at: 4, exclusive: true, granted: fc_F_WRLCK)
        let release = bytes.give(at: 4, exclusive: true, mayKeepIdle: true)
        #expect(release == .unlock && bytes.idle == 0)
    }

    @Test("dropping the idle bytes: one unlock per run of them not interrupted by a byte in use")
    func dropRuns() {
        var bytes = ByteCounts()
        for offset: Int64 in [1, 2, 3, 5, 6, 9] {
            _ = bytes.take(at: offset, exclusive: false, granted: fc_F_RDLCK)
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
