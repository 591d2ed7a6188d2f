import ArgumentParser
import FileCoordination
import Foundation

struct Write: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy stdin into a file under a coordinated write intent.",
        discussion: """
            Without --append the replacement is atomic: the data goes to an unnamed \
            temporary file beside PATH and is renamed over it at the end, so a reader \
            sees the old content or the new, never a mix, even if the writer is killed.
            """
    )

    @Argument(help: "The file to write.")
    var path: String

    @Flag(help: "Append to the file instead of replacing it.")
    var append = false

    @Flag(name: .customLong("no-coordination"), help: "Write without taking a coordinated write intent.")
    var noCoordination = false

    func run() async throws {
        guard noCoordination else {
            Output.error("coordinated writes arrive with the coordinator; pass --no-coordination for now")
            throw Status.usage
        }
        let target = RawArguments.path(path)
        do {
            let stream = try await target.openForWriting(options: append ? [.append] : [.atomic])
            let input = DescriptorWriter(fd: 0, label: "filecoord.stdin")
            while true {
                let chunk = await input.read(upToCount: 1 << 20)
                if chunk.isEmpty { break }
                try await stream.write(chunk)
            }
            try await stream.close()
        } catch let error as FileCoordinationError {
            Output.report(error)
            throw Status.failed
        }
    }
}
