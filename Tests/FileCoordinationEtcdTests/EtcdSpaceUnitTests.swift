import Foundation
import SystemPackage
import Testing
@testable import FileCoordinationEtcd
import FileCoordination

/// The etcd space's pure parts: addresses, names relative to a root, the order of claims.
@Suite("etcd space: addresses, names, claim order")
struct EtcdSpaceUnitTests {
    @Test("an address gives endpoints and a prefix; a malformed one says what is wrong; the environment sets the root, the lease's TTL, the timeout and the user")
    func addresses() throws {
        let configuration = try EtcdCoordinationSpace.Configuration(address: "etcd://10.0.0.1:2379,[::1]:2380,db/builds/x")
        #expect(configuration.endpoints == ["10.0.0.1:2379", "[::1]:2380", "db"])
        #expect(configuration.prefix == "builds/x")
        #expect(try EtcdCoordinationSpace.Configuration(address: "etcd://h:1").prefix == "filecoord")
        #expect(EtcdEndpoint("[::1]:2380")?.host == "::1")
        #expect(EtcdEndpoint("db")?.port == 2379)
        for bad in ["etcd://", "etcd:///p", "etcd://h:0/p", "etcd://h:x/p", "etcd://:1/p", "http://h:1/p"] {
            #expect(throws: FileCoordinationError.self, "\(bad)") { try EtcdCoordinationSpace.Configuration(address: bad) }
        }
        let error = try #require(throws: FileCoordinationError.self) { try EtcdCoordinationSpace.Configuration(address: "etcd://h:x/p") }
        #expect(error.code == .invalidArgument && error.message.contains("'h:x' is not HOST:PORT"))
        let set = try EtcdCoordinationSpace.Configuration(address: "etcd://h:1", environment: [
            "FILECOORD_ROOT": "/mnt/share", "FILECOORD_LEASE_TTL": "12", "FILECOORD_ETCD_TIMEOUT": "2.5", "FILECOORD_ETCD_USER": "u"])
        #expect(set.root == "/mnt/share" && set.leaseTTL == .seconds(12) && set.connectTimeout == .milliseconds(2500) && set.user == "u")
        for bad in ["0", "-1", "inf", "nan", "1e30", "30s"] {
            let unset = try EtcdCoordinationSpace.Configuration(address: "etcd://h:1", environment: ["FILECOORD_ETCD_TIMEOUT": bad, "FILECOORD_LEASE_TTL": bad])
            #expect(unset.connectTimeout == .seconds(5) && unset.leaseTTL == .seconds(5) && unset.tls == nil, "\(bad)")
        }
    }

    @Test("names are relative to the root, written absolute; paths outside it have none")
    func names() {
        let names = EtcdNames(root: Array("/mnt/share".utf8))
        #expect(names.shared(Array("/mnt/share/a/b".utf8)) == Array("/a/b".utf8))
        #expect(names.shared(Array("/mnt/share".utf8)) == Array("/".utf8))
        #expect(names.shared(Array("/mnt/shared/a".utf8)) == nil)
        #expect(names.shared(Array("/etc/passwd".utf8)) == nil)
        #expect(names.local(Array("/a/b".utf8)) == FilePath("/mnt/share/a/b"))
        #expect(names.local(Array("/".utf8)) == FilePath("/mnt/share"))
        let identity = EtcdNames(root: Array("/".utf8))
        #expect(identity.shared(Array("/x".utf8)) == Array("/x".utf8))
        #expect(identity.local(Array("/x".utf8)) == FilePath("/x"))
    }

