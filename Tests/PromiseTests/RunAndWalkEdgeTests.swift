// Edges where a run, or the cycle check, meets another thread or a timer: a cancel of a
// fan-out racing a step's failure, a retry's output settled as it makes its pause, a
// fan-out stopped inside its last pull, and children that a timer settles (no cycle).
import Dispatch
import Foundation
import Promise
import XCTest

private struct EdgeError: Error, Equatable { let tag: Int }

/// A clock on ContinuousClock whose `now` runs a hook once armed (it is read synchronously
/// by `Promise.after(_:clock:)`, i.e. inside retry's `makePause`).
private final class NowHook: @unchecked Sendable {
    private let lock = NSLock()
    private var hook: (@Sendable () -> Void)?
    func arm(_ body: @escaping @Sendable () -> Void) { lock.lock(); hook = body; lock.unlock() }
    func fire() {
        lock.lock(); let h = hook; hook = nil; lock.unlock()
        h?()
    }
}

private struct HookClock: Clock {
    typealias Duration = Swift.Duration
    typealias Instant = ContinuousClock.Instant
    let hook: NowHook
    var now: Instant { hook.fire(); return ContinuousClock.now }
    var minimumResolution: Duration { ContinuousClock().minimumResolution }
    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        try await ContinuousClock().sleep(until: deadline, tolerance: tolerance)
    }
}

/// A sequence whose iterator runs `onEnd` when asked past its last element, and holds a
/// tracked payload (the "inputs").
private struct EndHookSequence: Sequence, Sendable {
    let count: Int
    let payload: Payload
    let onEnd: @Sendable () -> Void
    struct Iterator: IteratorProtocol {
        var position = 0
        let count: Int
        let payload: Payload
        let onEnd: @Sendable () -> Void
        mutating func next() -> Int? {
            if position < count { position += 1; return position - 1 }
            onEnd()
            return nil
        }
    }
    func makeIterator() -> Iterator { Iterator(count: count, payload: payload, onEnd: onEnd) }
}

private final class Box<T>: @unchecked Sendable { var value: T? }

final class RunAndWalkEdgeTests: XCTestCase {
    private func outcome<T>(_ p: Promise<T>, timeout: TimeInterval = 5) -> Result<T, any Error>? {
        let s = DispatchSemaphore(value: 0)
        let box = Box<Result<T, any Error>>()
        p.whenComplete(on: .immediate) { r in box.value = r; s.signal() }
        guard s.wait(timeout: .now() + timeout) == .success else { return nil }
        return box.value
    }

    private func isCycle(_ r: Result<some Any, any Error>?) -> Bool {
        if case .failure(PromiseError.cycle)? = r { return true }
        return false
    }

    // MARK: Children a timer settles: no cycle

    /// A timeout child is settled by its timer, not only by its parent: following it is
    /// no cycle (the follower should reject with timedOut after 50 ms).
    func testFollowingOwnTimeoutChildIsNoCycle() {
        let p = Promise<Int>()
        let watcher = p.then(on: .immediate) { $0 }  // p has observers
        p.resolve(with: p.then(on: .immediate) { $0 }.timeout(.milliseconds(50)))
        let r = outcome(p)
        XCTAssertFalse(isCycle(r), "false cycle: the timer would have settled it, got \(String(describing: r))")
        _ = watcher
    }

    func testRaceOverOwnTimeoutChildIsNoCycle() {
        let p = Promise<Int>()
        p.resolve(with: Promise.race([p.timeout(.milliseconds(50))]))
        let r = outcome(p)
        XCTAssertFalse(isCycle(r), "false cycle through race: got \(String(describing: r))")
    }

    func testAllOverOwnTimeoutChildIsNoCycle() {
        let p = Promise<Int>()
        p.resolve(with: Promise.all([p.timeout(.milliseconds(50)), Promise(value: 1)]).map(on: .immediate) { $0[0] })
        let r = outcome(p)
        XCTAssertFalse(isCycle(r), "false cycle through all: got \(String(describing: r))")
    }

