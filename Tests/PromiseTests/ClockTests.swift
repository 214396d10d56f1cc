// Timers under the caller's control: `after`, `delay`, `timeout` and `timeout(until:)`
// on a manual clock, driven without sleeping; deadlines on Dispatch's default path.
import Dispatch
import Foundation
import Promise
import XCTest

private struct Slow: Error, Equatable {}

final class ClockTests: XCTestCase {
    private func isTimedOut(_ promise: Promise<Int>) -> Bool {
        guard promise.isRejected else { return false }
        do {
            _ = try promise.wait(timeout: .zero)
            return false
        } catch PromiseError.timedOut {
            return true
        } catch {
            return false
        }
    }

    func testAfterOnAManualClockFulfilsWhenTheClockGetsThereAndNotBefore() {
        let clock = ManualClock()
        let started = ContinuousClock.now
        let thirtySeconds = Promise.after(.seconds(30), clock: clock)
        XCTAssertTrue(clock.waitForSleepers(1), "after(_:clock:) did not sleep on the clock")
        clock.advance(by: .seconds(29))
        XCTAssertEqual(clock.sleeperCount, 1, "woke before its deadline")
        XCTAssertTrue(thirtySeconds.isPending)
        clock.advance(by: .seconds(1))
        XCTAssertTrue(eventually { thirtySeconds.isFulfilled })
        XCTAssertEqual(clock.askedSleeps, [.seconds(30)])
        XCTAssertLessThan(started.duration(to: .now), .seconds(10), "a manual clock must not make the test wait")
    }

    func testCancellingAfterOnAClockEndsItsSleep() {
        let clock = ManualClock()
        let timer = Promise.after(.seconds(30), clock: clock)
        XCTAssertTrue(clock.waitForSleepers(1))
        timer.cancel()
        XCTAssertTrue(clock.waitForSleepers(0), "the cancelled timer's Task still sleeps on the clock")
        clock.advance(by: .seconds(60))
        XCTAssertTrue(timer.isCancelled)
    }

    func testTimeoutOnAClockRejectsWithTimedOutAndLeavesTheReceiverAlone() {
        let clock = ManualClock()
        let receiver = Promise<Int>()
        let child = receiver.timeout(.seconds(30), clock: clock)
        XCTAssertTrue(clock.waitForSleepers(1))
        clock.advance(by: .seconds(30))
        XCTAssertTrue(eventually { self.isTimedOut(child) }, "timeout(_:clock:) did not reject with timedOut")
        XCTAssertTrue(receiver.isPending, "the receiver must be untouched")
    }

    func testTimeoutOnAClockStopsItsTimerWhenTheReceiverSettlesFirst() throws {
        let clock = ManualClock()
        let receiver = Promise<Int>()
        let child = receiver.timeout(.seconds(30), clock: clock)
        XCTAssertTrue(clock.waitForSleepers(1))
        receiver.fulfill(7)
        XCTAssertEqual(try child.wait(timeout: testTimeout), 7)
        XCTAssertTrue(clock.waitForSleepers(0), "the timer of a settled timeout child still sleeps")
    }

    func testDelayOnAClockPassesTheValueOnWhenTheClockGetsThere() throws {
        let clock = ManualClock()
        let source = Promise<Int>()
        let delayed = source.delay(.seconds(5), clock: clock)
        source.fulfill(3)
        XCTAssertTrue(clock.waitForSleepers(1))
        XCTAssertTrue(delayed.isPending)
        clock.advance(by: .seconds(5))
        XCTAssertEqual(try delayed.wait(timeout: testTimeout), 3)
        // A rejection passes on at once, without the clock.
        let failed = Promise<Int>(error: Slow()).delay(.seconds(5), clock: clock)
        XCTAssertThrowsError(try failed.wait(timeout: testTimeout)) { XCTAssertEqual($0 as? Slow, Slow()) }
    }

