// What timers and runs (`retry`, `sequence`, `all(_:maxConcurrent:)`) and combinator
// outputs keep once nothing can use it: a timer that never elapses does not keep the
// promise it would settle; an output settled from outside leaves the long-lived input or
// step it waited on; a run whose context drops its work breaks the output it can no
// longer settle.
import Dispatch
import Foundation
import Promise
import XCTest
@testable import Promise

private struct Reason: Error, Equatable { let tag: Int }

/// Whether `error` is `PromiseError.brokenPromise`.
private func isBroken(_ error: (any Error)?) -> Bool {
    if case PromiseError.brokenPromise? = error as? PromiseError { return true }
    return false
}

/// The error `promise` settles with within `seconds`; `PromiseError.timedOut` if it stays
/// pending that long, nil if it fulfils.
private func errorWithin<T>(_ promise: Promise<T>, seconds: Int64 = 3) -> (any Error)? {
    do {
        _ = try promise.wait(timeout: .seconds(seconds))
        return nil
    } catch {
        return error
    }
}

/// Runs the first `limit` works it is given on a serial queue and drops the rest unrun
/// (an executor that shuts down part-way).
private final class LimitedContext: ExecutionContext, @unchecked Sendable {
    private let lock = NSLock()
    private var left: Int
    private let queue = DispatchQueue(label: "RunLifetimeTests.LimitedContext")

    init(running limit: Int) { left = limit }

    func execute(_ work: @escaping @Sendable () -> Void) {
        let run: Bool = lock.withLock {
            guard left > 0 else { return false }
            left -= 1
            return true
        }
        if run { queue.async(execute: work) }
    }
}

final class RunLifetimeTests: XCTestCase {
    /// A long-lived promise may keep this many nodes that gave up (prunes are amortised).
    private let nodeBound = 2 * RareState.minimumGaveUpBeforePrune + 8
    private let rounds = 10_000

    // MARK: A timer that never elapses keeps nothing

    // An interval past a hundred years sets no timer. Were its work kept, the promise it
    // would settle would be kept by it (the promise holds its timer, to cancel it): a
    // cycle, and observers waiting for ever.

    /// `Promise.after(.seconds(Int64.max))` ("never") dropped with a child: the child must
    /// end `brokenPromise`, and the `after` promise must be freed.
    func testAfterThatNeverElapsesIsFreedWhenDroppedAndBreaksItsChild() {
        let weak = WeakPromise()
        let child: Promise<Int> = {
            let never = Promise.after(.seconds(Int64.max))
            weak.promise = never
            return never.then(on: .immediate) { 1 }
        }()
        XCTAssertTrue(eventually(timeout: 3) { weak.promise == nil },
                      "a dropped after(never) is kept alive by its own timer (cycle)")
        let error = errorWithin(child)
        XCTAssertTrue(isBroken(error), "the child of a dropped after(never) should break, got \(String(describing: error))")
    }

    /// The same through `after(_:clock:)`.
    func testAfterOnAClockThatNeverElapsesIsFreedWhenDropped() {
        let clock = ManualClock()
        let weak = WeakPromise()
        do { weak.promise = Promise.after(.seconds(Int64.max), clock: clock) }
        XCTAssertTrue(eventually(timeout: 3) { weak.promise == nil },
                      "a dropped after(never, clock:) is kept alive by its own timer (cycle)")
    }

    /// `delay(.seconds(Int64.max))` of a fulfilled promise, dropped: the child and the value
    /// it would deliver stay alive for ever.
    func testDelayThatNeverElapsesIsFreedWithItsValueWhenDropped() {
        let tracker = LifeTracker()
        let weak = WeakPromise()
        do {
            let delayed = Promise(value: Payload(bytes: [1], tracker: tracker)).delay(.seconds(Int64.max))
            weak.promise = delayed
        }
        XCTAssertTrue(eventually(timeout: 3) { weak.promise == nil && tracker.alive == 0 },
                      "a dropped delay(never) is kept (\(weak.promise != nil)) with its value (\(tracker.alive) alive)")
    }

    /// `retry` whose backoff pauses for ever (past a hundred years): the run ends at that
    /// pause with the last error, and lets go of its body and their captures; nothing is
    /// kept, and the child takes the error.
    func testRetryWhosePauseNeverElapsesEndsAndLetsGo() {
        let tracker = LifeTracker()
        let calls = Counter()
        let weak = WeakPromise()
        let child: Promise<Int> = {
            let captured = Payload(bytes: [1], tracker: tracker)
            let output = Promise<Int>.retry(attempts: 3, backoff: .fixed(.seconds(Int64.max))) {
                calls.increment()
                return Promise(error: Reason(tag: captured.bytes.count))
            }
            weak.promise = output
            return output.then(on: .immediate) { $0 }
        }()
        XCTAssertTrue(eventually { calls.value == 1 }, "the first attempt ran")
        XCTAssertTrue(eventually(timeout: 3) { weak.promise == nil && tracker.alive == 0 },
                      "a retry that ended is kept (\(weak.promise != nil)) with its body (\(tracker.alive) alive)")
        let error = errorWithin(child, seconds: 1)
        XCTAssertEqual(error as? Reason, Reason(tag: 1), "the child takes the last attempt's error")
        XCTAssertEqual(calls.value, 1)
    }

