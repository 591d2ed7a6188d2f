import ArgumentParser
@_spi(FileCoordinationInternal) import AsyncFileIO
import FileCoordination
import Foundation

struct Write: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy stdin into a file under a coordinated write intent.",
        discussion: """
            Presenters of PATH (and of its directories), in any process of the space, are \
            asked to relinquish it and must acknowledge before the file changes; they hear \
            didChange after. stdin is read whole before the claim is taken, so a slow \
            producer never holds it. Without --append the replacement is atomic: the data \
            goes to an unnamed temporary file beside PATH and is renamed over it, so a \
            reader sees the old content or the new, never a mix, even if the writer is killed.
            """
    )

    @Argument(help: "The file to write.")
    var path: String

    @Flag(help: "Append to the file instead of replacing it.")
    var append = false

    @Flag(name: .customLong("no-coordination"), help: "Write without taking a coordinated write intent.")
    var noCoordination = false

    @OptionGroup var coordination: CoordinationOptions

    func run() async throws {
        let target = RawArguments.path(path)
        let input: Data
        do { input = try await DescriptorWriter(fd: 0, label: "filecoord.stdin").readToEnd() } catch {
            Output.report(error)
            throw Status.failed
        }
        let options: FileWriteOptions = append ? [.append] : [.atomic]
        if noCoordination {
            do { try await input.asyncWrite(to: target, options: options) } catch let error as FileCoordinationError {
                Output.report(error)
                throw Status.failed
            }
            return
        }
        let coordinator = try await coordination.coordinator()
        try await coordination.run {
            // The claim names the file that changes: through a symbolic link, its target.
            let resolved = try await runOnIOThread { try target.resolvingSymbolicLinks() }
            try await coordinator.coordinate(writingItemAt: resolved.fileURL, options: []) { url in
                try await input.asyncWrite(to: try FilePath(fileURL: url), options: options)
            }
        }
    }
}