    func testOneDeadlineForEveryStepOfARequest() throws {
        let clock = ManualClock()
        let deadline = clock.now.advanced(by: .seconds(10))
        let user = Promise<Int>()
        let userInTime = user.timeout(until: deadline, clock: clock)
        XCTAssertTrue(clock.waitForSleepers(1))
        clock.advance(by: .seconds(4))
        user.fulfill(1)  // the first step, in time
        XCTAssertEqual(try userInTime.wait(timeout: testTimeout), 1)
        XCTAssertTrue(clock.waitForSleepers(0), "the first step's timer still sleeps")
        // The second step starts at 4 s, with the same deadline: 6 s are left, not 10.
        let cart = Promise<Int>()
        let cartInTime = cart.timeout(until: deadline, clock: clock)
        XCTAssertTrue(clock.waitForSleepers(1))
        clock.advance(by: .seconds(6))
        XCTAssertTrue(eventually { self.isTimedOut(cartInTime) }, "the second step outlived the request's deadline: \(cartInTime)")
        XCTAssertEqual(clock.askedSleeps, [.seconds(10), .seconds(6)])
        XCTAssertTrue(cart.isPending)
    }

    func testADeadlineAlreadyPastRejectsAtOnce() {
        let clock = ManualClock()
        clock.advance(by: .seconds(5))
        let receiver = Promise<Int>()  // held: a receiver dropped pending would break the child
        let late = receiver.timeout(until: clock.now.advanced(by: .seconds(-1)), clock: clock)
        XCTAssertTrue(isTimedOut(late), "not at once: \(late)")
        let now = receiver.timeout(until: clock.now, clock: clock)
        XCTAssertTrue(isTimedOut(now), "not at once: \(now)")
        // On the default path (Dispatch, ContinuousClock instants).
        let lateOnDispatch = receiver.timeout(until: .now - .seconds(1))
        XCTAssertTrue(isTimedOut(lateOnDispatch), "not at once: \(lateOnDispatch)")
        XCTAssertTrue(receiver.isPending)
        // The receiver settling right after does not change them.
        receiver.fulfill(1)
        XCTAssertTrue(isTimedOut(late) && isTimedOut(now) && isTimedOut(lateOnDispatch))
        // A receiver settled already wins over a past deadline.
        let settled = Promise(value: 2).timeout(until: .now - .seconds(1))
        XCTAssertEqual(try settled.wait(timeout: testTimeout), 2)
    }

    /// A timeout of a promise settled already is settled before `timeout` returns, also
    /// inside an `.immediate` handler (it waited for the handler to return, so a `wait`
    /// on it there timed out), and sets no timer.
    func testATimeoutOfASettledPromiseIsSettledAtOnce() {
        let settled = Promise<Int>(value: 4)
        let outside = settled.timeout(.seconds(5))
        XCTAssertTrue(outside.isFulfilled)
        XCTAssertEqual(value(outside), 4)
        let trigger = Promise<Void>()
        let seen = trigger.then(on: .immediate) { _ -> String in
            // Promises whose waiter lists are new (the first use registers the list).
            let child = Promise<Int>(value: 5).timeout(.seconds(5))
            let untilDeadline = Promise<Int>(value: 6).timeout(until: .now + .seconds(5))
            return "\(child.state) \(untilDeadline.state)"
        }
        trigger.fulfill(())
        XCTAssertEqual(value(seen), "fulfilled fulfilled")
        let cancelled = Promise<Int>()
        cancelled.cancel()
        XCTAssertTrue(cancelled.timeout(.seconds(5)).isCancelled)
    }

    /// A deadline on a clock more than a hundred years away never comes, as an interval
    /// that long does not: `ContinuousClock`'s own sleep would trap on it (it counts in
    /// 64-bit nanoseconds). In a child process: the trap ended the whole test run.
    func testAFarDeadlineOnAClockNeverComes() throws {
        try runInChildProcess {
            let receiver = Promise<Int>()
            let clock = ContinuousClock()
            let child = receiver.timeout(until: clock.now.advanced(by: .seconds(Int64.max)), clock: clock)
            let manual = ManualClock()
            let onManual = receiver.timeout(until: manual.now.advanced(by: .seconds(Int64.max)), clock: manual)
            manual.advance(by: .seconds(3_155_760_000))
            let slept = Promise<Void>.after(.milliseconds(200))
            _ = try slept.wait(timeout: testTimeout)
            XCTAssertTrue(child.isPending && onManual.isPending)
            receiver.fulfill(2)
            XCTAssertEqual(value(child), 2)
            XCTAssertEqual(value(onManual), 2)
        }
    }

