extension WatchTranslation {
    /// Transient names that are not entries: sync cookies and the temporaries atomic
    /// writes rename into place (`.NAME.filecoord-PID-N-R`). Watchers never report them.
    static func isInternal(_ name: [UInt8]) -> Bool {
        guard name.first == UInt8(ascii: "."), name.count > temporaryMarker.count else { return false }
        if name.starts(with: cookiePrefix) { return true }
        let marker = temporaryMarker
        for start in 1 ... (name.count - marker.count) where name[start] == marker[0] {
            if name[start ..< start + marker.count].elementsEqual(marker) { return true }
        }
        return false
    }
}
