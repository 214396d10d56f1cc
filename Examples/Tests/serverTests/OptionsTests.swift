// The server's command line: every value out of range is rejected with the sentence that
// says what is allowed, and values in range, at both ends, are taken as given.
import XCTest

@testable import server

final class OptionsTests: XCTestCase {
    func testValuesInRangeAreTakenAsGiven() throws {
        let options = try Options([
            "server", "--port", "65535", "--port-file", "/tmp/port", "--threads", "1",
            "--deadline-ms", "3600000", "--engine", "nio",
        ])
        XCTAssertEqual(options.port, 65535)
        XCTAssertEqual(options.portFile, "/tmp/port")
        XCTAssertEqual(options.threads, 1)
        XCTAssertEqual(options.deadlineMilliseconds, 3_600_000)
        XCTAssertEqual(options.engine, .nio)

        let low = try Options(["server", "--port", "0", "--threads", "1024", "--deadline-ms", "1"])
        XCTAssertEqual(low.port, 0)
        XCTAssertEqual(low.threads, 1024)
        XCTAssertEqual(low.deadlineMilliseconds, 1)
        XCTAssertEqual(low.engine, .promise)
        XCTAssertEqual(try Options(["server"]).port, 8080)
    }

    func testEachBadValueIsRejectedWithItsSentence() {
        let rejected: [([String], String)] = [
            (["--port", "70000"], "--port must be a whole number from 0 to 65535, not 70000"),
            (["--port", "65536"], "--port must be a whole number from 0 to 65535, not 65536"),
            (["--port", "-1"], "--port must be a whole number from 0 to 65535, not -1"),
            (["--port", "80x"], "--port must be a whole number from 0 to 65535, not 80x"),
            (["--port", "99999999999999999999"],
             "--port must be a whole number from 0 to 65535, not 99999999999999999999"),
            (["--threads", "0"], "--threads must be a whole number from 1 to 1024, not 0"),
            (["--threads", "1025"], "--threads must be a whole number from 1 to 1024, not 1025"),
            (["--threads", "-3"], "--threads must be a whole number from 1 to 1024, not -3"),
            (["--deadline-ms", "0"],
             "--deadline-ms must be a whole number of milliseconds from 1 to 3600000, not 0"),
            (["--deadline-ms", "3600001"],
             "--deadline-ms must be a whole number of milliseconds from 1 to 3600000, not 3600001"),
            (["--deadline-ms", "\(Int.max)"],
             "--deadline-ms must be a whole number of milliseconds from 1 to 3600000, not \(Int.max)"),
            (["--deadline-ms", "1.5"],
             "--deadline-ms must be a whole number of milliseconds from 1 to 3600000, not 1.5"),
            (["--engine", "dispatch"], "--engine must be promise or nio, not dispatch"),
            (["--port-file", ""], "--port-file needs a file's path, not an empty string"),
            (["--port"], "--port needs a value after it"),
            (["--port", "1", "--threads"], "--threads needs a value after it"),
            (["--verbose", "1"],
             "unknown option --verbose; the options are --port, --port-file, --threads, --deadline-ms, --engine"),
            (["8080"], "unknown option 8080; the options are --port, --port-file, --threads, --deadline-ms, --engine"),
        ]
        for (arguments, sentence) in rejected {
            XCTAssertThrowsError(try Options(["server"] + arguments), "\(arguments)") { error in
                XCTAssertEqual(error as? UsageError, UsageError(sentence), "\(arguments)")
            }
        }
    }
}
