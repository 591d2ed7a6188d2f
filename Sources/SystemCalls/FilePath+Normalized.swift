import SystemPackage

extension FilePath {
    /// The path without `.` components (and, as every `FilePath`, without doubled or
    /// trailing separators), its `..` components kept: after a symbolic link, `..` leads
    /// to the parent of the link's target, which only the file system knows.
    /// `lexicallyNormalized()` drops the link's name with the `..` and names another
    /// file (`dirlink/../f` is not `f` beside `dirlink` when `dirlink` is a link). A `..`
    /// right under the root goes: the root is its own parent.
    package func normalizedKeepingParents() -> FilePath {
        var kept: [Component] = []
        for component in components {
            switch component.kind {
            case .currentDirectory: continue
            case .parentDirectory where root != nil && kept.isEmpty: continue
            default: kept.append(component)
            }
        }
        return FilePath(root: root, kept)
    }
}
