import CPromiseCore
import Dispatch
import Foundation
import XCTest
@testable import Promise

private struct Reason: Error, Equatable { let tag: Int }

/// A thread-safe counter for handlers (tests may lock; the library may not).
private final class TreeCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func bump() { lock.lock(); count += 1; lock.unlock() }
    var value: Int { lock.lock(); defer { lock.unlock() }; return count }
}

final class CancellationTreeTests: XCTestCase {
    func testCancelAfterFulfilReachesChildWhoseHandlerIsStillQueued() {
        let queue = heldQueue()
        let ran = TreeCounter()
        let parent = Promise(value: 1)
        let child = parent.then(on: queue) { _ in ran.bump() }
        parent.cancel(reason: Reason(tag: 1))
        XCTAssertTrue(child.isCancelled)
        XCTAssertTrue(parent.isFulfilled, "a settled promise stays as it was")
        queue.resume()
        queue.sync {}
        XCTAssertEqual(ran.value, 0, "the success handler must not run after its child was cancelled")
        XCTAssertThrowsError(try child.wait()) { XCTAssertEqual($0 as? Reason, Reason(tag: 1)) }
    }

    func testCancelAfterFulfilReachesChildFollowingTheReturnedPromise() {
        let parent = Promise(value: 1)
        let inner = Promise<Int>()
        let child = parent.then(on: .immediate) { _ in inner }
        XCTAssertTrue(child.isPending)
        parent.cancel(reason: Reason(tag: 2))
        XCTAssertTrue(child.isCancelled)
        XCTAssertTrue(inner.isCancelled, "the returned promise is work the child owns")
        XCTAssertTrue(parent.isFulfilled)
    }

    func testCancelReachesGrandchildThroughASettledChild() {
        let queue = heldQueue()
        let parent = Promise(value: 1)
        let child = parent.then(on: .immediate) { $0 + 1 }
        XCTAssertTrue(child.isFulfilled)
        let grandchild = child.then(on: queue) { $0 + 1 }
        parent.cancel()
        XCTAssertTrue(grandchild.isCancelled)
        XCTAssertTrue(child.isFulfilled)
        queue.resume()
        queue.sync {}
        XCTAssertTrue(grandchild.isCancelled)
    }

    /// A `.immediate` handler blocked on another thread until the test lets it go: the
    /// child it settles is pending, in no registry, while a cancel of an ancestor runs.
    private final class HeldHandler: @unchecked Sendable {
        let entered = DispatchSemaphore(value: 0)
        let proceed = DispatchSemaphore(value: 0)
        func hold() { entered.signal(); proceed.wait() }
    }

    func testCancelOfTheSettledParentWinsOverAnImmediateHandlerAlreadyRunning() {
        let held = HeldHandler()
        let parent = Promise<Int>()
        let child = parent.then(on: .immediate) { value -> Int in held.hold(); return value + 1 }
        let grandchild = child.then(on: .immediate) { $0 + 1 }
        let settler = DispatchGroup()
        DispatchQueue.global().async(group: settler) { parent.fulfill(1) }  // runs the handler there
        held.entered.wait()
        XCTAssertTrue(parent.isFulfilled)
        XCTAssertTrue(child.isPending, "its handler is still running")
        parent.cancel(reason: Reason(tag: 7))  // returns while the handler still runs
        held.proceed.signal()
        XCTAssertEqual(settler.wait(timeout: .now() + testTimeoutSeconds), .success)
        XCTAssertTrue(parent.isFulfilled, "a settled promise stays as it was")
        XCTAssertThrowsError(try child.wait()) { XCTAssertEqual($0 as? Reason, Reason(tag: 7)) }
        XCTAssertTrue(child.isCancelled, "the handler's result lost to the cancel that came first")
        XCTAssertTrue(grandchild.isCancelled)
    }

    func testCancelOfASettledGrandparentReachesAHandlerRunningBelowASettledUnlinkedChild() {
        let held = HeldHandler()
        let root = Promise<Int>()
        let middle = root.then(on: .immediate) { $0 + 1 }  // settles at once, is linked nowhere
        let leaf = middle.then(on: .immediate) { value -> Int in held.hold(); return value + 1 }
        let rejecting = middle.then(on: .immediate) { _ -> Int in held.hold(); throw Reason(tag: 99) }
        let settler = DispatchGroup()
        DispatchQueue.global().async(group: settler) { root.fulfill(1) }
        held.entered.wait()  // `leaf`'s handler
        root.cancel(reason: Reason(tag: 8))
        XCTAssertTrue(middle.isFulfilled, "settled before the cancel: untouched")
        held.proceed.signal()
        held.entered.wait()  // `rejecting`'s handler, which started after the cancel returned
        held.proceed.signal()
        XCTAssertEqual(settler.wait(timeout: .now() + testTimeoutSeconds), .success)
        XCTAssertEqual(try middle.wait(), 2)
        XCTAssertThrowsError(try leaf.wait()) { XCTAssertEqual($0 as? Reason, Reason(tag: 8)) }
        XCTAssertTrue(leaf.isCancelled)
        XCTAssertThrowsError(try rejecting.wait()) { XCTAssertEqual($0 as? Reason, Reason(tag: 8)) }
        XCTAssertTrue(rejecting.isCancelled, "a handler that throws after the cancel ends cancelled, not rejected")
    }

