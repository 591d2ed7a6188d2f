/// One message of a watch's stream, as a watch acts on it.
enum EtcdWatchMessage: Sendable {
    /// The watch is in place.
    case created
    /// Events, and the revision of the last one (when it says).
    case events([EtcdJSON.WatchResponse.Event], last: Int64?)
    /// etcd has sent every event up to this revision (a progress notification).
    case progress(Int64)
    /// etcd ended the watch: the revision it was to start from was compacted (the oldest
    /// revision it still has, `compacted`), or it refused the watch (a token no longer
    /// valid; `compacted` nil).
    case canceled(compacted: Int64?, String)
    /// The stream failed (a member that lost its leader ends it so): its gRPC code, if
    /// any, and message.
    case failure(code: Int?, String)

    /// The message in `bytes` (one JSON object of the stream). A pure function: the watch
    /// and the fuzzer call it on what the stream split.
    ///
    /// - Throws: ``EtcdWireError/malformed(_:)`` when the bytes are not such a message:
    ///   the watch then resumes from the last revision it saw rather than skip it.
    static func decode(_ bytes: [UInt8]) throws(EtcdWireError) -> EtcdWatchMessage {
        let answer: EtcdJSON.WatchResponse
        do {
            answer = try EtcdJSON.decode(EtcdJSON.WatchResponse.self, bytes)
        } catch {
            throw .malformed("a watch message that is not etcd's JSON")
        }
        if let error = answer.error {
            return .failure(code: error.grpc_code, error.message ?? "the watch failed")
        }
        guard let result = answer.result else { throw .malformed("a watch message with neither a result nor an error") }
        if result.canceled == true {
            let compaction = EtcdJSON.revision(result.compact_revision) ?? 0
            return .canceled(compacted: compaction > 0 ? compaction : nil,
                             result.cancel_reason ?? "the watch was cancelled by etcd (compacted at revision \(compaction))")
        }
        if let events = result.events, !events.isEmpty {
            return .events(events, last: events.compactMap { EtcdJSON.revision($0.kv?.mod_revision) }.max())
        }
        if result.created == true { return .created }
        guard let revision = EtcdJSON.revision(result.header?.revision) else {
            throw .malformed("a watch message with no events and no revision (or one out of range)")
        }
        return .progress(revision)
    }
}
