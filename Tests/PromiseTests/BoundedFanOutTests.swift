// Bounded fan-out: `Promise.all(_:maxConcurrent:on:_:)` keeps at most n works in flight,
// returns values in input order, stops and cancels on the first error, and pulls its
// inputs lazily.
import Dispatch
import Foundation
import Promise
import XCTest

private struct Boom: Error, Equatable { let input: Int }

/// A sequence that counts how many elements were pulled from it.
private struct CountedInputs: Sequence {
    let count: Int
    let pulled: Counter

    func makeIterator() -> AnyIterator<Int> {
        var next = 0
        return AnyIterator { [pulled, count] in
            guard next < count else { return nil }
            pulled.increment()
            defer { next += 1 }
            return next
        }
    }
}

final class BoundedFanOutTests: XCTestCase {
    func testAtMostNInFlightAndValuesInInputOrder() throws {
        let works = Recorder<(input: Int, promise: Promise<Int>)>()
        let output = Promise<Int>.all(Array(0..<10), maxConcurrent: 3, on: .immediate) { input in
            let promise = Promise<Int>()
            works.append((input, promise))
            return promise
        }
        XCTAssertEqual(works.values.map(\.input), [0, 1, 2], "only maxConcurrent works may start")
        // Finish them out of order: each completion starts exactly one more.
        works.values[2].promise.fulfill(20)
        XCTAssertEqual(works.values.count, 4)
        works.values[0].promise.fulfill(0)
        works.values[1].promise.fulfill(10)
        XCTAssertEqual(works.values.count, 6)
        var next = 3
        while next < 10 {
            works.values[next].promise.fulfill(next * 10)
            next += 1
        }
        XCTAssertEqual(try output.wait(timeout: testTimeout), (0..<10).map { $0 * 10 })
        XCTAssertEqual(works.values.count, 10)
    }

