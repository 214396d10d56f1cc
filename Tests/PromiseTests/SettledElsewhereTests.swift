import Dispatch
import Foundation
import XCTest
@testable import Promise

/// A promise settled by someone other than the code that usually settles it (a cancel it
/// takes on from a promise it follows, its holder fulfilling a promise whose Task or
/// context work is still to come): what it lets go of, and what still runs.
final class SettledElsewhereTests: XCTestCase {
    private let bound = 2 * RareState.minimumGaveUpBeforePrune

    /// A child that follows a promise and takes on its cancel never takes an outcome from
    /// its parent: it leaves a long-lived parent, as a child cancelled directly does,
    /// on every context and under a root or a derived parent.
    func testChildrenAdoptingACancelLeaveALongLivedParent() {
        let contexts: [any ExecutionContext] = [.immediate, .default, DispatchQueue(label: "adopted cancel")]
        for context in contexts {
            let root = Promise<Int>()
            let derived = root.then(on: .immediate) { $0 }
            for longLived in [root, derived] {
                let tracker = LifeTracker()
                for _ in 0..<2_000 {
                    let captured = Payload(bytes: [1], tracker: tracker)
                    let child = longLived.then(on: context) { $0 + captured.bytes.count }
                    let followed = Promise<Int>()
                    child.resolve(with: followed)
                    followed.cancel()
                    XCTAssertTrue(child.isCancelled)
                }
                XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, bound,
                                         "\(type(of: context)): children that adopted a cancel stay registered")
                XCTAssertLessThanOrEqual(tracker.alive, bound,
                                         "\(type(of: context)): their handlers' captures stay alive")
                XCTAssertTrue(longLived.isPending)
            }
            root.cancel()
        }
    }

    /// The same when the followed promise was cancelled before the lock-in, and through a
    /// chain of follows.
    func testChildrenFollowingCancelledPromisesLeaveALongLivedParent() {
        let longLived = Promise<Int>()
        let tracker = LifeTracker()
        for round in 0..<2_000 {
            let captured = Payload(bytes: [1], tracker: tracker)
            let child = longLived.then(on: .immediate) { $0 + captured.bytes.count }
            if round.isMultiple(of: 2) {
                let cancelled = Promise<Int>()
                cancelled.cancel()
                child.resolve(with: cancelled)
            } else {
                let first = Promise<Int>(), second = Promise<Int>()
                child.resolve(with: first)
                first.resolve(with: second)
                second.cancel()
            }
            XCTAssertTrue(child.isCancelled)
        }
        XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, bound)
        XCTAssertLessThanOrEqual(tracker.alive, bound)
        longLived.cancel()
    }

    /// A Task-backed promise that its holder settles first cancels its Task: the Task,
    /// waiting on a long-lived promise, would otherwise keep the promise, its value and a
    /// waiter on the long-lived one until that settles.
    func testATaskBackedPromiseSettledByItsHolderLetsGoOfItsTask() {
        let longLived = Promise<Int>()
        let tracker = LifeTracker()
        for _ in 0..<2_000 {
            let promise = Promise<Payload> {
                _ = try await longLived.value
                return Payload(bytes: [], tracker: tracker)
            }
            promise.fulfill(Payload(bytes: [1], tracker: tracker))
        }
        XCTAssertTrue(eventually { tracker.alive == 0 },
                      "settled promises nobody holds keep their values: \(tracker.alive) alive")
        XCTAssertTrue(eventually { (longLived.existingRareState?.waitingCount ?? 0) == 0 },
                      "their Tasks still wait on the long-lived promise")
        XCTAssertTrue(longLived.isPending)
        longLived.cancel()
    }

    /// The Task's own settle still stands, and a rejection nobody reads is still reported:
    /// the hook that cancels the Task is no reader of the promise's error.
    func testATaskBackedPromiseStillSettlesByItsTaskAndReportsUnreadErrors() throws {
        XCTAssertEqual(try Promise<Int> { 7 }.wait(timeout: .seconds(testTimeoutSeconds)), 7)
        let events = Recorder<PromiseDiagnostic>()
        PromiseDiagnostics.setHandler { events.append($0) }
        defer { PromiseDiagnostics.setHandler(nil) }
        do { _ = Promise<Int> { throw TestError(41) } }
        XCTAssertTrue(eventually {
            events.values.contains {
                if case .unhandledRejection(let error) = $0.kind { return (error as? TestError)?.id == 41 }
                return false
            }
        }, "a Task-backed rejection nobody reads must still be reported")
    }

    /// The Task's own settle does not cancel it: the `.immediate` handlers its settle runs
    /// run inside it, and a cancellable one (`Task.checkCancellation`) must not fail.
    func testATaskBackedPromiseSettledByItsTaskDoesNotCancelIt() throws {
        let gate = Promise<Void>()
        let promise = Promise<Int> { try await gate.value; return 1 }
        let cancelledInside = Recorder<Bool>()
        promise.whenComplete(on: .immediate) { _ in cancelledInside.append(Task.isCancelled) }
        let parsed = promise.then(on: .immediate) { value -> Int in
            try Task.checkCancellation()
            return value + 1
        }
        gate.fulfill(())
        XCTAssertEqual(try parsed.wait(timeout: .seconds(testTimeoutSeconds)), 2)
        XCTAssertEqual(cancelledInside.values, [false])
    }

    /// `Promise(on:)` skips its work only for a cancel; a promise its holder settled first
    /// still runs the work, whose result is ignored.
    func testPromiseOnAContextRunsItsWorkUnlessCancelled() throws {
        let queue = heldQueue()
        let ran = Counter()
        let fulfilled = Promise<Int>(on: queue) { ran.increment(); return 1 }
        XCTAssertTrue(fulfilled.fulfill(2))
        let cancelled = Promise<Int>(on: queue) { ran.increment(); return 1 }
        cancelled.cancel()
        queue.resume()
        queue.sync {}
        XCTAssertEqual(try fulfilled.wait(), 2, "the holder's value stands")
        XCTAssertEqual(ran.value, 1, "the fulfilled promise's work runs; the cancelled one's does not")
    }
}
