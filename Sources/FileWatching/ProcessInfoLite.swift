#if canImport(Glibc)
import Glibc
#endif

/// `TMPDIR` without importing Foundation into the watcher.
enum ProcessInfoLite {
    static var temporaryDirectory: String {
        getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
    }
}