    func testAHandlerRunningWhenItsSettledParentIsCancelledCancelsThePromiseItReturns() {
        let held = HeldHandler()
        let parent = Promise<Int>()
        let inner = Promise<Int>()
        let child = parent.then(on: .immediate) { _ -> Promise<Int> in held.hold(); return inner }
        let settler = DispatchGroup()
        DispatchQueue.global().async(group: settler) { parent.fulfill(1) }
        held.entered.wait()
        parent.cancel(reason: Reason(tag: 9))
        held.proceed.signal()
        XCTAssertEqual(settler.wait(timeout: .now() + testTimeoutSeconds), .success)
        XCTAssertTrue(child.isCancelled)
        XCTAssertTrue(inner.isCancelled, "the returned promise is work the cancelled child owns")
    }

    func testAHandlerThatClaimedBeforeTheCancelKeepsItsOutcome() throws {
        // The cancel arrives after the handler settled its child: the child had settled
        // first, and only its pending descendants are cancelled.
        let parent = Promise(value: 1)
        let child = parent.then(on: .immediate) { $0 + 1 }
        let queue = heldQueue()
        let later = child.then(on: queue) { $0 + 1 }
        parent.cancel(reason: Reason(tag: 10))
        XCTAssertEqual(try child.wait(), 2)
        XCTAssertTrue(later.isCancelled)
        queue.resume()
        queue.sync {}
        // A cancel of an unrelated settled promise elsewhere moves the forwarding epoch:
        // handlers below `child` then check their ancestors, find nothing, and fulfil.
        Promise(value: 0).cancel()
        let fresh = Promise(value: 5).then(on: .immediate) { $0 + 1 }.then(on: .immediate) { $0 + 1 }
        XCTAssertEqual(try fresh.wait(), 7)
    }

    func testCancelLeavesSettledDescendantsAlone() throws {
        let parent = Promise(value: 1)
        let child = parent.then(on: .immediate) { $0 * 10 }
        parent.cancel()
        XCTAssertEqual(try child.wait(), 10)
    }

    func testCancellationNeverFlowsUpOrSideways() {
        let parent = Promise<Int>()
        let cancelled = parent.then { $0 }
        let sibling = parent.then { $0 }
        let nephew = sibling.then { $0 }
        cancelled.cancel()
        XCTAssertTrue(cancelled.isCancelled)
        XCTAssertTrue(parent.isPending)
        XCTAssertTrue(sibling.isPending)
        XCTAssertTrue(nephew.isPending)
        parent.fulfill(3)
        XCTAssertEqual(try nephew.wait(timeout: .seconds(10)), 3)
    }

    func testCancellingAChildCancelsThePromiseItFollows() {
        let parent = Promise(value: 1)
        let inner = Promise<Int>()
        let child = parent.then(on: .immediate) { _ in inner }
        child.cancel()
        XCTAssertTrue(inner.isCancelled)
        XCTAssertTrue(parent.isFulfilled)
    }

    func testResolveWithFollowerCancelDoesNotCancelTheFollowedPromise() {
        let source = Promise<Int>()
        let follower = Promise<Int>()
        follower.resolve(with: source)
        follower.cancel()
        XCTAssertTrue(follower.isCancelled)
        XCTAssertTrue(source.isPending, "resolve(with:) follows; it does not own the source")
    }

    func testRootCancelCancelsTheWholePendingTree() {
        let root = Promise<Int>()
        let left = root.then { $0 }
        let right = root.then { $0 }
        let leftLeaf = left.then { $0 }.then { $0 }
        let rightLeaf = right.recover { _ in 0 }
        let expectation = expectation(description: "leaves settle")
        expectation.expectedFulfillmentCount = 2
        leftLeaf.whenComplete { _ in expectation.fulfill() }
        rightLeaf.whenComplete { _ in expectation.fulfill() }
        XCTAssertTrue(leftLeaf.root === root)
        leftLeaf.root.cancel(reason: Reason(tag: 7))
        wait(for: [expectation], timeout: 10)
        for promise in [root, left, right, leftLeaf, rightLeaf] as [AnyPromise] {
            XCTAssertTrue(promise.isCancelled)
        }
        XCTAssertThrowsError(try rightLeaf.wait()) {
            XCTAssertEqual($0 as? Reason, Reason(tag: 7), "recovery cannot turn a cancellation into success")
        }
    }

