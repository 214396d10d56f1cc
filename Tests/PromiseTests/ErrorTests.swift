// The library's errors explain themselves: what a log line shows of each.
import Foundation
import Promise
import XCTest

final class ErrorTests: XCTestCase {
    private let everyError: [PromiseError] = [
        .timedOut, .validationFailure, .allRejected([TestError(1), TestError(2)]),
        .brokenPromise, .cycle, .invalidArgument("Promise.retry needs at least one attempt, and was given 0"),
    ]

    func testEveryPromiseErrorDescribesItselfInASentence() {
        for error in everyError {
            let text = String(describing: error)
            XCTAssertFalse(text.contains("PromiseError"), "\(text) reads like a type dump")
            // Words, not a code ("validation failed", the shortest, is the contract's own).
            XCTAssertGreaterThanOrEqual(text.split(separator: " ").count, 2, "\(text) is not a sentence")
        }
        XCTAssertEqual(Set(everyError.map { String(describing: $0) }).count, everyError.count,
                       "two errors share a text")
    }

    func testLocalizedDescriptionIsTheSentenceNotTheBridgedCode() {
        for error in everyError {
            let asError: any Error = error
            XCTAssertEqual(asError.localizedDescription, String(describing: error))
            XCTAssertFalse(asError.localizedDescription.contains("error 1"), asError.localizedDescription)
        }
    }

    func testWrapErrorDescribesItself() {
        let error: any Error = PromiseWrapError.neitherValueNorError
        XCTAssertEqual(error.localizedDescription, "\(PromiseWrapError.neitherValueNorError)")
        XCTAssertTrue(error.localizedDescription.contains("neither a value nor an error"))
    }

    func testDetailsAreInTheText() {
        let allRejected = String(describing: PromiseError.allRejected([TestError(7), TestError(8)]))
        XCTAssertTrue(allRejected.contains("2 errors"), allRejected)
        XCTAssertTrue(allRejected.contains("TestError(7)") && allRejected.contains("TestError(8)"), allRejected)
        XCTAssertTrue(String(describing: PromiseError.allRejected([])).contains("no inputs"))
        XCTAssertTrue(String(describing: PromiseError.invalidArgument("attempts was -1")).contains("attempts was -1"))
        XCTAssertTrue(String(describing: PromiseError.brokenPromise).contains("dropped before it was settled"))
    }

    /// The three sentences the contract quotes, word for word, as `description` and as
    /// `localizedDescription`.
    func testTheQuotedSentencesAreExact() {
        let quoted: [(PromiseError, String)] = [
            (.timedOut, "the promise timed out before it was settled"),
            (.validationFailure, "validation failed"),
            (.brokenPromise, "the promise was dropped before it was settled"),
        ]
        for (error, sentence) in quoted {
            XCTAssertEqual(String(describing: error), sentence)
            XCTAssertEqual((error as any Error).localizedDescription, sentence)
        }
    }
}