    func testTheFirstErrorRejectsCancelsWhatIsInFlightAndStartsNothingMore() throws {
        let works = Recorder<Promise<Int>>()
        let output = Promise<Int>.all(Array(0..<10), maxConcurrent: 3, on: .immediate) { _ in
            let promise = Promise<Int>()
            works.append(promise)
            return promise
        }
        works.values[1].reject(Boom(input: 1))
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) { XCTAssertEqual($0 as? Boom, Boom(input: 1)) }
        XCTAssertTrue(works.values[0].isCancelled, "a work in flight was not cancelled")
        XCTAssertTrue(works.values[2].isCancelled, "a work in flight was not cancelled")
        XCTAssertEqual(works.values.count, 3, "a work started after the first error")
    }

    func testAThrowingWorkRejectsTheResult() {
        let held = Recorder<Promise<Int>>()  // a work promise dropped pending would break first
        let output = Promise<Int>.all([1, 2, 3], maxConcurrent: 2, on: .immediate) { input -> Promise<Int> in
            if input == 2 { throw Boom(input: 2) }
            let promise = Promise<Int>()
            held.append(promise)
            return promise
        }
        XCTAssertThrowsError(try output.wait(timeout: testTimeout)) { XCTAssertEqual($0 as? Boom, Boom(input: 2)) }
        XCTAssertTrue(held.values[0].isCancelled, "the work in flight was not cancelled")
        XCTAssertEqual(held.count, 1, "a work started after the first error")
    }

    func testCancellingTheResultCancelsTheWorkInFlightWithItsReason() {
        struct Shutdown: Error {}
        let pulled = Counter()
        let works = Recorder<Promise<Int>>()
        let output = Promise<Int>.all(CountedInputs(count: 100, pulled: pulled), maxConcurrent: 4, on: .immediate) { _ in
            let promise = Promise<Int>()
            works.append(promise)
            return promise
        }
        output.cancel(reason: Shutdown())
        XCTAssertEqual(works.values.count, 4)
        for work in works.values {
            XCTAssertTrue(work.isCancelled)
            XCTAssertThrowsError(try work.wait(timeout: testTimeout)) { XCTAssertTrue($0 is Shutdown) }
        }
        works.values[0].fulfill(1)  // ignored: cancelled
        XCTAssertEqual(pulled.value, 4, "inputs were pulled after the cancel")
    }

    func testInputsArePulledLazilyAsSlotsFreeUp() throws {
        let pulled = Counter()
        let works = Recorder<Promise<Int>>()
        let output = Promise<Int>.all(CountedInputs(count: 1000, pulled: pulled), maxConcurrent: 5, on: .immediate) { input in
            let promise = Promise<Int>()
            works.append(promise)
            return promise
        }
        XCTAssertEqual(pulled.value, 5, "inputs were pulled ahead of free slots")
        works.values[0].fulfill(0)
        XCTAssertEqual(pulled.value, 6)
        var index = 1
        while index < works.values.count {
            works.values[index].fulfill(index)
            index += 1
        }
        XCTAssertEqual(try output.wait(timeout: testTimeout), Array(0..<1000))
        XCTAssertEqual(pulled.value, 1000)
    }

    func testALazyMillionInputsSettledInlineNeitherRecursesNorMaterialises() throws {
        let count = deepLevels(1_000_000)
        let inputs = (0..<count).lazy.map { $0 * 2 }
        let output = Promise<Int>.all(inputs, maxConcurrent: 4, on: .immediate) { Promise(value: $0 + 1) }
        let values = try output.wait(timeout: .seconds(60))
        XCTAssertEqual(values.count, count)
        XCTAssertEqual(values.first, 1)
        XCTAssertEqual(values.last, 2 * count - 1)
    }

    func testAFinishedWorkIsNotKeptByTheRun() throws {
        let finishedWork = WeakPromise()
        let second = Promise<Int>()
        let output = Promise<Int>.all([1, 2], maxConcurrent: 1, on: .immediate) { input -> Promise<Int> in
            if input == 2 { return second }
            let work = Promise<Int>()
            finishedWork.promise = work
            work.fulfill(1)
            return work
        }
        XCTAssertNil(finishedWork.promise, "a finished work was kept while the run goes on")
        XCTAssertTrue(output.isPending)
        second.fulfill(2)
        XCTAssertEqual(try output.wait(timeout: testTimeout), [1, 2])
    }

    func testOnAQueueNoMoreThanNRunAtOnce() throws {
        let tracker = ConcurrencyTracker()
        let output = Promise<Int>.all(Array(0..<40), maxConcurrent: 3, on: .default) { input in
            Promise(on: .default) {
                tracker.enter()
                defer { tracker.leave() }
                busyWork(microseconds: 300)
                return input
            }
        }
        XCTAssertEqual(try output.wait(timeout: testTimeout), Array(0..<40))
        XCTAssertLessThanOrEqual(tracker.maxConcurrency, 3)
        XCTAssertEqual(tracker.entries, 40)
    }

    func testMaxConcurrentBelowOneRejectsWithASentenceAndCallsNothing() {
        let calls = Counter()
        for limit in [0, -3] {
            let output = Promise<Int>.all([1, 2], maxConcurrent: limit) { calls.increment(); return Promise(value: $0) }
            XCTAssertThrowsError(try output.wait(timeout: testTimeout)) {
                XCTAssertEqual(String(describing: $0),
                               "invalid argument: Promise.all needs a maxConcurrent of at least 1, and was given \(limit)")
            }
        }
        XCTAssertEqual(calls.value, 0)
    }

    func testNoInputsFulfilsAtOnceWithNothing() throws {
        let output = Promise<Int>.all([Int](), maxConcurrent: 2) { Promise(value: $0) }
        XCTAssertEqual(try output.wait(timeout: testTimeout), [])
    }

    /// A step that `work` returns after the result was cancelled is cancelled with the
    /// cancel's reason, as the steps in flight are; for `sequence` too.
    func testAStepReturnedAfterTheCancelTakesItsReason() throws {
        for oneAtATime in [false, true] {
            let entered = DispatchSemaphore(value: 0)
            let gate = DispatchSemaphore(value: 0)
            let step = Promise<Int>()
            let work: @Sendable (Int) -> Promise<Int> = { _ in
                entered.signal()
                gate.wait()
                return step
            }
            let output = oneAtATime
                ? Promise<Int>.sequence([1], work)
                : Promise<Int>.all([1], maxConcurrent: 1, on: .default, work)
            XCTAssertEqual(entered.wait(timeout: .now() + testTimeoutSeconds), .success)
            output.cancel(reason: Boom(input: 42))
            gate.signal()
            XCTAssertThrowsError(try step.wait(timeout: testTimeout)) { XCTAssertEqual($0 as? Boom, Boom(input: 42)) }
            XCTAssertTrue(step.isCancelled)
        }
    }

    /// A context that drops the work unrun leaves nothing to go on with the run: it is
    /// freed (no cycle between the output and the run; the run breaks its output on a
    /// lane of the library's own, which lets go of it a moment later), and an output
    /// still held is rejected with `brokenPromise` rather than left pending for ever.
    func testARunWhoseContextDropsItsWorkIsFreedAndBreaksItsOutput() throws {
        let gone = WeakPromise()
        do {
            let output = Promise<Int>.all([1, 2], maxConcurrent: 1, on: DroppingContext()) { Promise(value: $0) }
            gone.promise = output
        }
        XCTAssertTrue(eventually { gone.promise == nil }, "the run and its output keep each other")
        let held = Promise<Int>.sequence(on: DroppingContext(), [1, 2]) { Promise(value: $0) }
        XCTAssertThrowsError(try held.wait(timeout: testTimeout)) { error in
            guard case PromiseError.brokenPromise = error else { return XCTFail("\(error)") }
        }
    }

    /// Two at a time over 100 counted inputs, each work a pending step kept in `steps`.
    private func fanOutOverPendingSteps() -> (Promise<[Int]>, Counter, Recorder<Promise<Int>>) {
        let pulled = Counter()
        let steps = Recorder<Promise<Int>>()
        let output = Promise<Int>.all(CountedInputs(count: 100, pulled: pulled), maxConcurrent: 2, on: .immediate) { _ in
            let step = Promise<Int>()
            steps.append(step)
            return step
        }
        return (output, pulled, steps)
    }

    /// Locked in to follow another promise, the output can take nothing from the run: no
    /// more input is pulled for it.
    func testALockInStopsThePulling() {
        let (output, pulled, steps) = fanOutOverPendingSteps()
        let elsewhere = Promise<[Int]>()
        output.resolve(with: elsewhere)
        steps.values[0].fulfill(1)
        steps.values[1].fulfill(2)
        XCTAssertEqual(pulled.value, 2, "inputs pulled for an output that follows another promise")
        elsewhere.fulfill([7])
        XCTAssertEqual(value(output), [7])
    }

    /// Settled from outside, the output stops the pulling: no input is pulled for it.
    func testAnOutsideSettleStopsThePulling() {
        let (output, pulled, steps) = fanOutOverPendingSteps()
        XCTAssertEqual(pulled.value, 2)
        output.reject(Boom(input: 60))
        steps.values[0].fulfill(1)
        steps.values[1].fulfill(2)
        XCTAssertEqual(pulled.value, 2, "inputs pulled after the output settled")
        XCTAssertEqual(steps.count, 2)
    }
}

extension BoundedFanOutTests {
    /// A context that drops a step's work while another step is in flight breaks the run
    /// then, as a first error does: the output rejects with `brokenPromise`, the step in
    /// flight is cancelled and no more inputs start. The other step must not keep the
    /// output waiting (for ever, if it never settles).
    func testAStepItsContextDropsBreaksTheRunWhileAnotherIsInFlight() {
        let pending = Promise<Int>()
        let started = Recorder<Int>()
        let context = DropsNth(3)
        let output = Promise<Int>.all(0..<6, maxConcurrent: 2, on: context) { input in
            started.append(input)
            return input == 0 ? pending : Promise(value: input)
        }
        let result = outcome(output, timeout: 5)
        XCTAssertTrue(isPromiseError(result, .brokenPromise), "\(String(describing: result)), steps started: \(started.values)")
        // Cancelled right after the output rejects, by the thread that rejected it.
        XCTAssertTrue(eventually { pending.isCancelled }, "the step in flight was not cancelled: \(pending)")
        XCTAssertEqual(started.values.sorted(), [0, 1], "inputs started after the dropped one")
    }
}
