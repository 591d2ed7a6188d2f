import AsyncFileIO
import ArgumentParser
import FileCoordination
import Foundation

/// `present --format` and `--timefmt`: each line as inotifywait's `--format` writes it.
///
/// `%w` is the presented item (or, for a subitem's event, the directory it is in, with a
/// trailing slash) and `%f` the subitem's name (empty for the item's own events), so that
/// `%w%f` is the path, as with inotifywait; both are written as their exact bytes. `%xw`,
/// `%xf` and `%xt` write them escaped as the text lines are (`ls -b`), for names that are
/// not valid text.
struct EventFormat: Sendable {
    enum Piece: Sendable, Equatable {
        case bytes([UInt8])
        case watched(escaped: Bool)
        case file(escaped: Bool)
        /// A move's destination (empty for other events).
        case destination(escaped: Bool)
        case event
        case time
        /// The asking process, when the event knows it (empty otherwise).
        case pid
    }

    static let conversions = "%w %f %e %T %t %p %xw %xf %xt %0 %%"
    /// `date`'s and ISO 8601's shape, in local time.
    static let defaultTimeFormat = "%Y-%m-%dT%H:%M:%S%z"

    let pieces: [Piece]
    let timeFormat: String
    /// `timeFormat`'s bytes as given on the command line (not UTF-8, possibly).
    private let timeFormatBytes: [CChar]
    /// Ends each line with a newline (`--no-newline`: not, as inotifywait's).
    let newline: Bool

    init(_ format: String, timeFormat: String?, newline: Bool = true) throws {
        var pieces: [Piece] = [], literal: [UInt8] = []
        let bytes = RawArguments.bytes(format)
        var index = 0
        func flush() {
            if !literal.isEmpty { pieces.append(.bytes(literal)) }
            literal = []
        }
        func unknown(_ spelled: ArraySlice<UInt8>) -> ValidationError {
            ValidationError("--format: '\(String(decoding: spelled, as: UTF8.self))' is no conversion; the conversions are \(Self.conversions)")
        }
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            guard byte == UInt8(ascii: "%") else {
                literal.append(byte)
                continue
            }
            guard index < bytes.count else { throw unknown(bytes[(index - 1)...]) }
            let conversion = bytes[index]
            index += 1
            switch UnicodeScalar(conversion) {
            case "%": literal.append(conversion)
            case "0": literal.append(0)
            case "w": flush(); pieces.append(.watched(escaped: false))
            case "f": flush(); pieces.append(.file(escaped: false))
            case "t": flush(); pieces.append(.destination(escaped: false))
            case "e": flush(); pieces.append(.event)
            case "T": flush(); pieces.append(.time)
            case "p": flush(); pieces.append(.pid)
            case "x":
                guard index < bytes.count else { throw unknown(bytes[(index - 2)...]) }
                let escaped = bytes[index]
                index += 1
                flush()
                switch UnicodeScalar(escaped) {
                case "w": pieces.append(.watched(escaped: true))
                case "f": pieces.append(.file(escaped: true))
                case "t": pieces.append(.destination(escaped: true))
                default: throw unknown(bytes[(index - 3) ..< index])
                }
            default:
                throw unknown(bytes[(index - 2) ..< index])
            }
        }
        flush()
        self.pieces = pieces
        self.timeFormat = timeFormat ?? Self.defaultTimeFormat
        timeFormatBytes = RawArguments.bytes(self.timeFormat).map { CChar(bitPattern: $0) } + [0]
        self.newline = newline
    }

    /// One line. `isSubitem`: the event is about an item inside the presented directory.
    func line(_ event: String, path: FilePath, destination: FilePath?, pid: Int32?, isSubitem: Bool, at now: Date) -> [UInt8] {
        let bytes = path.platformBytes
        let slash = bytes.lastIndex(of: UInt8(ascii: "/"))
        let (watched, file): ([UInt8], [UInt8])
        if isSubitem, let slash {
            (watched, file) = (Array(bytes[...slash]), Array(bytes[(slash + 1)...]))
        } else {
            (watched, file) = (bytes, [])
        }
        var line: [UInt8] = []
        for piece in pieces {
            switch piece {
            case .bytes(let literal): line += literal
            case .watched(let escaped): line += escaped ? Self.escaped(watched) : watched
            case .file(let escaped): line += escaped ? Self.escaped(file) : file
            case .destination(let escaped):
                let to = destination?.platformBytes ?? []
                line += escaped ? Self.escaped(to) : to
            case .event: line += Array(event.utf8)
            case .time: line += formattedTime(now)
            case .pid: line += pid.map { Array(String($0).utf8) } ?? []
            }
        }
        if newline { line.append(UInt8(ascii: "\n")) }
        return line
    }

    private static func escaped(_ bytes: [UInt8]) -> [UInt8] {
        bytes.isEmpty ? [] : Array(Output.displayed(FilePath(platformBytes: bytes)).utf8)
    }

    /// `strftime(3)` of `--timefmt`, in local time.
    private func formattedTime(_ now: Date) -> [UInt8] {
        var seconds = time_t(now.timeIntervalSince1970.rounded(.down)), parts = tm()
        localtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 512)
        let length = strftime(&buffer, buffer.count, timeFormatBytes, &parts)
        return buffer.prefix(length).map { UInt8(bitPattern: $0) }
    }
}
