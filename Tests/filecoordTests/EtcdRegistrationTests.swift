import FileCoordination
import FileCoordinationEtcd
import Foundation
import Testing
import TestSupport

/// The core library knows local spaces only; `FileCoordinationEtcd` makes etcd addresses
/// known through the core's one registration point.
@Suite("etcd space: chosen through the core's registration point")
struct EtcdRegistrationTests {
    @Test("FILECOORD_SPACE=etcd://... with EtcdCoordinationSpace.register(): the first coordination joins etcd; without it, a clear error and no directory made",
          .timeLimit(.minutes(1)))
    func environmentJoin() async throws {
        let server = try await EtcdServer()
        let item = Scratch().write("item", "x")
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        for register in [true, false] {
            let worker = try LineProcess(["--testing-library", "swift-testing", "--filter", "EtcdRegistrationWorker"], executable: binary,
                                         environment: ["FILECOORD_SPACE": server.address("registered"), EtcdRegistrationWorker.itemVariable: item,
                                                       EtcdRegistrationWorker.registerVariable: register ? "1" : "0"])
            var lines: [String] = []
            for await line in worker.lines where line.hasPrefix("worker: ") { lines.append(line) }
            _ = await worker.wait()
            if register {
                #expect(lines == ["worker: joined \(server.address("registered"))"], "\(lines)")
            } else {
                #expect(lines.count == 1 && lines[0].contains("FileCoordinationEtcd") && lines[0].contains("invalidArgument"), "\(lines)")
            }
        }
        // The address was not taken for a directory (relative to where the worker ran).
        #expect(!FileManager.default.fileExists(atPath: FileManager.default.currentDirectoryPath + "/etcd:"))
        await server.stop()
    }
}

/// The process of ``EtcdRegistrationTests``: this test binary again. It coordinates once
/// with no space joined explicitly, and prints the etcd space it joined or the error.
@Suite struct EtcdRegistrationWorker {
    static let itemVariable = "FILECOORD_REGISTRATION_ITEM"
    static let registerVariable = "FILECOORD_REGISTRATION_REGISTER"

    @Test func coordinate() async throws {
        let environment = ProcessInfo.processInfo.environment
        guard let item = environment[Self.itemVariable], let register = environment[Self.registerVariable] else { return }
        if register == "1" { EtcdCoordinationSpace.register() }
        let said: String
        do {
            try await FileCoordinator().coordinate(readingItemAt: URL(fileURLWithPath: item)) { _ in }
            said = "joined \(FileCoordinator.etcdCoordinationSpace?.address ?? "no etcd space")"
        } catch let error as FileCoordinationError {
            said = "\(error.code): \(error.message)"
        }
        FileHandle.standardOutput.write(Data("worker: \(said)\n".utf8))
        await FileCoordinator.leaveCoordinationSpace()
    }
}
