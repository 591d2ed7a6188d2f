#if !canImport(Darwin)
import Foundation

/// A version of a file, as Apple's version store keeps them: here only the type, so
/// that the version callbacks of ``NSFilePresenter`` compile. Linux keeps no versions;
/// no instance is ever made and no version callback is ever called.
open class NSFileVersion: NSObject {
    /// Unavailable: there are no versions to make.
    @available(*, unavailable, message: "Linux keeps no file versions")
    public override init() {}
}
#endif
