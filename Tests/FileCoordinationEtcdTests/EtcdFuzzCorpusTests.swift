import Foundation
import Testing
@testable import FileCoordinationEtcd
import FileCoordination

/// The fuzzer's kept corpus and every input that once crashed a parser (`Fuzz/`), fed to
/// the property `make fuzz` checks: each parser ends within its bounds and gives the same
/// result however the bytes are cut.
@Suite("etcd space: the fuzzing corpus and past crashes")
struct EtcdFuzzCorpusTests {
    static let fuzz = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fuzz")

    static func inputs(_ folder: String) -> [URL] {
        let directory = fuzz.appendingPathComponent(folder)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return names.sorted().map { directory.appendingPathComponent($0) }
    }

    @Test("every input of Fuzz/corpus and Fuzz/regressions keeps the parsers' property", arguments: ["corpus", "regressions"])
    func corpus(_ folder: String) throws {
        let inputs = Self.inputs(folder)
        #expect(inputs.count >= 4, "Fuzz/\(folder) has \(inputs.count) inputs")
        for input in inputs {
            let violations = EtcdWireCheck.violations(Array(try Data(contentsOf: input)))
            #expect(violations.isEmpty, "\(input.lastPathComponent): \(violations)")
        }
    }
}