    func testOnCancelRunsOnceWhenCancelledAndAtOnceIfAlreadyCancelled() {
        let promise = Promise<Int>()
        let count = TreeCounter()
        promise.onCancel { count.bump() }
        promise.cancel()
        promise.cancel()
        XCTAssertEqual(count.value, 1)
        promise.onCancel { count.bump() }
        XCTAssertEqual(count.value, 2, "registered on a cancelled promise: runs at once")
        let fulfilled = Promise(value: 1)
        fulfilled.onCancel { count.bump() }
        fulfilled.cancel()
        XCTAssertEqual(count.value, 2, "never runs for a promise that settled otherwise")
    }

    func testCancelAfterFulfilRunsOnCancelOfTheFollowedWork() {
        let parent = Promise(value: 1)
        let stopped = TreeCounter()
        // The resolver side holds the work it will settle (as a network callback would).
        let work = Promise<Int>()
        work.onCancel { stopped.bump() }
        let child = parent.then(on: .immediate) { _ in work }
        parent.cancel()
        XCTAssertTrue(child.isCancelled)
        XCTAssertTrue(work.isCancelled)
        XCTAssertEqual(stopped.value, 1)
    }

    func testCancelledTreeIsFreed() {
        weak var weakRoot: Promise<Int>?
        weak var weakLeaf: Promise<Int>?
        weak var weakInner: Promise<Int>?
        do {
            let root = Promise(value: 1)
            let inner = Promise<Int>()
            let leaf = root.then(on: .immediate) { _ in inner }
            weakRoot = root
            weakLeaf = leaf
            weakInner = inner
            root.cancel()
        }
        XCTAssertNil(weakRoot)
        XCTAssertNil(weakLeaf)
        XCTAssertNil(weakInner)
    }

    /// A child's link in its parent's registry is the node a root would keep its first
    /// observer in: a linked child's own observers (each in a box) and its children must
    /// be unaffected, and the cancel must reach it through the link.
    func testALinkedChildKeepsItsObserversAndIsCancelledThroughItsLink() {
        let queue = heldQueue()
        let log = OrderLog()
        let parent = Promise(value: 1)
        let child = parent.then(on: queue) { $0 + 1 }  // queued: linked into `parent`'s registry
        child.whenComplete(on: .immediate) { if case .failure = $0 { log.append(1) } }
        child.whenComplete(on: .immediate) { if case .failure = $0 { log.append(2) } }
        let grandchild = child.then(on: .immediate) { $0 + 1 }
        parent.cancel(reason: Reason(tag: 7))
        XCTAssertTrue(child.isCancelled, "the cancel reaches the queued child through its link")
        XCTAssertTrue(grandchild.isCancelled)
        XCTAssertEqual(log.all, [1, 2], "each observer of the linked child runs once, in order")
        queue.resume()
        queue.sync {}
        XCTAssertThrowsError(try grandchild.wait()) { XCTAssertEqual($0 as? Reason, Reason(tag: 7)) }
        XCTAssertEqual(log.all, [1, 2])
    }

    func testRegistryOfALongLivedPromiseIsPruned() {
        let shared = Promise(value: 1)
        let queue = DispatchQueue(label: "prune")
        for index in 0..<5_000 {
            _ = shared.then(on: queue) { $0 }
            // Let the queue catch up now and then, so that the children linked before each
            // prune point are dead by then (on a loaded machine it may lag far behind).
            if index % 100 == 99 { queue.sync {} }
        }
        queue.sync {}  // every handler ran; their children are gone
        // Each dispatched child linked itself; dead links are pruned as the registry grows.
        let links = pc_tree_flags(shared.corePointer) >> PC_TREE_COUNT_SHIFT
        XCTAssertLessThan(links, 4_200, "dead links must be pruned")
        var live = 0
        shared.forEachLinkedChild(reapplyingCancel: false) { _ in live += 1 }
        XCTAssertEqual(live, 0, "no child is alive, so no link should survive a walk")
    }

    func testCancelOfADeepSettledChainReachesTheQueuedLeafWithoutRecursion() {
        let queue = heldQueue()
        let root = Promise(value: 0)
        var chain = [root]  // held: a settled step nobody holds is gone, and so is its link
        for _ in 0..<100_000 { chain.append(chain[chain.count - 1].then(on: .immediate) { $0 + 1 }) }
        let leaf = chain[chain.count - 1].then(on: queue) { $0 }
        root.cancel()
        XCTAssertTrue(leaf.isCancelled)
        XCTAssertEqual(try chain[chain.count - 1].wait(), 100_000)
        queue.resume()
    }

