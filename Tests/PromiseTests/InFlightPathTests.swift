import Dispatch
import Foundation
import Promise
import XCTest

private struct Reason: Error, Equatable { let tag: Int }

/// A descendant still in flight (a handler queued on a context, a follower, a child handed
/// off to be settled later, a handler running inline) keeps the settled promises on its
/// path up alive, although nobody else holds them: a cancel of an ancestor that somebody
/// holds reaches it through them. Once nothing below them is in flight, they go.
final class InFlightPathTests: XCTestCase {
    func testCancelOfTheRootReachesAFollowerBelowAStepNobodyHolds() {
        let root = Promise<Int>()
        let work = Promise<Int>()
        let follower = root.map(on: .immediate) { $0 + 1 }.flatMap(on: .immediate) { _ in work }
        root.fulfill(1)
        XCTAssertTrue(follower.isPending)
        XCTAssertNotNil(follower.parent, "a follower in flight keeps its settled parent")
        XCTAssertTrue(follower.root === root)
        root.cancel(reason: Reason(tag: 1))
        XCTAssertTrue(follower.isCancelled)
        XCTAssertTrue(work.isCancelled, "the cancel reaches the work the follower owns")
        XCTAssertThrowsError(try follower.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Reason, Reason(tag: 1)) }
    }

    func testCancelOfTheRootReachesADelayBelowAStepNobodyHolds() {
        let root = Promise<Int>()
        let delayed = root.map(on: .immediate) { $0 + 1 }.delay(.seconds(30))
        root.fulfill(1)
        XCTAssertTrue(delayed.isPending)
        root.cancel()
        XCTAssertTrue(delayed.isCancelled)
    }

    func testCancelOfTheRootReachesAQueuedLeafThreeInlineStepsDown() {
        let queue = heldQueue()
        let root = Promise<Int>()
        let leaf = root.then(on: .immediate) { $0 + 1 }
            .then(on: .immediate) { $0 + 1 }
            .then(on: .immediate) { $0 + 1 }
            .then(on: queue) { $0 }
        root.fulfill(0)
        XCTAssertTrue(leaf.isPending)
        root.cancel(reason: Reason(tag: 2))
        XCTAssertTrue(leaf.isCancelled)
        queue.resume()
    }

    func testCancelOfTheRootReachesTheQueuedLeafOfAQueuedChain() {
        let running = DispatchQueue(label: "running")
        let held = heldQueue()
        let root = Promise<Int>()
        let leaf = root.then(on: running) { $0 + 1 }
            .then(on: running) { $0 + 1 }
            .then(on: running) { $0 + 1 }
            .then(on: held) { $0 }
        root.fulfill(0)
        // The leaf's handler is queued once its parent settled; the parent stays alive
        // for it (it is in flight), so `parent` shows when that happened.
        XCTAssertTrue(eventually { leaf.parent?.isFulfilled == true })
        XCTAssertTrue(leaf.root === root, "the path up is alive while the leaf is in flight")
        root.cancel(reason: Reason(tag: 3))
        XCTAssertTrue(leaf.isCancelled)
        held.resume()
    }

    func testCancelOfAPendingRootReachesTheQueuedLeafOfADeepInlineChain() {
        let queue = heldQueue()
        let root = Promise<Int>()
        var last = root.then(on: .immediate) { $0 + 1 }
        for _ in 1..<100_000 { last = last.then(on: .immediate) { $0 + 1 } }
        let leaf = last.then(on: queue) { $0 }
        last = Promise(value: 0)  // only the root and the leaf are held from here
        root.fulfill(0)
        XCTAssertTrue(leaf.isPending)
        root.cancel()
        XCTAssertTrue(leaf.isCancelled, "reached through 100,000 registries, iteratively")
        queue.resume()
    }

    /// A handler running inline, in the cascade of one settling call, while an ancestor
    /// that somebody holds is cancelled: the cancel wins over the handler's result, although
    /// nobody holds the steps in between (the cascade keeps them until it ends).
    func testACancelDuringAnInlineCascadeReachesTheRunningHandlersChild() {
        let top = Promise<Int>()
        let done = Promise<Int>()
        let last = top.then(on: .immediate) { $0 + 1 }
            .then(on: .immediate) { $0 + 1 }
            .then(on: .immediate) { $0 + 1 }
            .then(on: .immediate) { value -> Int in
                top.cancel(reason: Reason(tag: 4))  // as if from another thread, right now
                return value
            }
        last.whenComplete(on: .immediate) { done.resolve($0) }
        top.fulfill(0)
        XCTAssertTrue(last.isCancelled)
        XCTAssertThrowsError(try done.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Reason, Reason(tag: 4)) }
    }

    func testTheStepsAboveALeafGoOnceItIsNoLongerInFlight() {
        let queue = heldQueue()
        let root = Promise<Int>()
        let first = WeakPromise(), second = WeakPromise()
        let leaf: Promise<Int>
        do {
            let a = root.then(on: .immediate) { $0 + 1 }
            let b = a.then(on: .immediate) { $0 + 1 }
            first.promise = a
            second.promise = b
            leaf = b.then(on: queue) { $0 }
        }
        root.fulfill(0)
        XCTAssertNotNil(first.promise, "kept while the leaf is in flight")
        XCTAssertNotNil(second.promise)
        queue.resume()
        XCTAssertEqual(try leaf.wait(timeout: .seconds(10)), 2)
        XCTAssertTrue(eventually { first.promise == nil && second.promise == nil },
                      "a settled leaf keeps nothing above it")
        XCTAssertNil(leaf.parent)
    }

    func testAFollowerThatSettlesLetsItsPathGo() throws {
        let root = Promise<Int>()
        let work = Promise<Int>()
        let middle = WeakPromise()
        let follower: Promise<Int>
        do {
            let step = root.map(on: .immediate) { $0 + 1 }
            middle.promise = step
            follower = step.flatMap(on: .immediate) { _ in work }
        }
        root.fulfill(1)
        XCTAssertNotNil(middle.promise)
        work.fulfill(7)
        XCTAssertEqual(try follower.wait(timeout: .seconds(10)), 7)
        XCTAssertNil(middle.promise)
    }

    func testADroppedInFlightChildLetsItsPathGo() {
        let root = Promise<Int>()
        let middle = WeakPromise()
        let sink = DroppingContext()
        do {
            let step = root.map(on: .immediate) { $0 + 1 }
            middle.promise = step
            _ = step.then(on: sink) { $0 }  // its handler is dropped by the context, unrun
        }
        root.fulfill(1)
        // The child breaks a moment later, on a lane of the library's (the context let go
        // of its work), and then dies: it holds nothing any more.
        XCTAssertTrue(eventually { middle.promise == nil }, "a child that died in flight holds its path")
    }
}
