import AsyncFileIO
import Foundation
import SystemPackage

/// Registered presenters, indexed by the path they present, so that finding the
/// presenters of one item costs a lookup per path component, however many others exist.
package struct PresenterRegistry: Sendable {
    package init() {}

    package struct Entry: Sendable {
        let presenter: any FilePresenter
        var path: FilePath
        /// How coordinations reach it.
        let endpoint: any PresenterEndpoint
        var id: ObjectIdentifier { ObjectIdentifier(presenter) }

        /// A presenter of this process, or (with `endpoint`) one reached otherwise.
        init(presenter: any FilePresenter, path: FilePath, endpoint: (any PresenterEndpoint)? = nil) {
            self.presenter = presenter
            self.path = path
            self.endpoint = endpoint ?? LocalPresenterEndpoint(presenter: presenter)
        }
    }

    /// The presenters an access concerns.
    package struct Concerned: Sendable {
        /// Presenters of the item itself.
        var item: [Entry] = []
        /// Presenters of directories containing the item (nearest first).
        var containers: [Entry] = []
        /// Presenters of items inside it (subtree accesses only).
        var inside: [Entry] = []
        var isEmpty: Bool { item.isEmpty && containers.isEmpty && inside.isEmpty }
    }

    package struct Moved: Sendable {
        let entry: Entry
        let oldPath: FilePath
        let newPath: FilePath
    }

    private var entriesByID: [ObjectIdentifier: Entry] = [:]
    /// By the bytes of the presented path (`FilePath` hashes byte by byte, and its
    /// component operations parse the path again on every call).
    private var byPath: [PathKey: [ObjectIdentifier]] = [:]

    var all: [any FilePresenter] { entriesByID.values.map(\.presenter) }
    var entries: [(any FilePresenter, FilePath)] { entriesByID.values.map { ($0.presenter, $0.path) } }
    func contains(_ id: ObjectIdentifier) -> Bool { entriesByID[id] != nil }
    func path(of id: ObjectIdentifier) -> FilePath? { entriesByID[id]?.path }
    var isEmpty: Bool { entriesByID.isEmpty }
    package var count: Int { entriesByID.count }

    /// Adds a presenter of this process, or (with `endpoint`) one reached otherwise.
    package mutating func add(_ presenter: any FilePresenter, at path: FilePath, endpoint: (any PresenterEndpoint)? = nil) {
        let id = ObjectIdentifier(presenter)
        remove(id)
        entriesByID[id] = Entry(presenter: presenter, path: path, endpoint: endpoint)
        byPath[PathKey(path.platformBytes), default: []].append(id)
    }

    package mutating func remove(_ id: ObjectIdentifier) {
        guard let entry = entriesByID.removeValue(forKey: id) else { return }
        unindex(id, at: entry.path)
    }

    private mutating func unindex(_ id: ObjectIdentifier, at path: FilePath) {
        let key = PathKey(path.platformBytes)
        guard var ids = byPath.removeValue(forKey: key) else { return }
        ids.removeAll { $0 == id }
        if !ids.isEmpty { byPath[key] = ids }
    }

    /// Calls `body` with the bytes of each directory containing `bytes` (an absolute,
    /// normalized path), nearest first, until it returns true.
    private static func forEachAncestor(of bytes: [UInt8], _ body: ([UInt8]) -> Bool) {
        var end = bytes.count
        while end > 1, let slash = bytes[..<end].lastIndex(of: UInt8(ascii: "/")) {
            if body(slash == 0 ? [UInt8(ascii: "/")] : Array(bytes[..<slash])) { return }
            end = slash
        }
    }

    /// Whether an item access at the path with these bytes concerns any presenter (of the
    /// item, or of a directory containing it), without collecting them.
    package func concernsAny(_ key: PathKey) -> Bool {
        guard !byPath.isEmpty else { return false }
        if byPath[key] != nil { return true }
        var found = false
        Self.forEachAncestor(of: key.bytes) { ancestor in
            found = byPath[PathKey(ancestor)] != nil
            return found
        }
        return found
    }

    package func concerned(by path: FilePath, subtree: Bool, excluding excluded: ObjectIdentifier?) -> Concerned {
        var result = Concerned()
        guard !entriesByID.isEmpty else { return result }
        func lookup(_ bytes: [UInt8]) -> [Entry] {
            (byPath[PathKey(bytes)] ?? []).compactMap { $0 == excluded ? nil : entriesByID[$0] }
        }
        let bytes = path.platformBytes
        result.item = lookup(bytes)
        Self.forEachAncestor(of: bytes) { ancestor in
            result.containers += lookup(ancestor)
            return false
        }
        if subtree {
            for (key, ids) in byPath where key.bytes != bytes && FilePath.isAtOrInside(key.bytes, bytes) {
                result.inside += ids.compactMap { $0 == excluded ? nil : entriesByID[$0] }
            }
        }
        return result
    }

    /// Moves every presenter at or inside `source` to the matching place under `destination`.
    package mutating func move(from source: FilePath, to destination: FilePath) -> [Moved] {
        var moved: [Moved] = []
        for (id, entry) in entriesByID where entry.path.starts(with: source) {
            let newPath = Self.rebase(entry.path, from: source, to: destination)
            unindex(id, at: entry.path)
            entriesByID[id]!.path = newPath
            byPath[PathKey(newPath.platformBytes), default: []].append(id)
            moved.append(Moved(entry: entriesByID[id]!, oldPath: entry.path, newPath: newPath))
        }
        return moved
    }

    /// `path` (at or inside `source`) as it reads after `source` moved to `destination`.
    static func rebase(_ path: FilePath, from source: FilePath, to destination: FilePath) -> FilePath {
        var result = destination
        for component in path.components.dropFirst(source.components.count) { result.append(component) }
        return result
    }
}