    // MARK: Combinator outputs settled from outside

    // Whoever holds a combinator's output may settle it. Then, as when its inputs settle
    // it, the aggregator lets go of the settled inputs and of the output, and its slots on
    // the inputs still pending give up.

    func testAggregateOutputsSettledFromOutsideLeaveALongLivedInput() {
        func check(_ name: String, _ round: (_ longLived: Promise<Payload>, _ tracker: LifeTracker, _ index: Int) -> Void) {
            let longLived = Promise<Payload>()
            let tracker = LifeTracker()
            for index in 0..<rounds { round(longLived, tracker, index) }
            XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, nodeBound,
                                     "\(name): settled outputs stay registered on the long-lived input")
            XCTAssertEqual(tracker.alive, 0, "\(name): settled outputs nobody holds keep their inputs' values")
            longLived.cancel()
        }
        check("all") { longLived, tracker, index in
            let first = Promise<Payload>()
            let output = Promise.all([first, longLived])
            first.fulfill(Payload(bytes: [1], tracker: tracker))
            output.reject(Reason(tag: index))
        }
        check("allSettled") { longLived, tracker, index in
            let first = Promise<Payload>()
            let output = Promise.allSettled([first, longLived])
            first.fulfill(Payload(bytes: [1], tracker: tracker))
            output.reject(Reason(tag: index))
        }
        check("any") { longLived, tracker, index in
            let first = Promise<Payload>()
            let output = Promise.any([first, longLived])
            first.reject(Reason(tag: index))
            output.fulfill(Payload(bytes: [1], tracker: tracker))
        }
        check("race") { longLived, tracker, index in
            let output = Promise.race([longLived])
            output.fulfill(Payload(bytes: [1], tracker: tracker))
        }
        check("and") { longLived, tracker, index in
            let output = longLived.and(Promise(value: Payload(bytes: [1], tracker: tracker)))
            output.reject(Reason(tag: index))
        }
    }

    // MARK: Runs settled or locked in from outside

    // The run's observer on the step in flight gives up when the output settles, or locks
    // in to follow another promise (`resolve(with:)`, which the run cannot settle either),
    // so a long-lived step keeps a bounded number of them (until its next prune), and the
    // runs let go at once of what they held of the user's (results, work closures, input
    // iterators, captures), though a locked-in output stays pending until the promise it
    // follows settles.

    /// How a test ends a run's output from outside.
    private enum OutsideEnd: CaseIterable {
        case settled, lockedIn

        /// Settles `output` with `settle`, or locks it in to follow `elsewhere`.
        func apply<T>(to output: Promise<T>, following elsewhere: Promise<T>, settle: (Promise<T>) -> Void) {
            switch self {
            case .settled: settle(output)
            case .lockedIn: output.resolve(with: elsewhere)
            }
        }
    }

    func testSequenceEndedFromOutsideLeavesALongLivedStep() {
        for end in OutsideEnd.allCases {
            let longLived = Promise<Payload>()
            let tracker = LifeTracker()
            let elsewhere = Promise<[Payload]>()  // pending: every locked-in output follows it
            for index in 0..<rounds {
                let output = Promise.sequence(on: .immediate, [0, 1]) { step -> Promise<Payload> in
                    step == 0 ? Promise(value: Payload(bytes: [1], tracker: tracker)) : longLived
                }
                end.apply(to: output, following: elsewhere) { $0.reject(Reason(tag: index)) }
            }
            XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, nodeBound,
                                     "\(end) sequences stay registered on the long-lived step")
            XCTAssertEqual(tracker.alive, 0, "a \(end) sequence nobody holds keeps its finished steps' values")
            longLived.cancel()
            withExtendedLifetime(elsewhere) {}
        }
    }

    func testBoundedFanOutEndedFromOutsideLeavesALongLivedStep() {
        for end in OutsideEnd.allCases {
            let longLived = Promise<Int>()
            let tracker = LifeTracker()
            let elsewhere = Promise<[Int]>()
            for index in 0..<rounds {
                let captured = Payload(bytes: [1], tracker: tracker)
                let output = Promise.all([0, 1, 2], maxConcurrent: 2, on: .immediate) { input -> Promise<Int> in
                    input == 0 ? Promise(value: captured.bytes.count) : longLived
                }
                end.apply(to: output, following: elsewhere) { $0.fulfill([index]) }
            }
            XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, nodeBound,
                                     "\(end) fan-outs stay registered on the long-lived step")
            XCTAssertEqual(tracker.alive, 0, "a \(end) fan-out nobody holds keeps its work closure")
            longLived.cancel()
            withExtendedLifetime(elsewhere) {}
        }
    }

    func testRetryEndedFromOutsideLeavesALongLivedAttempt() {
        for end in OutsideEnd.allCases {
            let longLived = Promise<Int>()
            let tracker = LifeTracker()
            let elsewhere = Promise<Int>()
            for index in 0..<rounds {
                let captured = Payload(bytes: [1], tracker: tracker)
                let output = Promise.retry(attempts: 2, on: .immediate) { () -> Promise<Int> in
                    withExtendedLifetime(captured) {}
                    return longLived
                }
                end.apply(to: output, following: elsewhere) { $0.reject(Reason(tag: index)) }
            }
            XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, nodeBound,
                                     "\(end) retries stay registered on the long-lived attempt")
            XCTAssertEqual(tracker.alive, 0, "a \(end) retry nobody holds keeps its body's captures")
            longLived.fulfill(1)
            elsewhere.fulfill(2)
        }
    }

    /// A run's step that is a fresh child of a long-lived promise (`longLived.then { }`)
    /// stays with that promise, as any pending child does; but the run stopped watching it
    /// when the output settled from outside, and the run, its output and the output's value
    /// must not stay with it. (The step has one observer, the run's: it gave up, and a
    /// first give-up prunes at once.)
    func testARunEndedFromOutsideLeavesItsOutputWithAStepThatStays() {
        for kind in ["sequence", "retry", "all(maxConcurrent:)"] {
            let longLived = Promise<Payload>()
            let tracker = LifeTracker()
            for _ in 0..<1_000 {
                let step: @Sendable () -> Promise<Payload> = { longLived.then(on: .immediate) { $0 } }
                let value = Payload(bytes: [1], tracker: tracker)
                switch kind {
                case "sequence": Promise.sequence(on: .immediate, [0]) { _ in step() }.fulfill([value])
                case "retry": Promise.retry(attempts: 2, on: .immediate) { step() }.fulfill(value)
                default: Promise.all([0], maxConcurrent: 1, on: .immediate) { _ in step() }.fulfill([value])
                }
            }
            XCTAssertEqual(tracker.alive, 0, "\(kind): runs whose step stays keep their settled outputs' values")
            longLived.reject(Reason(tag: 0))
        }
    }

    /// A locked-in output still ends as the promise it follows does, whatever its run's
    /// steps do after the lock-in.
    func testARunLockedInEndsAsThePromiseItFollows() {
        let step = Promise<Int>()
        let elsewhere = Promise<[Int]>()
        let output = Promise.all([0, 1], maxConcurrent: 2, on: .immediate) { _ in step }
        output.resolve(with: elsewhere)
        step.fulfill(1)  // both steps: the run would have fulfilled the output with [1, 1]
        XCTAssertTrue(output.isPending, "\(output)")
        elsewhere.fulfill([7])
        XCTAssertEqual(try output.wait(timeout: testTimeout), [7])
    }

    /// A run parts with its output at the lock-in, as when the output's holder settles it:
    /// a later cancel of the output leaves the step in flight running. A combinator's
    /// inputs stay the output's until it settles: the same cancel reaches them.
    func testACancelAfterALockInReachesACombinatorsInputsNotARunsStep() {
        let step = Promise<Int>()
        let elsewhere = Promise<Int>()
        let run = Promise.retry(attempts: 2, on: .immediate) { step }
        run.resolve(with: elsewhere)
        run.cancel()
        XCTAssertTrue(run.isCancelled, "\(run)")
        XCTAssertTrue(step.isPending, "the run stopped at the lock-in; its step is not the output's any more")

        let input = Promise<Int>(), other = Promise<Int>()
        let race = Promise.race([input, other])
        race.resolve(with: elsewhere)
        race.cancel()
        XCTAssertTrue(race.isCancelled, "\(race)")
        XCTAssertTrue(input.isCancelled && other.isCancelled, "a locked-in combinator's pending inputs are still its output's")
        XCTAssertTrue(elsewhere.isPending, "what a lock-in follows is not owned")
        step.fulfill(1)
    }

    /// One run settled from outside lets go at once of what it holds of the user's (its
    /// code and its captures, its results, its inputs), though its observer waits on the
    /// long-lived step until that step's next prune.
    func testOneRunSettledFromOutsideLetsGoOfTheUsersCodeAndResults() {
        let longLived = Promise<Payload>()
        let tracker = LifeTracker()
        do {
            let output = Promise.all(0..<1_000, maxConcurrent: 1, on: .immediate) { input -> Promise<Payload> in
                input < 999 ? Promise(value: Payload(bytes: [1], tracker: tracker)) : longLived
            }
            output.reject(Reason(tag: 1))
        }
        XCTAssertEqual(tracker.alive, 0, "a fan-out rejected from outside keeps its results")
        do {
            let captured = Payload(bytes: [1], tracker: tracker)
            let output = Promise.sequence(on: .immediate, [0]) { _ in withExtendedLifetime(captured) { longLived } }
            output.reject(Reason(tag: 2))
        }
        XCTAssertEqual(tracker.alive, 0, "a sequence rejected from outside keeps its work's captures")
        let attempt = Promise<Int>()
        do {
            let captured = Payload(bytes: [1], tracker: tracker)
            let output = Promise.retry(attempts: 2, on: .immediate) { () -> Promise<Int> in
                withExtendedLifetime(captured) { attempt }
            }
            output.reject(Reason(tag: 3))
        }
        XCTAssertEqual(tracker.alive, 0, "a retry rejected from outside keeps its body's captures")
        longLived.cancel()
        attempt.cancel()
    }

    /// A retry settled from outside during its pause cancels the pause (its own timer),
    /// which lets go of the run at once, not at the end of the pause.
    func testARetrySettledFromOutsideDuringItsPauseLetsGoOfItsRun() {
        let tracker = LifeTracker()
        let calls = Counter()
        let output: Promise<Int>
        do {
            let captured = Payload(bytes: [1], tracker: tracker)
            output = Promise.retry(attempts: 3, backoff: .fixed(.seconds(3600)), on: .immediate) { () -> Promise<Int> in
                withExtendedLifetime(captured) {}
                calls.increment()
                return Promise(error: Reason(tag: 1))
            }
        }
        XCTAssertEqual(calls.value, 1)
        output.reject(Reason(tag: 2))
        XCTAssertTrue(eventually { tracker.alive == 0 }, "the run is kept for the rest of its pause")
        XCTAssertEqual(calls.value, 1)
    }

    /// A retry or fan-out whose output was settled or locked in before a step failed
    /// starts no pause, no attempt and cancels nothing: what is in flight goes on.
    func testARunSettledOrLockedInBeforeAStepFailedStartsNothingMore() {
        let calls = Counter()
        let failing = Promise<Int>()
        let output = Promise.retry(attempts: 3, backoff: .fixed(.seconds(3600)), on: .immediate) { () -> Promise<Int> in
            calls.increment()
            return failing
        }
        output.resolve(with: Promise<Int>())  // locked in
        failing.reject(Reason(tag: 4))
        XCTAssertEqual(calls.value, 1, "an attempt or a pause after the lock-in")

        let steps = Recorder<Promise<Int>>()
        let fanned = Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { _ in
            let step = Promise<Int>()
            steps.append(step)
            return step
        }
        let elsewhere = Promise<[Int]>()
        fanned.resolve(with: elsewhere)
        steps.values[0].reject(Reason(tag: 5))
        XCTAssertFalse(steps.values[1].isCancelled, "a step in flight cancelled although the output is locked in")
        elsewhere.fulfill([7])
        XCTAssertEqual(try fanned.wait(timeout: testTimeout), [7])
        steps.values[1].fulfill(1)
    }

    // MARK: A context that drops the work

    // The work a run queues on its context is what settles its output. A context that
    // drops it (against its contract: an executor shutting down) leaves nothing to go on
    // with: the output, held by its user, ends `brokenPromise` rather than pending for ever.

    func testRetryWhoseContextDropsItsWorkBreaksItsHeldOutput() {
        let output = Promise<Int>.retry(attempts: 3, on: DroppingContext()) { Promise(value: 1) }
        let error = errorWithin(output)
        XCTAssertTrue(isBroken(error), "retry on a dropping context: \(String(describing: error)) instead of brokenPromise")
        // `sequence` too:
        let sequence = Promise.sequence(on: LimitedContext(running: 1), [1, 2, 3]) { Promise(value: $0) }
        XCTAssertTrue(isBroken(errorWithin(sequence)))
    }

    /// The same for `retry` whose `shouldRetry` call is dropped by the context.
    func testRetryWhoseContextDropsTheShouldRetryCallBreaksItsHeldOutput() {
        let output = Promise<Int>.retry(attempts: 3, backoff: .fixed(.zero), on: LimitedContext(running: 1),
                                        shouldRetry: { _ in true }) { Promise(error: Reason(tag: 1)) }
        let error = errorWithin(output)
        XCTAssertTrue(isBroken(error), "retry whose shouldRetry was dropped: \(String(describing: error)) instead of brokenPromise")
    }
}
