import Dispatch
import Foundation
import Promise
import XCTest

private struct Reason: Error, Equatable { let tag: Int }

/// The lifetime model's promises, one test per rule: a cancel reaches every pending
/// descendant whatever made it pending, and what a promise keeps is bounded by what is
/// still needed.
final class LifetimeModelTests: XCTestCase {
    // MARK: Cancel reach has no exceptions

    /// A side branch of the leaf settled early (as `timeout`'s timer settles its child)
    /// and ran a recovery: the leaf, still queued, is reached all the same.
    func testCancelReachesAQueuedLeafWhoseSideBranchSettledEarly() {
        let queue = heldQueue()
        let root = Promise<Int>()
        let leaf = root.then(on: .immediate) { $0 + 1 }
            .then(on: .immediate) { $0 + 1 }
            .then(on: queue) { $0 + 1 }
        let side = leaf.then(on: .immediate) { $0 }
        let recovered = side.recover(on: .default) { _ in -1 }
        side.reject(Reason(tag: 1))
        XCTAssertEqual(try recovered.wait(timeout: .seconds(10)), -1)
        root.fulfill(0)
        XCTAssertTrue(leaf.isPending)
        root.cancel(reason: Reason(tag: 2))
        XCTAssertTrue(leaf.isCancelled, "the cancel reaches the queued leaf")
        queue.resume()
        XCTAssertThrowsError(try leaf.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Reason, Reason(tag: 2)) }
    }

    /// The everyday form: a timeout that fired before its receiver settled.
    func testCancelReachesAQueuedWorkStepAfterItsTimeoutFired() {
        let worker = heldQueue()
        let root = Promise<Int>()
        let work = root.then(on: .immediate) { $0 + 1 }.then(on: .immediate) { $0 + 1 }.then(on: worker) { $0 + 1 }
        let timed = work.timeout(.milliseconds(1))
        let caught = Flag()
        let handled = timed.catch(on: .default) { _ in caught.set() }
        XCTAssertThrowsError(try handled.wait(timeout: .seconds(10)))
        XCTAssertTrue(caught.isSet)
        root.fulfill(0)
        root.cancel(reason: Reason(tag: 3))
        XCTAssertTrue(work.isCancelled)
        worker.resume()
    }

    /// A child locked to another promise by `resolve(with:)` before its parent settled.
    func testCancelReachesAnImmediateChildLockedInByResolveWith() {
        for context: any ExecutionContext in [.immediate, .default] {
            let root = Promise<Int>()
            let followed = Promise<Int>()
            let child = root.then(on: context) { $0 }
            child.resolve(with: followed)
            root.fulfill(1)
            root.cancel(reason: Reason(tag: 4))
            followed.fulfill(2)
            XCTAssertThrowsError(try child.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Reason, Reason(tag: 4)) }
            XCTAssertTrue(child.isCancelled)
            XCTAssertTrue(followed.isFulfilled, "resolve(with:) does not own its argument")
        }
    }

    /// The same child one inline step below the cancelled root, nobody holding the step.
    func testCancelReachesALockedInChildBelowAStepNobodyHolds() {
        let root = Promise<Int>()
        let followed = Promise<Int>()
        let child = root.then(on: .immediate) { $0 + 1 }.then(on: .immediate) { $0 }
        child.resolve(with: followed)
        root.fulfill(1)
        root.cancel(reason: Reason(tag: 5))
        followed.fulfill(2)
        XCTAssertTrue(child.isCancelled)
    }

    // MARK: Follow chains are linear

    /// A handler returning the pending promise of the level below, built inner-first
    /// (Promises/A+ 2.3.2 nesting): each link costs O(1), not the chain's length.
    func testInnerFirstNestingIsLinear() {
        let levels = 100_000
        let innermost = Promise<Int>()
        var below = innermost
        let start = Date()
        defer { innermost.cancel() }
        for _ in 0..<levels {
            let level = below
            below = Promise(value: 0).then(on: .immediate) { _ in level }
        }
        innermost.fulfill(7)
        XCTAssertEqual(below.state, .fulfilled)
        XCTAssertEqual(try below.wait(timeout: .seconds(10)), 7)
        // Generous for a debug build under a sanitizer; quadratic took minutes.
        XCTAssertLessThan(Date().timeIntervalSince(start), 60)
    }

    /// The cycle check still sees a cycle closed at the far end of a long chain.
    func testCycleAtTheEndOfALongFollowChainIsSeen() {
        let innermost = Promise<Int>()
        var below = innermost
        for _ in 0..<1_000 {
            let level = below
            below = Promise(value: 0).then(on: .immediate) { _ in level }
        }
        innermost.resolve(with: below)
        XCTAssertThrowsError(try below.wait(timeout: .seconds(10))) {
            guard case PromiseError.cycle? = $0 as? PromiseError else { return XCTFail("expected a cycle, got \($0)") }
        }
        XCTAssertTrue(innermost.isRejected)
    }

    // MARK: Memory is bounded by what is still needed

    /// `race([work, shutdown])` in a loop: a settled race that nobody holds keeps none of
    /// its inputs' values while `shutdown` stays pending.
    func testSettledRaceKeepsNoInputValueWhileAnotherInputIsPending() {
        let tracker = LifeTracker()
        let shutdown = Promise<Payload>()
        for _ in 0..<100 {
            let work = Promise<Payload>()
            let race = Promise.race([work, shutdown])
            work.fulfill(Payload(bytes: [1], tracker: tracker))
            XCTAssertTrue(race.isFulfilled)
        }
        XCTAssertEqual(tracker.alive, 0, "no work value is kept by a race that nobody holds")
        shutdown.cancel()
    }

    /// The same for `all` rejected early, `any`, `allSettled` and `and`.
    func testSettledCombinatorsKeepNoInputValueWhileAnotherInputIsPending() {
        let tracker = LifeTracker()
        let pending = Promise<Payload>()
        for _ in 0..<20 {
            let first = Promise<Payload>(), failed = Promise<Payload>()
            let all = Promise.all([first, failed, pending])
            first.fulfill(Payload(bytes: [1], tracker: tracker))
            failed.reject(Reason(tag: 6))
            XCTAssertTrue(all.isRejected)

            let anyInput = Promise<Payload>()
            let any = Promise.any([anyInput, pending])
            anyInput.fulfill(Payload(bytes: [2], tracker: tracker))
            XCTAssertTrue(any.isFulfilled)

            let pair = Promise<Payload>()
            let both = pair.and(Promise<Int>(error: Reason(tag: 7)))
            pair.fulfill(Payload(bytes: [3], tracker: tracker))
            XCTAssertTrue(both.isRejected)
        }
        XCTAssertEqual(tracker.alive, 0)
        pending.cancel()
    }
}

/// The largest number recorded, from any thread.
private final class Peak: @unchecked Sendable {
    private let lock = NSLock()
    private var largest = 0

    func record(_ value: Int) {
        lock.lock(); defer { lock.unlock() }
        largest = max(largest, value)
    }

    var maximum: Int {
        lock.lock(); defer { lock.unlock() }
        return largest
    }
}