    /// The tree is what `parent` shows: once the settled steps between a root and a later
    /// child are gone (nobody held them, nothing was in flight), the child's tree starts at
    /// its oldest living ancestor, and that is where a cancel of the whole tree starts.
    func testTreeOfAChildUnderADeadSettledStepStartsAtItsOldestLivingAncestor() {
        let queue = heldQueue()
        let root = Promise(value: 0)
        weak var weakMiddle: Promise<Int>?
        let last: Promise<Int>
        do {
            let middle = root.then(on: .immediate) { $0 + 1 }
            weakMiddle = middle
            last = middle.then(on: .immediate) { $0 + 1 }
        }
        XCTAssertNil(weakMiddle, "a settled step nobody holds stays alive")
        XCTAssertNil(last.parent)
        let leaf = last.then(on: queue) { $0 }
        XCTAssertTrue(leaf.root === last)
        leaf.root.cancel(reason: Reason(tag: 9))
        XCTAssertTrue(leaf.isCancelled)
        XCTAssertEqual(root.state, .fulfilled)
        queue.resume()
    }

    func testHandlersOfACancelledPromiseOnOneSerialQueueRunInRegistrationOrder() {
        // Regression (stress suite): error sides of cancelled children were queued after
        // later observers.
        let queue = DispatchQueue(label: "order")
        let log = OrderLog()
        let promise = Promise<Int>()
        promise.catch(on: queue) { _ in log.append(1) }
        promise.whenComplete(on: queue) { _ in log.append(2) }
        promise.always(on: queue) { log.append(3) }
        _ = promise.recover(on: queue) { _ in log.append(4); return 0 }
        promise.cancel()
        queue.sync {}
        XCTAssertEqual(log.all, [1, 2, 3, 4])
    }

    func testCancellingAChildWhileItStartsFollowingIsRaceFree() {
        // Regression (TSan): `follow` published the followed promise without ordering
        // against a canceller taking over from FOLLOWING. Meaningful under --sanitize=thread.
        let queue = DispatchQueue(label: "follow")
        for _ in 0..<300 {
            let parent = Promise(value: 1)
            let started = DispatchSemaphore(value: 0)
            let child = parent.flatMap(on: queue) { value -> Promise<Int> in
                started.signal()
                return Promise<Int>(on: .default) { value }
            }
            started.wait()
            child.cancel()
            // The followed promise may have been adopted on its settling thread, which
            // publishes a moment later: wait for the child to settle, either way.
            XCTAssertTrue(eventually { !child.isPending }, "the child never settled")
            XCTAssertTrue(child.isCancelled || child.isFulfilled)
        }
    }

    // MARK: Races (bounded)

    func testCancelRacingFulfilAndRejectExactlyOneOutcomeEveryHandlerSeesItOnce() {
        for round in 0..<500 {
            let promise = Promise<Int>()
            let seen = ResultLog()
            for _ in 0..<4 { promise.whenComplete(on: .immediate) { seen.record($0) } }
            DispatchQueue.concurrentPerform(iterations: 3) { index in
                switch index {
                case 0: promise.fulfill(round)
                case 1: promise.reject(Reason(tag: round))
                default: promise.cancel(reason: Reason(tag: -round))
                }
            }
            let outcomes = seen.all
            XCTAssertEqual(outcomes.count, 4)
            XCTAssertEqual(Set(outcomes).count, 1, "every handler must see the one winning outcome")
            switch promise.state {
            case .fulfilled: XCTAssertEqual(outcomes.first, "v\(round)")
            case .rejected: XCTAssertEqual(outcomes.first, "e\(round)")
            case .cancelled: XCTAssertEqual(outcomes.first, "e\(-round)")
            case .pending: XCTFail("settled by three racers")
            }
        }
    }

    func testCancelRacingRegistrationLosesNoHandler() {
        for _ in 0..<300 {
            let promise = Promise<Int>()
            let ran = TreeCounter()
            DispatchQueue.concurrentPerform(iterations: 4) { index in
                if index == 0 {
                    promise.cancel()
                } else {
                    for _ in 0..<25 { promise.whenComplete(on: .immediate) { _ in ran.bump() } }
                }
            }
            XCTAssertEqual(ran.value, 75)
        }
    }
}

/// Records integers in order, thread-safely.
private final class OrderLog: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [Int] = []
    func append(_ value: Int) { lock.lock(); entries.append(value); lock.unlock() }
    var all: [Int] { lock.lock(); defer { lock.unlock() }; return entries }
}

/// Records outcomes as strings, thread-safely.
private final class ResultLog: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [String] = []
    func record(_ result: Result<Int, any Error>) {
        let text: String
        switch result {
        case .success(let value): text = "v\(value)"
        case .failure(let error): text = "e\((error as? Reason)?.tag ?? Int.min)"
        }
        lock.lock(); entries.append(text); lock.unlock()
    }
    var all: [String] { lock.lock(); defer { lock.unlock() }; return entries }
}