    /// Intervals too long for Dispatch's nanoseconds (`.seconds(Int64.max)`: "no timeout")
    /// never elapse. They used to wrap around to a deadline in the past and fire at once.
    func testHugeIntervalsNeverElapse() throws {
        let receiver = Promise<Int>()
        let noTimeout = receiver.timeout(.seconds(Int64.max))
        let never = Promise<Void>.after(.seconds(10_000_000_000))
        let delayed = Promise(value: 1).delay(.milliseconds(Int64.max))
        let clock = ManualClock()
        let neverOnAClock = Promise<Void>.after(.seconds(Int64.max), clock: clock)
        // A short timer made after them fires: a wrapped deadline (now) would have by then.
        XCTAssertNoThrow(try Promise<Void>.after(.milliseconds(50)).wait(timeout: testTimeout))
        XCTAssertTrue(noTimeout.isPending, "\(noTimeout)")
        XCTAssertTrue(never.isPending, "\(never)")
        XCTAssertTrue(delayed.isPending, "\(delayed)")
        XCTAssertTrue(neverOnAClock.isPending, "\(neverOnAClock)")
        XCTAssertEqual(clock.sleeperCount, 0, "a timer past a hundred years sleeps on the clock")
        // A wait with such a timeout waits for the outcome.
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) { receiver.fulfill(7) }
        XCTAssertEqual(try receiver.wait(timeout: .seconds(Int64.max)), 7)
        XCTAssertEqual(try noTimeout.wait(timeout: testTimeout), 7)
        never.cancel(); delayed.cancel(); neverOnAClock.cancel()
        XCTAssertTrue(never.isCancelled && delayed.isCancelled && neverOnAClock.isCancelled)
    }

    func testTimeoutUntilOnDispatchLetsAPromiseInTimeThrough() throws {
        let receiver = Promise<Int>()
        let child = receiver.timeout(until: .now + .seconds(60))
        receiver.fulfill(9)
        XCTAssertEqual(try child.wait(timeout: testTimeout), 9)
    }

    // MARK: A clock that cannot sleep

    /// `after`, `delay`, `timeout`, `timeout(until:)` and `retry`'s pauses on a clock whose
    /// sleep throws (a test clock that was shut down) settle with the clock's error: none
    /// leaves its caller waiting for ever, and nothing it timed is kept.
    func testAClockWhoseSleepThrowsRejectsWhatItTimes() throws {
        let clock = FailingClock()
        let receiver = Promise<Int>()
        func outcome<T>(_ promise: Promise<T>) -> String {
            do {
                _ = try promise.wait(timeout: .seconds(10))
                return "fulfilled"
            } catch {
                return "\(error)"
            }
        }
        let outcomes = [
            ("after", outcome(Promise<Void>.after(.milliseconds(10), clock: clock))),
            ("delay", outcome(Promise(value: 7).delay(.milliseconds(10), clock: clock))),
            ("timeout", outcome(receiver.timeout(.milliseconds(10), clock: clock))),
            ("timeout(until:)", outcome(receiver.timeout(until: clock.now.advanced(by: .milliseconds(10)), clock: clock))),
            ("retry", outcome(Promise<Int>.retry(attempts: 3, backoff: .fixed(.milliseconds(10)), clock: clock) {
                Promise(error: TestError(1))
            })),
        ]
        for (name, text) in outcomes {
            XCTAssertEqual(text, "Broken()", "\(name) on a clock that cannot sleep")
        }
        XCTAssertTrue(receiver.isPending, "the receiver of a timeout is untouched")
        receiver.cancel()
    }
}

extension ClockTests {
    /// The most negative duration there is: a deadline built from it lies so far in the
    /// past that subtracting the clock's later `now` from it overflows.
    private var mostNegative: Duration { Duration(attoseconds: Int128.min) }

    /// Far-past deadlines and the most negative interval on the system clocks are due at
    /// once, as on Dispatch, instead of trapping on the overflow of `deadline - now`.
    /// (Each in a child process: a trap fails the test, not the run.)
    func testTimeoutUntilAFarPastDeadlineRejectsAtOnce() {
        runInChildProcess {
            let deadline = ContinuousClock.now.advanced(by: mostNegative)
            usleep(1_000)  // the library's now is later than the deadline's
            let receiver = Promise<Int>()
            XCTAssertTrue(isTimedOut(receiver.timeout(until: deadline)), "on Dispatch")
            XCTAssertTrue(isTimedOut(receiver.timeout(until: deadline, clock: ContinuousClock())), "on a system clock")
            XCTAssertTrue(receiver.isPending)
            receiver.fulfill(1)
        }
    }

