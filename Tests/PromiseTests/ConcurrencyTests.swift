import Dispatch
import XCTest
import Promise

private struct Boom: Error, Equatable {}

/// Tells whether an await gave up the actor: a job queued on it before the await can run
/// only if the await suspends and lets the actor go.
private actor InterleavingProbe {
    private var interleaved = false
    private func mark() { interleaved = true }

    func valueInterleaves(_ promise: Promise<Int>) async throws -> (Int, Bool) {
        interleaved = false
        Task { self.mark() }
        let value = try await promise.value
        return (value, interleaved)
    }

    func resultInterleaves(_ promise: Promise<Int>) async -> Bool {
        interleaved = false
        Task { self.mark() }
        _ = await promise.result
        return interleaved
    }
}

final class ConcurrencyTests: XCTestCase {
    func testAwaitValueOfSettledPromiseReturnsWithoutSuspending() async throws {
        let value = try await Promise(value: 7).value
        XCTAssertEqual(value, 7)
    }

    /// From an actor too: the getters run on the caller's executor, so an awaiting actor
    /// is not given up (they hopped to the generic executor and back, letting a job queued
    /// on the actor run in between; found by an adversarial pass).
    func testAwaitingASettledPromiseFromAnActorKeepsTheActor() async throws {
        let probe = InterleavingProbe()
        let settled = Promise(value: 7)
        for _ in 0..<20 {
            let (value, interleaved) = try await probe.valueInterleaves(settled)
            XCTAssertEqual(value, 7)
            XCTAssertFalse(interleaved, "await of a settled promise's value gave up the actor")
            let resultInterleaved = await probe.resultInterleaves(settled)
            XCTAssertFalse(resultInterleaved, "await of a settled promise's result gave up the actor")
        }
    }

    func testAwaitValueOfPendingPromiseSettledFromAnotherThread() async throws {
        let promise = Promise<Int>()
        DispatchQueue.global().async { promise.fulfill(42) }
        let value = try await promise.value
        XCTAssertEqual(value, 42)
    }

    /// A promise whose settling side drops it breaks what waits on it through a derived
    /// promise (which does not hold it): the await throws `brokenPromise`. (An await on
    /// the promise itself holds it, so it cannot die under that await: the documented way
    /// is to await a derived one.)
    func testAwaitingADerivedPromiseOfADroppedOneThrowsBrokenPromise() async {
        func lookup() -> Promise<Int> {
            let promise = Promise<Int>()
            let callback: @Sendable (Int) -> Void = { promise.fulfill($0) }
            _ = callback  // the callback API drops it unanswered
            return promise
        }
        do {
            _ = try await lookup().then { $0 }.value
            XCTFail("a derived promise of a dropped one fulfilled")
        } catch PromiseError.brokenPromise {
        } catch {
            XCTFail("\(error)")
        }
    }

    func testAwaitValueThrowsTheRejection() async {
        let promise = Promise<Int>()
        DispatchQueue.global().async { promise.reject(Boom()) }
        do {
            _ = try await promise.value
            XCTFail("expected a throw")
        } catch {
            XCTAssertEqual(error as? Boom, Boom())
        }
    }

    func testAwaitResultOfCancelledPromiseIsCancellationFailure() async {
        let promise = Promise<Int>()
        promise.cancel()
        let result = await promise.result
        guard case .failure(let error) = result else { return XCTFail("expected failure, got \(result)") }
        XCTAssertTrue(error is CancellationError)
    }

    func testCancellingTheAwaitingTaskCancelsOnlyTheWaiter() async throws {
        let promise = Promise<Int>()
        let waiting = Promise<Void>()
        let waiter = Task {
            waiting.fulfill(())
            return try await promise.value
        }
        try await waiting.value
        waiter.cancel()
        do {
            _ = try await waiter.value
            XCTFail("the cancelled waiter should throw")
        } catch {
            XCTAssertTrue(error is CancellationError, "got \(error)")
        }
        XCTAssertTrue(promise.isPending, "the awaited promise must be untouched")
        promise.fulfill(1)
        let later = try await promise.value
        XCTAssertEqual(later, 1)
    }

    func testAwaitInATaskCancelledBeforeTheAwaitThrowsAtOnceAndLeavesThePromiseAlone() async {
        let promise = Promise<Int>()
        let gate = DispatchSemaphore(value: 0)
        let waiter = Task.detached {
            gate.wait()  // the Task is cancelled before it awaits
            return await promise.result
        }
        waiter.cancel()
        gate.signal()
        let result = await waiter.value
        guard case .failure(let error) = result else { return XCTFail("got \(result)") }
        XCTAssertTrue(error is CancellationError, "got \(error)")
        XCTAssertTrue(promise.isPending, "the awaited promise must be untouched")
        promise.fulfill(3)
        let value = try? await promise.value
        XCTAssertEqual(value, 3, "later awaits still see the outcome")
    }

    func testWaitersRacingTheirCancellationAndTheSettleResumeExactlyOnce() async {
        // Each waiter gets the value or CancellationError, once (a second resume of a
        // continuation would trap); none hangs.
        for round in 0..<200 {
            let promise = Promise<Int>()
            let waiters = (0..<4).map { _ in Task.detached { await promise.result } }
            let settler = Task.detached { _ = promise.fulfill(round) }
            for (index, waiter) in waiters.enumerated() where index % 2 == 0 { waiter.cancel() }
            await settler.value
            for (index, waiter) in waiters.enumerated() {
                switch await waiter.value {
                case .success(let value):
                    XCTAssertEqual(value, round)
                case .failure(let error):
                    XCTAssertTrue(index % 2 == 0, "only cancelled waiters may fail")
                    XCTAssertTrue(error is CancellationError, "got \(error)")
                }
            }
            XCTAssertTrue(promise.isFulfilled)
        }
    }

    func testAsyncInitialiserFulfilsWithTheTaskResult() async throws {
        let promise = Promise<String> { "from a task" }
        let value = try await promise.value
        XCTAssertEqual(value, "from a task")
    }

    func testAsyncInitialiserRejectsWhenTheTaskThrows() {
        let promise = Promise<Int> { throw Boom() }
        XCTAssertThrowsError(try promise.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Boom, Boom()) }
    }

    func testCancellingTheAsyncPromiseCancelsItsTask() throws {
        let started = Promise<Void>()
        let sawCancellation = Promise<Bool>()
        let promise = Promise<Int> {
            started.fulfill(())
            do {
                try await Task.sleep(for: .seconds(30))
                sawCancellation.fulfill(false)
            } catch {
                sawCancellation.fulfill(error is CancellationError)
            }
            return 0
        }
        try started.wait(timeout: .seconds(10))
        promise.cancel()
        XCTAssertTrue(promise.isCancelled)
        XCTAssertTrue(try sawCancellation.wait(timeout: .seconds(10)), "the Task saw no cancellation")
    }
}