    @Test("a request waits for every earlier conflicting request of another process, and only those")
    func claimOrder() {
        func claim(_ path: String, _ access: CoordinationRules.Access, _ scope: CoordinationRules.Scope = .item) -> CoordinationRules.Claim {
            CoordinationRules.Claim(path: FilePath(path), access: access, scope: scope)
        }
        func entry(_ name: String, _ member: String, _ revision: Int64, _ claims: [CoordinationRules.Claim]) -> EtcdClaimOrder.Entry {
            EtcdClaimOrder.Entry(key: Array(name.utf8), member: member, revision: revision, claims: claims)
        }
        let entries = [
            entry("r1", "A", 10, [claim("/a", .reading)]),
            entry("w2", "B", 11, [claim("/a", .writing)]),
            entry("d3", "A", 12, [claim("/dir", .writing, .subtree)]),
            entry("r4", "C", 13, [claim("/b", .reading)]),
            entry("w5", "C", 20, [claim("/a", .writing)]),
        ]
        // A reader at 14 waits for the writer queued before it (first come, first served),
        // not for the reader: readers share.
        #expect(EtcdClaimOrder.blockers(of: [claim("/a", .reading)], revision: 14, member: "D", among: entries) == [Array("w2".utf8)])
        // Its own process's earlier requests never count: its own rules ordered them.
        #expect(EtcdClaimOrder.blockers(of: [claim("/a", .reading)], revision: 14, member: "B", among: entries).isEmpty)
        // A later request never blocks an earlier one.
        #expect(EtcdClaimOrder.blockers(of: [claim("/a", .writing)], revision: 10, member: "D", among: entries).isEmpty)
        // A subtree claim covers what is inside; all of a request's items count together.
        #expect(EtcdClaimOrder.blockers(of: [claim("/dir/f", .reading), claim("/b", .writing)], revision: 14, member: "D",
                                        among: entries) == [Array("d3".utf8), Array("r4".utf8)])
    }
}

@Suite("etcd space: a configuration's password is never printed")
struct EtcdConfigurationPrintingTests {
    @Test("interpolated, reflected or dumped, a configuration shows its user and not its password")
    func passwordRedacted() throws {
        var configuration = try EtcdCoordinationSpace.Configuration(address: "etcd://h:1/p")
        configuration.user = "root"
        configuration.password = "s3cret-value"
        var dumped = ""
        dump(configuration, to: &dumped)
        for text in ["\(configuration)", String(reflecting: configuration), String(describing: configuration), dumped] {
            #expect(!text.contains("s3cret-value"), "\(text)")
            #expect(text.contains("root"), "\(text)")
        }
        #expect(configuration.password == "s3cret-value")
    }
}

@Suite("etcd space: which waits end on which deletions")
struct EtcdWaitsTests {
    let a = Array("a".utf8), b = Array("b".utf8), c = Array("c".utf8)

    @Test("a wait ends when its last blocker is deleted; one key can block several; a forgotten wait is not ended")
    func waitsEnd() {
        var waits = EtcdWaits()
        waits.transactionStarts(1)
        waits.transactionStarts(2)
        waits.transactionStarts(3)
        #expect(waits.transactionDone(1, found: [a, b]) == [a, b])
        #expect(waits.transactionDone(2, found: [b]) == [b])
        #expect(waits.transactionDone(3, found: [c]) == [c])
        #expect(waits.deleted([a]).isEmpty)
        waits.forget(3)
        #expect(waits.deleted([b, c]) == [1, 2])
        #expect(waits.waitingRequests.isEmpty)
    }

    @Test("deletions seen while a transaction is under way count for it, whatever their order; none before it started")
    func deletionsDuringTheTransaction() {
        var waits = EtcdWaits()
        _ = waits.deleted([a])
        waits.transactionStarts(1)
        _ = waits.deleted([b])
        waits.transactionStarts(2)
        _ = waits.deleted([c])
        // 1 saw b and c deleted, 2 only c: a was deleted before either started (and a
        // transaction that still finds it must wait for it).
        #expect(waits.transactionDone(1, found: [a, b, c]) == [a])
        #expect(waits.transactionDone(2, found: [b, c]) == [b])
        #expect(waits.deleted([a, b]) == [1, 2])
        // With no transaction under way, deletions are not kept.
        waits.transactionStarts(3)
        #expect(waits.transactionDone(3, found: [a]) == [a])
        waits.transactionStarts(4)
        waits.transactionFailed(4)
        #expect(waits.deleted([a]) == [3])
    }
}