    /// A timeout that never fires (past the hundred-year horizon: "no timeout") leaves
    /// only its parent to settle the child: following it is a cycle.
    func testFollowingANeverFiringTimeoutChildIsACycle() {
        let p = Promise<Int>()
        p.resolve(with: p.timeout(.seconds(Int64.max)))
        XCTAssertTrue(isCycle(outcome(p)))
    }

    // MARK: Cycles still found

    func testSimpleCyclesStillFound() {
        let a = Promise<Int>()
        a.resolve(with: Promise.allSettled([a]).map(on: .immediate) { _ in 0 })
        XCTAssertTrue(isCycle(outcome(a)), "allSettled([p])")

        let b = Promise<Int>()
        b.resolve(with: b.and(b.then(on: .immediate) { "\($0)" }).map(on: .immediate) { $0.0 })
        XCTAssertTrue(isCycle(outcome(b)), "and over p and p's child")

        let c = Promise<Int>()
        c.resolve(with: Promise.any([Promise(error: EdgeError(tag: 1)), c, Promise(error: EdgeError(tag: 2))]))
        XCTAssertTrue(isCycle(outcome(c)), "any with rejected others")

        let d = Promise<Int>()
        let inner = Promise.all([d.then(on: .default) { $0 }, Promise(value: 2)])
        d.resolve(with: Promise.race([inner.map(on: .immediate) { $0[0] }, d.then(on: .default) { $0 }]))
        XCTAssertTrue(isCycle(outcome(d)), "race over all(child, fulfilled) and child")
    }

    /// Stress: an input of `all` is rejected on another thread while the follower locks in:
    /// the follower must end with the rejection, never a cycle.
    func testConcurrentRejectNeverGivesCycle() {
        for round in 0..<2_000 {
            let t = Promise<Int>()
            let other = Promise<Int>()
            let o = Promise.all([t.then(on: .immediate) { $0 }, other]).map(on: .immediate) { $0[0] }
            let g = DispatchGroup()
            DispatchQueue.global().async(group: g) { other.reject(EdgeError(tag: round)) }
            t.resolve(with: o)
            g.wait()
            let r = outcome(t)
            XCTAssertFalse(isCycle(r), "round \(round)")
            if isCycle(r) { break }
        }
    }

    // MARK: retry

    /// The output settles while the run makes its pause (after its check, before the
    /// pause is recorded, when the output's hook finds no pause to cancel): the pause,
    /// the run's own, is cancelled as it starts, so the run and the output with its value
    /// go at once, not after the hour-long pause.
    func testRetryPauseStartedAfterLeaveIsCancelled() {
        let tracker = LifeTracker()
        let hook = NowHook()
        let failing = Promise<Payload>()
        weak var weakOutput: Promise<Payload>?
        do {
            let output = Promise<Payload>.retry(attempts: 3, backoff: .fixed(.seconds(3600)),
                                                clock: HookClock(hook: hook), on: .default,
                                                shouldRetry: { _ in true }) { failing }
            weakOutput = output
            let unowned = Unmanaged.passUnretained(output)
            hook.arm {
                unowned._withUnsafeGuaranteedRef { _ = $0.fulfill(Payload(bytes: [1], tracker: tracker)) }
            }
            failing.reject(EdgeError(tag: 1))  // -> pauseThenRetry -> makePause -> clock.now -> fulfil
            XCTAssertTrue(eventually(timeout: 3) { output.isFulfilled })
        }
        XCTAssertTrue(eventually(timeout: 3) { tracker.alive == 0 },
                      "the run (and its settled output) is kept for the rest of the 1-hour pause")
        XCTAssertNil(weakOutput, "output kept alive by the uncancelled pause")
    }

    /// Control: settled during the pause (after it started): let go at once.
    func testRetrySettledDuringPauseControl() {
        let tracker = LifeTracker()
        let failing = Promise<Payload>()
        do {
            let output = Promise<Payload>.retry(attempts: 3, backoff: .fixed(.seconds(3600)),
                                                clock: ContinuousClock(), on: .immediate) { failing }
            failing.reject(EdgeError(tag: 1))
            output.fulfill(Payload(bytes: [1], tracker: tracker))
        }
        XCTAssertTrue(eventually(timeout: 3) { tracker.alive == 0 })
    }

