#if !canImport(Darwin)
import Foundation

/// Where a method that fails stores its error (Apple's `NSErrorPointer`, which
/// Foundation on Linux lacks): `var error: NSError?` passed as `&error`. The method
/// stores an error only when it fails; nil means no one asked.
public typealias NSErrorPointer = UnsafeMutablePointer<NSError?>?
#endif
