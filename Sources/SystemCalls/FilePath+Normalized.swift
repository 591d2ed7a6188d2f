import SystemPackage
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

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

extension FilePath {
    /// The current directory, byte for byte as the kernel has it (Foundation's
    /// `currentDirectoryPath` is a `String`, which replaces bytes that are not UTF-8);
    /// `/proc/self/cwd` when the kernel cannot name it (removed, or longer than
    /// `PATH_MAX`), which is meaningful in this process only.
    package static var currentDirectory: FilePath {
        guard let pointer = getcwd(nil, 0) else { return "/proc/self/cwd" }
        defer { free(pointer) }
        return FilePath(platformString: pointer)
    }
}
