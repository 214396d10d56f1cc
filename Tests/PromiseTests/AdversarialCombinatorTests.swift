// Adversarial tests of the combinators, timers, retry and the wait/await bridges: each
// pins down a documented behaviour found not to hold.
import Dispatch
import Foundation
import Promise
import XCTest

final class AdversarialCombinatorTests: XCTestCase {
    /// "Cancelling an aggregate cancels its inputs that are still pending" (Cancellation
    /// article). The cancel settles the output first and looks for the pending inputs
    /// after; an input that settles in between (another thread's `fulfill`, here made
    /// deterministic by an `.immediate` observer of the output, which runs inside the
    /// cancel's publish) retires the aggregator, whose give-up on the other, still pending
    /// input may prune that input's slot and clear the link the cancel then looks for. That
    /// input is never cancelled, although nothing else settled it. `shared` has been given
    /// to `earlier` races before, so that one of the rounds reaches the prune threshold.
    func testACancelReachesAPendingInputWhenAnotherInputSettlesDuringTheCancel() {
        var missed: [Int] = []
        for earlier in 0..<20 {
            let shared = Promise<Int>()
            var kept: [Promise<Int>] = []
            for _ in 0..<earlier {
                let other = Promise<Int>()
                kept.append(Promise.race([shared, other]))
                other.fulfill(1)  // settles that race: its slot on `shared` gives up
            }
            let first = Promise<Int>()
            let output = Promise.race([first, shared])
            output.whenComplete(on: .immediate) { _ in _ = first.fulfill(5) }
            output.cancel(reason: TestError(9))
            XCTAssertTrue(output.isCancelled)
            XCTAssertTrue(first.isFulfilled, "settled before the cancel reached it: left alone")
            if !shared.isCancelled { missed.append(earlier) }
            withExtendedLifetime(kept) {}
        }
        XCTAssertEqual(missed, [], "the cancel of the race missed its pending input after these many earlier races: \(missed)")
    }

    /// The same for `allSettled`, where the input that settles during the cancel does not
    /// settle the output.
    func testACancelOfAllSettledReachesAPendingInputWhenAnotherInputSettlesDuringTheCancel() {
        var missed: [Int] = []
        for earlier in 0..<20 {
            let shared = Promise<Int>()
            var kept: [Promise<Int>] = []
            for _ in 0..<earlier {
                let other = Promise<Int>()
                kept.append(Promise.race([shared, other]))
                other.fulfill(1)
            }
            let first = Promise<Int>()
            let output = Promise.allSettled([first, shared])
            output.whenComplete(on: .immediate) { _ in _ = first.fulfill(5) }
            output.cancel(reason: TestError(9))
            XCTAssertTrue(output.isCancelled)
            if !shared.isCancelled { missed.append(earlier) }
            withExtendedLifetime(kept) {}
        }
        XCTAssertEqual(missed, [], "the cancel of allSettled missed its pending input after these many earlier races: \(missed)")
    }
}
