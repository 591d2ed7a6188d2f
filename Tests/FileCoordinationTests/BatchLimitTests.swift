import AsyncFileIO
@testable import FileCoordination
import Foundation
import Testing

@Suite("Batch reader limits")
struct BatchLimitTests {
    @Test("a zero byte budget still lets files through, one at a time")
    func zeroBudget() async throws {
        let box = Sandbox()
        let files = (0 ..< 20).map { box.file("z\($0)", "\($0)") }
        var count = 0
        for try await result in FileBatchReader(urls: files, options: .init(maximumBufferedBytes: 0)) {
            _ = try result.get()
            count += 1
        }
        #expect(count == 20)
    }
}