    func testTheMostNegativeIntervalOnASystemClockIsDueAtOnce() throws {
        try runInChildProcess {
            XCTAssertNoThrow(try Promise<Void>.after(mostNegative, clock: SuspendingClock()).wait(timeout: testTimeout))
            XCTAssertEqual(try Promise(value: 3).delay(mostNegative, clock: ContinuousClock()).wait(timeout: testTimeout), 3)
            let receiver = Promise<Int>()
            let child = receiver.timeout(mostNegative, clock: ContinuousClock())
            XCTAssertTrue(eventually { self.isTimedOut(child) }, "\(child)")
            receiver.fulfill(1)
        }
    }

    /// A clock whose `sleep` returns before its `now` reaches the deadline breaks `Clock`'s
    /// contract: nothing timed on it fires early. One that always does rejects what it
    /// times with an error that says so (it does not spin either); one that wakes early
    /// once is slept again and fires on time.
    func testAClockWhoseSleepReturnsEarlyNeverFiresATimerEarly() throws {
        let clock = EarlyWakingClock(earlyWakes: .max)
        let started = ContinuousClock.now
        let receiver = Promise<Int>()
        let timedOnIt: [(String, Result<Void, any Error>?)] = [
            ("after", outcome(Promise<Void>.after(.seconds(30), clock: clock))),
            ("delay", outcome(Promise(value: 5).delay(.seconds(30), clock: clock)).map { $0.map { _ in } }),
            ("timeout", outcome(receiver.timeout(.seconds(30), clock: clock)).map { $0.map { _ in } }),
            ("retry", outcome(Promise<Int>.retry(attempts: 2, backoff: .fixed(.seconds(30)), clock: clock) {
                Promise(error: TestError(1))
            }).map { $0.map { _ in } }),
        ]
        XCTAssertLessThan(started.duration(to: .now), .seconds(30))
        for (name, result) in timedOnIt {
            guard case .failure(PromiseError.invalidArgument(let text))? = result else {
                XCTFail("\(name) on a clock that wakes early: \(String(describing: result))")
                continue
            }
            XCTAssertTrue(text.contains("EarlyWakingClock") && text.contains("before its deadline"), text)
        }
        XCTAssertTrue(receiver.isPending, "the receiver of a timeout is untouched")
        receiver.fulfill(0)

        let onceEarly = EarlyWakingClock(earlyWakes: 1)
        let due = ContinuousClock.now + .milliseconds(50)
        XCTAssertNoThrow(try Promise<Void>.after(.milliseconds(50), clock: onceEarly).wait(timeout: testTimeout))
        XCTAssertGreaterThanOrEqual(ContinuousClock.now, due, "fired before its deadline")
        XCTAssertEqual(onceEarly.sleeps, 2)
    }
}

/// A clock on `ContinuousClock`'s instants whose `sleep` returns at once its first
/// `earlyWakes` times, whatever the deadline, and sleeps properly after that.
private final class EarlyWakingClock: Clock, @unchecked Sendable {
    typealias Instant = ContinuousClock.Instant
    private let earlyWakes: Int
    private let lock = NSLock()
    private var slept = 0
    init(earlyWakes: Int) { self.earlyWakes = earlyWakes }
    var now: Instant { ContinuousClock.now }
    var minimumResolution: Duration { .zero }
    var sleeps: Int { lock.withLock { slept } }
    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        let early = lock.withLock { () -> Bool in
            slept += 1
            return slept <= earlyWakes
        }
        if !early { try await ContinuousClock().sleep(until: deadline, tolerance: tolerance) }
    }
}

/// A clock whose `sleep` always throws, as a test clock that was shut down does.
private struct FailingClock: Clock {
    struct Broken: Error {}
    typealias Instant = ContinuousClock.Instant
    var now: Instant { ContinuousClock.now }
    var minimumResolution: Duration { .zero }
    func sleep(until deadline: Instant, tolerance: Duration?) async throws { throw Broken() }
}
