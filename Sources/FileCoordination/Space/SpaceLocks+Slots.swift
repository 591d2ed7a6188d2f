import AsyncFileIO
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Where an item's claim lives (a hashed byte for it and for each directory containing
/// it), and the plan of bytes a set of claims takes.
extension SpaceLocks {
    // MARK: Slots

    static let fnvBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    static func fnvStep(_ hash: UInt64, _ byte: UInt8) -> UInt64 { (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
    static func slot(finishing hash: UInt64) -> Int64 {
        var hash = hash
        hash ^= hash >> 33; hash &*= 0xff51_afd7_ed55_8ccd; hash ^= hash >> 33
        return firstSlot + Int64(hash >> 5) * 4
    }

    /// The slot of `bytes` (an absolute, normalized path), and the slots of every
    /// directory containing it, nearest last. A slot's first byte comes from a 64-bit
    /// FNV-1a hash finished with a mixer; two paths sharing a slot only over-exclude each
    /// other, never under-exclude. FNV-1a is computed front to back, so one pass gives
    /// every prefix's hash.
    static func slots(_ bytes: [UInt8]) -> (item: Int64, ancestors: [Int64]) {
        let slots = slotsAndDirectory(bytes)
        return (slots.item, slots.ancestors)
    }

    /// ``slots(_:)``, with the length of the containing directory's path (the last
    /// separator's index; 0 for a file in the root) and the hash state after it.
    static func slotsAndDirectory(_ bytes: [UInt8]) -> (item: Int64, ancestors: [Int64], directory: Int, hash: UInt64) {
        var hash = fnvBasis
        var ancestors: [Int64] = []
        var directory = (length: 0, hash: fnvBasis)
        for (index, byte) in bytes.enumerated() {
            if byte == UInt8(ascii: "/"), index > 0 {
                ancestors.append(slot(finishing: hash))
                directory = (index, hash)
            }
            hash = fnvStep(hash, byte)
            if index == 0, byte == UInt8(ascii: "/"), bytes.count > 1 { ancestors.append(slot(finishing: hash)) } // the root, "/"
        }
        return (slot(finishing: hash), ancestors, directory.length, directory.hash)
    }

    /// Whether `bytes` names an item directly inside the directory whose path is the first
    /// `length` bytes of `other` (`length` > 0).
    static func isDirectlyInside(_ bytes: [UInt8], _ other: [UInt8], length: Int) -> Bool {
        guard bytes.count > length + 1, bytes[length] == UInt8(ascii: "/") else { return false }
        return bytes.withUnsafeBufferPointer { path in
            other.withUnsafeBufferPointer { directory in
                memcmp(path.baseAddress!, directory.baseAddress!, length) == 0
                    && memchr(path.baseAddress! + length + 1, Int32(UInt8(ascii: "/")), path.count - length - 1) == nil
            }
        }
    }


    /// ``plan(for:)``, from a one-entry cache when `claims` is the last single claim planned.
    func cachedPlan(for claims: [CoordinationRules.Claim]) -> Plan {
        guard claims.count == 1 else { return Self.plan(for: claims) }
        if let last = lastPlan.withLock({ $0 }), last.claim == claims[0] { return last.plan }
        let plan = Self.plan(for: claims)
        lastPlan.withLock { $0 = (claims[0], plan) }
        return plan
    }

    /// The kernel bytes for claims on normalized, absolute paths.
    static func plan(for claims: [CoordinationRules.Claim]) -> Plan {
        var plan = Plan()
        var inside: [Int64] = []
        // The previous claim's directory: its bytes (the first `length` of that claim's),
        // the hash state after them and the slots of the directories they name. A batch's
        // files share theirs, which are then neither hashed nor compared again.
        var directory: (bytes: [UInt8], length: Int, hash: UInt64, ancestors: [Int64])?
        for claim in claims {
            let bytes = claim.key.bytes
            let slot: Int64
            if let known = directory, known.length > 0, Self.isDirectlyInside(bytes, known.bytes, length: known.length) {
                var hash = known.hash
                for index in known.length ..< bytes.count { hash = fnvStep(hash, bytes[index]) }
                slot = Self.slot(finishing: hash)
            } else {
                let slots = slotsAndDirectory(bytes)
                slot = slots.item
                // The "inside" byte of every containing directory, and its writers' queue
                // byte to test (a delete, move or replace of the directory may be queued).
                if slots.ancestors != directory?.ancestors {
                    inside += slots.ancestors.map { $0 + 1 }
                    plan.checks += slots.ancestors.map { $0 + 2 }
                }
                directory = (bytes, slots.directory, slots.hash, slots.ancestors)
            }
            switch (claim.access, claim.scope) {
            case (.reading, _):
                plan.checks.append(slot + 2)
                plan.bytes.append(Byte(offset: slot, exclusive: false))
            case (.writing, .item):
                plan.queue.append(Byte(offset: slot + 2, exclusive: true))
                plan.bytes.append(Byte(offset: slot, exclusive: true))
            case (.writing, .subtree):
                plan.queue.append(Byte(offset: slot + 2, exclusive: true))
                plan.bytes.append(Byte(offset: slot, exclusive: true))
                plan.bytes.append(Byte(offset: slot + 1, exclusive: true))
            }
        }
        plan.bytes += inside.map { Byte(offset: $0, exclusive: false) }
        // One claim's bytes are distinct (its item's bytes and its directories' "inside"
        // bytes differ in their offset modulo 4). Several claims may share some: a byte
        // both shared and exclusive is taken exclusive, once; queue bytes go in one order.
        guard claims.count > 1 else {
            plan.checks.sort() // in one order with the queue bytes (see `attempt`)
            return plan
        }
        if plan.queue.isEmpty && !plan.bytes.contains(where: \.exclusive) {
            // Reads only (a batch): sorting and dropping repeats is all the merge needed.
            plan.bytes = Self.sortedUnique(plan.bytes.map(\.offset)).map { Byte(offset: $0, exclusive: false) }
            plan.checks = Self.sortedUnique(plan.checks)
            return plan
        }
        var merged: [Int64: Bool] = [:]
        for byte in plan.bytes { merged[byte.offset, default: false] = merged[byte.offset, default: false] || byte.exclusive }
        plan.bytes = merged.map { Byte(offset: $0.key, exclusive: $0.value) }.sorted()
        plan.queue = Array(Set(plan.queue)).sorted()
        plan.checks = Self.sortedUnique(plan.checks)
        return plan
    }

    static func sortedUnique(_ offsets: [Int64]) -> [Int64] {
        var result: [Int64] = []
        result.reserveCapacity(offsets.count)
        for offset in offsets.sorted() where offset != result.last { result.append(offset) }
        return result
    }
}
