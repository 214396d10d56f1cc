// Retry policies: which errors are retried, how long each pause is (fixed or exponential,
// capped, with jitter), and that values from configuration are checked.
import Dispatch
import Foundation
import XCTest
@testable import Promise

private struct Transient: Error, Equatable { let attempt: Int }
private struct Fatal: Error, Equatable {}

final class RetryPolicyTests: XCTestCase {
    /// Drives a retry whose every attempt fails on `clock`, advancing through each pause,
    /// and returns the pauses it asked for.
    private func pausesOfAFailingRun(attempts: Int, backoff: RetryBackoff, clock: ManualClock) throws -> [Duration] {
        let calls = Counter()
        let output = Promise<Int>.retry(attempts: attempts, backoff: backoff, clock: clock, on: .immediate) {
            calls.increment()
            return Promise(error: Transient(attempt: calls.value))
        }
        for pause in 1..<attempts {
            XCTAssertTrue(clock.waitForSleepers(1), "no pause after attempt \(pause)")
            clock.advance(by: clock.askedSleeps.last ?? .zero)
        }
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) {
            XCTAssertEqual($0 as? Transient, Transient(attempt: attempts), "the last attempt's error")
        }
        XCTAssertEqual(calls.value, attempts)
        return clock.askedSleeps
    }

    func testExponentialBackoffDoublesUpToItsCap() throws {
        let pauses = try pausesOfAFailingRun(
            attempts: 5, backoff: .exponential(initial: .seconds(1), maximum: .seconds(3)), clock: ManualClock())
        XCTAssertEqual(pauses, [.seconds(1), .seconds(2), .seconds(3), .seconds(3)])
    }

    func testExponentialBackoffWithAnotherMultiplier() throws {
        let pauses = try pausesOfAFailingRun(
            attempts: 4, backoff: .exponential(initial: .milliseconds(100), multiplier: 3, maximum: .seconds(60)),
            clock: ManualClock())
        XCTAssertEqual(pauses, [.milliseconds(100), .milliseconds(300), .milliseconds(900)])
    }

    func testFixedBackoffPausesTheSameEachTime() throws {
        let pauses = try pausesOfAFailingRun(attempts: 4, backoff: .fixed(.seconds(2)), clock: ManualClock())
        XCTAssertEqual(pauses, [.seconds(2), .seconds(2), .seconds(2)])
    }

    func testAnErrorThePredicateDeclinesEndsTheRunAtOnce() throws {
        let clock = ManualClock()
        let calls = Counter()
        let output = Promise<Int>.retry(
            attempts: 5, backoff: .fixed(.seconds(1)), clock: clock, on: .immediate,
            shouldRetry: { $0 is Transient }
        ) {
            calls.increment()
            return Promise(error: calls.value < 2 ? Transient(attempt: calls.value) as any Error : Fatal())
        }
        XCTAssertTrue(clock.waitForSleepers(1))  // the first error was transient
        clock.advance(by: .seconds(1))
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) { XCTAssertEqual($0 as? Fatal, Fatal()) }
        XCTAssertEqual(calls.value, 2, "a declined error must not be retried")
        XCTAssertEqual(clock.askedSleeps, [.seconds(1)])
    }

    func testThePredicateIsNotAskedAfterASuccess() throws {
        let asked = Counter()
        let output = Promise<Int>.retry(attempts: 3, backoff: .fixed(.zero), on: .immediate,
                                        shouldRetry: { _ in asked.increment(); return true }) { Promise(value: 1) }
        XCTAssertEqual(try output.wait(timeout: testTimeout), 1)
        XCTAssertEqual(asked.value, 0)
    }

    func testJitterSpreadsEachPauseWithinItsShare() {
        let backoff = RetryBackoff.fixed(.seconds(2), jitter: 0.5)
        // Seeded from the clock: the range checks below fail by chance with a
        // probability under 1e-40 (no draw among 1,000 in a 10 % band).
        var random = SplitMix64(seed: DispatchTime.now().uptimeNanoseconds)
        let pauses = (0..<1000).map { _ in backoff.pause(afterAttempt: 1, using: &random) }
        XCTAssertTrue(pauses.allSatisfy { $0 >= .seconds(1) && $0 <= .seconds(2) }, "a pause left 1 s ... 2 s")
        XCTAssertLessThan(pauses.min()!, .milliseconds(1100), "the draws do not reach the bottom of the range")
        XCTAssertGreaterThan(pauses.max()!, .milliseconds(1900), "the draws do not reach the top of the range")
        // Full jitter on an exponential backoff: 0 ... the capped pause.
        let full = RetryBackoff.exponential(initial: .seconds(1), maximum: .seconds(4), jitter: 1)
        let fifth = (0..<1000).map { _ in full.pause(afterAttempt: 5, using: &random) }
        XCTAssertTrue(fifth.allSatisfy { $0 >= .zero && $0 <= .seconds(4) })
        XCTAssertLessThan(fifth.min()!, .milliseconds(200))
    }

    func testJitteredPausesOfARunStayInRange() throws {
        let pauses = try pausesOfAFailingRun(
            attempts: 6, backoff: .exponential(initial: .seconds(1), maximum: .seconds(8), jitter: 0.5),
            clock: ManualClock())
        let bounds: [Duration] = [.seconds(1), .seconds(2), .seconds(4), .seconds(8), .seconds(8)]
        XCTAssertEqual(pauses.count, bounds.count)
        for (pause, top) in zip(pauses, bounds) {
            XCTAssertTrue(pause >= top / 2 && pause <= top, "pause \(pause) outside \(top / 2) ... \(top)")
        }
    }

    func testHugeAttemptNumbersAndMultipliersReachTheCapWithoutOverflow() {
        let steep = RetryBackoff.exponential(initial: .seconds(1), multiplier: 1e300, maximum: .seconds(30))
        XCTAssertEqual(steep.pause(afterAttempt: 3), .seconds(30))
        let long = RetryBackoff.exponential(initial: .milliseconds(1), maximum: .seconds(30))
        XCTAssertEqual(long.pause(afterAttempt: 1_000_000), .seconds(30))
        XCTAssertEqual(long.pause(afterAttempt: 1), .milliseconds(1))
        XCTAssertEqual(RetryBackoff.fixed(.seconds(2)).pause(afterAttempt: 1_000_000), .seconds(2))
    }

    /// A pause past Int64's nanoseconds (about 292 years), under a cap set as high, is a
    /// duration, not a trap: it never elapses, and a cancel still ends the run.
    /// A pause past a hundred years (here 1e10 s, under a cap of `Int64.max` seconds) would
    /// never elapse: the run ends there with the last attempt's error, rather than leave
    /// its caller waiting for ever (before: the output stayed pending).
    func testAPauseThatNeverElapsesEndsTheRunWithTheLastError() {
        let steep = RetryBackoff.exponential(initial: .milliseconds(10), multiplier: 1e12, maximum: .seconds(Int64.max))
        XCTAssertEqual(steep.pause(afterAttempt: 2), .seconds(10_000_000_000))
        let clock = ManualClock()
        let calls = Counter()
        let output = Promise<Int>.retry(attempts: 3, backoff: steep, clock: clock, on: .immediate) {
            calls.increment()
            return Promise(error: Transient(attempt: calls.value))
        }
        XCTAssertTrue(clock.waitForSleepers(1))
        clock.advance(by: .milliseconds(10))
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) {
            XCTAssertEqual($0 as? Transient, Transient(attempt: 2))
        }
        XCTAssertEqual(calls.value, 2)
    }

    /// Whether a pause never elapses is decided before the jitter: a fixed pause of 150
    /// years with a jitter of 0.6 (drawn down to 60 years at most) ends the run every time,
    /// never waits 60 years some of the time (it did in 16 of 40 runs).
    func testAPauseBeyondAHundredYearsEndsTheRunWhateverTheJitter() throws {
        let backoff = RetryBackoff.fixed(.seconds(150 * 31_557_600), jitter: 0.6)
        for _ in 0..<20 {
            let output = Promise<Int>.retry(attempts: 2, backoff: backoff, on: .immediate) {
                Promise(error: Transient(attempt: 1))
            }
            XCTAssertThrowsError(try output.wait(timeout: testTimeout)) {
                XCTAssertEqual($0 as? Transient, Transient(attempt: 1))
            }
        }
    }

    /// A cap past `Int64.max` seconds (from configuration, say) is a cap like any other:
    /// the pauses under it are computed without trapping.
    func testACapPastInt64SecondsDoesNotTrap() throws {
        let backoff = RetryBackoff.exponential(initial: .nanoseconds(1), maximum: .seconds(1e20))
        XCTAssertNil(backoff.problem)
        XCTAssertEqual(backoff.pause(afterAttempt: 3), .nanoseconds(4))
        let calls = Counter()
        let output = Promise<Int>.retry(attempts: 3, backoff: backoff) {
            calls.increment()
            return Promise(error: Transient(attempt: calls.value))
        }
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) {
            XCTAssertEqual($0 as? Transient, Transient(attempt: 3))
        }
    }

    /// `shouldRetry` is user code, so it runs on the `on:` context, as `body` does (found by
    /// an API check: it ran on whichever thread rejected the attempt).
    func testThePredicateRunsOnTheContext() throws {
        let key = DispatchSpecificKey<Int>()
        let queue = DispatchQueue(label: "retry predicate")
        queue.setSpecific(key: key, value: 1)
        let onQueue = Recorder<String>()
        let output = Promise<Int>.retry(attempts: 2, backoff: .fixed(.zero), on: queue, shouldRetry: { _ in
            onQueue.append("shouldRetry \(DispatchQueue.getSpecific(key: key) == 1)")
            return true
        }) {
            onQueue.append("body \(DispatchQueue.getSpecific(key: key) == 1)")
            // Rejected from another thread, after a moment.
            return Promise<Int>(on: .default) { usleep(10_000); throw Transient(attempt: 0) }
        }
        XCTAssertThrowsError(try output.wait(timeout: testTimeout))
        XCTAssertEqual(onQueue.values, ["body true", "shouldRetry true", "body true"])
    }

    func testBackoffValuesOutOfRangeRejectWithASentenceAndCallNothing() {
        let cases: [(RetryBackoff, String)] = [
            (.fixed(.seconds(-1)), "the first pause (-1.0 seconds) is negative"),
            (.exponential(initial: .seconds(2), maximum: .seconds(1)),
             "the longest pause (1.0 seconds) is shorter than the first (2.0 seconds)"),
            (.exponential(initial: .seconds(1), multiplier: 0.5, maximum: .seconds(9)),
             "the multiplier (0.5) must be a finite number of at least 1"),
            (.exponential(initial: .seconds(1), multiplier: .nan, maximum: .seconds(9)),
             "the multiplier (nan) must be a finite number of at least 1"),
            (.fixed(.seconds(1), jitter: 2), "the jitter (2.0) must be between 0 and 1"),
            (.fixed(.seconds(1), jitter: -0.1), "the jitter (-0.1) must be between 0 and 1"),
        ]
        let calls = Counter()
        for (backoff, problem) in cases {
            let output = Promise<Int>.retry(attempts: 3, backoff: backoff) { calls.increment(); return Promise(value: 1) }
            XCTAssertThrowsError(try output.wait(timeout: testTimeout)) { error in
                XCTAssertEqual(String(describing: error),
                               "invalid argument: Promise.retry's backoff is out of range: \(problem)")
            }
        }
        XCTAssertEqual(calls.value, 0, "a rejected configuration must call nothing")
    }

    /// `retry(attempts:delay:)` names its own parameter: its caller gave no backoff.
    func testANegativeDelayRejectsWithASentenceNamingTheDelay() {
        let calls = Counter()
        let output = Promise<Int>.retry(attempts: 2, delay: .seconds(-5)) { calls.increment(); return Promise(value: 1) }
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) { error in
            XCTAssertEqual(String(describing: error),
                           "invalid argument: Promise.retry's delay between attempts (-5.0 seconds) is negative")
        }
        XCTAssertEqual(calls.value, 0, "a rejected configuration must call nothing")
    }

    func testCancellingDuringAPauseStopsItsTimerAndStartsNothing() {
        let clock = ManualClock()
        let calls = Counter()
        let output = Promise<Int>.retry(attempts: 5, backoff: .fixed(.seconds(60)), clock: clock, on: .immediate) {
            calls.increment()
            return Promise(error: Transient(attempt: calls.value))
        }
        XCTAssertTrue(clock.waitForSleepers(1))
        output.cancel()
        XCTAssertTrue(clock.waitForSleepers(0), "the pause's timer still sleeps after the cancel")
        clock.advance(by: .seconds(120))
        XCTAssertTrue(output.isCancelled)
        XCTAssertEqual(calls.value, 1, "an attempt started after the cancel")
    }

    func testCancellingCancelsTheAttemptInFlight() {
        let attempt = Promise<Int>()
        let output = Promise<Int>.retry(attempts: 3, backoff: .fixed(.zero), on: .immediate) { attempt }
        output.cancel()
        XCTAssertTrue(attempt.isCancelled, "the attempt in flight was not cancelled")
    }

    func testRetryOnDispatchWithABackoffSucceedsAfterFailures() throws {
        let calls = Counter()
        let output = Promise<Int>.retry(attempts: 4, backoff: .exponential(initial: .milliseconds(1), maximum: .milliseconds(4))) {
            calls.increment()
            return calls.value < 3 ? Promise(error: Transient(attempt: calls.value)) : Promise(value: 42)
        }
        XCTAssertEqual(try output.wait(timeout: testTimeout), 42)
        XCTAssertEqual(calls.value, 3)
    }
}
