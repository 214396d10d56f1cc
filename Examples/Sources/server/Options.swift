// The server's command line: its options, their ranges and the sentences that reject a
// value out of range. Apart from main.swift, so that the tests can parse command lines
// without starting a server.
import NIOCore

/// Which order service answers: the two differ only there (`make server-compare`).
enum Engine: String {
    case promise, nio
}

/// What the command line asks for. Every value is checked here, so that a mistyped one
/// stops the server with a sentence saying what is allowed, instead of being wrapped
/// (a port above 65535 became another port), clamped (0 threads became 1) or trapping
/// later.
struct Options {
    var engine = Engine.promise
    var port = 8080
    var portFile: String?
    var threads = System.coreCount
    var deadlineMilliseconds = 1000

    /// The ports a socket can bind: 0 asks the system for a free one.
    static let ports = 0...65535
    /// At least one loop of each kind; the cap keeps a typo from starting two groups of
    /// millions of threads (each loop is a thread), far above any core count.
    static let threadCounts = 1...1024
    /// A deadline of 0 would make every order race its own timer, so that the two engines
    /// would answer 504 or 200 by chance; an hour is far beyond any reply worth waiting
    /// for. (No `Int` overflows `Duration.milliseconds`, but the bound keeps the deadline
    /// one that a request can meet.)
    static let deadlines = 1...3_600_000

    /// Parses `arguments`, the program's name first (as `CommandLine.arguments`).
    init(_ arguments: [String]) throws {
        var rest = arguments.dropFirst()
        while let flag = rest.popFirst() {
            guard Self.flags.contains(flag) else {
                throw UsageError("unknown option \(flag); the options are \(Self.flags.joined(separator: ", "))")
            }
            guard let value = rest.popFirst() else { throw UsageError("\(flag) needs a value after it") }
            switch flag {
            case "--port":
                port = try Self.number(value, for: flag, in: Self.ports)
            case "--port-file":
                guard !value.isEmpty else { throw UsageError("--port-file needs a file's path, not an empty string") }
                portFile = value
            case "--threads":
                threads = try Self.number(value, for: flag, in: Self.threadCounts)
            case "--deadline-ms":
                deadlineMilliseconds = try Self.number(value, for: flag, in: Self.deadlines, of: "milliseconds")
            case "--engine":
                guard let engine = Engine(rawValue: value) else {
                    throw UsageError("--engine must be promise or nio, not \(value)")
                }
                self.engine = engine
            default:
                preconditionFailure("\(flag) is in Options.flags but not parsed")
            }
        }
    }

    /// The options `init` knows, in the order the usage line gives them.
    static let flags = ["--port", "--port-file", "--threads", "--deadline-ms", "--engine"]

    /// `text` as a whole number in `range`, or the sentence that says it is not.
    private static func number(
        _ text: String, for flag: String, in range: ClosedRange<Int>, of unit: String? = nil
    ) throws -> Int {
        guard let value = Int(text), range.contains(value) else {
            let number = unit.map { "a whole number of \($0)" } ?? "a whole number"
            throw UsageError("\(flag) must be \(number) from \(range.lowerBound) to \(range.upperBound), not \(text)")
        }
        return value
    }
}

/// A command line the server cannot run with; its description is the sentence to print.
struct UsageError: Error, Equatable, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