    // MARK: Fan-out

    /// The output settles from outside while the pumping thread is inside the last
    /// `next()`: the stop leaves the inputs to the pumping thread, which lets go of them on
    /// its exhausted exit too.
    func testFanOutLetsGoOfInputsWhenStoppedDuringLastNext() {
        let tracker = LifeTracker()
        let longLived = Promise<Int>()
        let trigger = Promise<Int>()
        let outBox = Box<Promise<[Int]>>()
        do {
            let seq = EndHookSequence(count: 2, payload: Payload(bytes: [1], tracker: tracker)) {
                // Another thread settles the output (its hook runs there, not deferred in
                // this thread's cascade) while this thread is inside the last next().
                let g = DispatchGroup()
                let out = outBox.value
                DispatchQueue.global().async(group: g) { _ = out?.reject(EdgeError(tag: 9)) }
                g.wait()
            }
            let output = Promise<Int>.all(seq, maxConcurrent: 2, on: .immediate) { $0 == 0 ? longLived : trigger }
            outBox.value = output
        }
        XCTAssertEqual(tracker.alive, 1)
        trigger.fulfill(1)  // complete -> pump -> next() -> onEnd rejects the output -> nil
        XCTAssertTrue(outBox.value?.isRejected ?? false)
        outBox.value = nil
        XCTAssertEqual(tracker.alive, 0, "a stopped fan-out keeps its input iterator (and sequence) while a step lives on")
        longLived.cancel()
    }

    /// A cancel of the output that lands while a step's failure stops the run (after the
    /// run took its steps, before its reject, which then loses): the cancel still reaches
    /// the step in flight, with its reason. (Placed deterministically: the work's capture,
    /// let go of as the run stops, cancels the output in its deinit; in real code, a cancel
    /// on another thread.)
    func testFanOutCancelRacingAStepFailureStillCancelsTheStepsInFlight() {
        final class CancelOnDeinit: @unchecked Sendable {
            let box: Box<Promise<[Int]>>
            init(_ box: Box<Promise<[Int]>>) { self.box = box }
            deinit { box.value?.cancel(reason: EdgeError(tag: 42)) }
        }
        let outBox = Box<Promise<[Int]>>()
        let step0 = Promise<Int>(), step1 = Promise<Int>()
        do {
            let canceller = CancelOnDeinit(outBox)
            outBox.value = Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { i in
                withExtendedLifetime(canceller) { i == 0 ? step0 : step1 }
            }
        }
        step1.reject(EdgeError(tag: 1))
        let output = outBox.value!
        XCTAssertTrue(output.isCancelled, "setup: the output should have been cancelled")
        XCTAssertTrue(step0.isCancelled, "the output was cancelled but its step in flight was not")
        outBox.value = nil
        step0.cancel()
    }

    /// The same with a plain cancel on another thread, racing a step's rejection.
    /// The same with a plain cancel on another thread, racing a step's rejection from a
    /// spinning barrier (the cancel may have claimed the output and not yet published it
    /// when the failure's reject loses).
    func testFanOutCancelRacingAStepFailureStress() {
        let rounds = 5_000
        let rows = (0..<rounds).map { _ -> (Promise<Int>, Promise<Int>, Promise<[Int]>) in
            let step0 = Promise<Int>(), step1 = Promise<Int>()
            return (step0, step1, Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { $0 == 0 ? step0 : step1 })
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            if thread == 0 { rows[round].2.cancel(reason: EdgeError(tag: round)) } else { rows[round].1.reject(EdgeError(tag: -1)) }
        })
        var missed = 0, cancelledRounds = 0
        for (step0, _, output) in rows where output.isCancelled {
            cancelledRounds += 1
            if !eventually(timeout: 1, { step0.isCancelled }) { missed += 1 }
        }
        for (step0, _, _) in rows { step0.cancel() }
        XCTAssertEqual(missed, 0, "of \(cancelledRounds) cancelled rounds")
    }
}
