// Describing a promise while other threads register observers on it and settle it: the
// description reads the state word once, then the outcome, which must already be
// published and complete when the tag says so; `debugDescription` also reads the stack
// head the registrations are moving. Run under TSan by `make tsan`.
import Dispatch
import Foundation
import Promise
import XCTest

final class DescriptionStressTests: XCTestCase {
    func testDescribingWhileOtherThreadsRegisterAndSettle() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var sawPending = 0, sawFulfilled = 0, sawWaiting = 0

        runStressRounds("describe while registering and settling", invariants: [
            "every description is one the promise went through: pending, or fulfilled with the round's value",
            "the last one is the fulfilled one, with no observers waiting",
        ], details: {
            "descriptions seen pending: \(sawPending), fulfilled: \(sawFulfilled), with observers waiting: \(sawWaiting)"
        }) { checker in
            let round = checker.round
            let promise = Promise<String>()
            let pending = "Promise<String>(pending)"
            let fulfilled = "Promise<String>(fulfilled: \"v\(round)\")"
            let seen = SeenDescriptions()
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                switch seat {
                case 0:
                    for _ in 0..<4 { promise.whenComplete(on: .immediate) { _ in } }
                case 1:
                    for _ in 0..<random.below(64) { _ = random.next() }
                    promise.fulfill("v\(round)")
                default:
                    repeat {
                        seen.add(promise.description, waiting: promise.debugDescription.contains(", observers waiting"))
                    } while promise.isPending
                }
            }
            checker.check(finished, "round hung")
            for text in seen.texts where text != pending && text != fulfilled {
                checker.fail("described as \(text)")
            }
            checker.check(promise.description == fulfilled, "ended as \(promise.description)")
            checker.check(promise.debugDescription.contains(", no observers waiting, root"),
                          "settled and quiet, yet \(promise.debugDescription)")
            sawPending += seen.texts.contains(pending) ? 1 : 0
            sawFulfilled += seen.texts.contains(fulfilled) ? 1 : 0
            sawWaiting += seen.sawWaiting ? 1 : 0
            return true
        }
    }
}

/// What the describing seat saw; read after `crew.play` returned (its end orders it).
private final class SeenDescriptions: @unchecked Sendable {
    private(set) var texts = Set<String>()
    private(set) var sawWaiting = false

    func add(_ text: String, waiting: Bool) {
        texts.insert(text)
        sawWaiting = sawWaiting || waiting
    }
}
