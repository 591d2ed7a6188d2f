#if canImport(Glibc)
import Glibc
#endif

/// An environment variable's value; nil when it is unset, empty or not UTF-8. Read with
/// `getenv`, not ProcessInfo's dictionary of every variable, which costs a short command
/// more than the few lookups it makes.
package func environmentVariable(_ name: String) -> String? {
    getenv(name).flatMap { String(validatingCString: $0) }.flatMap { $0.isEmpty ? nil : $0 }
}
