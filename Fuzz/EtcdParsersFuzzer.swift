// libFuzzer's entry for the etcd client's parsers. Built by `make fuzz` with swiftc
// -sanitize=fuzzer,address together with the parsers' sources (FileCoordinationEtcd/EtcdWire.swift,
// EtcdJSON.swift, EtcdAnswer.swift, EtcdWatchMessage.swift, EtcdWireCheck.swift); not part
// of the package. A violation of EtcdWireCheck's properties stops the run like a crash,
// and libFuzzer keeps the input.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzEtcdParsers(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    let violations = EtcdWireCheck.violations(input)
    if let first = violations.first { fatalError("etcd parsers: \(first)") }
    return 0
}
