// Which layout each kind of promise gets (a root, a child that stores no context, a child
// that stores one), and that a child behaves the same whichever it got.
import Dispatch
@testable import Promise
import XCTest

final class LayoutTests: XCTestCase {
    func testOnlyChildrenOnOtherContextsStoreTheirContext() {
        let root = Promise<Int>()
        XCTAssertFalse(root is DerivedPromise<Int>)
        XCTAssertFalse(root.then(on: .immediate) { $0 } is ContextDerivedPromise<Int>)
        XCTAssertFalse(root.then { $0 } is ContextDerivedPromise<Int>)
        XCTAssertTrue(root.then(on: DispatchQueue.global()) { $0 } is ContextDerivedPromise<Int>)
        root.cancel()
    }

    /// A child on `.default` stores no context (the smaller layout, as on `.immediate`),
    /// yet its handler runs on the library's default queue, pending parent or settled.
    func testDefaultChildStoresNoContextAndRunsOnTheDefaultQueue() {
        let key = DispatchSpecificKey<Int>()
        DefaultExecutionContext.queue.setSpecific(key: key, value: 1)
        defer { DefaultExecutionContext.queue.setSpecific(key: key, value: nil) }
        let pending = Promise<Int>()
        let children = [pending.then { _ in DispatchQueue.getSpecific(key: key) },
                        Promise(value: 1).then(on: .default) { _ in DispatchQueue.getSpecific(key: key) },
                        pending.recover(on: .default) { _ in 0 }.then(on: .default) { _ in DispatchQueue.getSpecific(key: key) }]
        for child in children {
            XCTAssertFalse(child is ContextDerivedPromise<Int?>, "a .default child stored its context")
        }
        XCTAssertTrue(pending.then(on: DispatchQueue.global()) { $0 } is ContextDerivedPromise<Int>)
        pending.fulfill(1)
        for child in children { XCTAssertEqual(value(child), 1, "a .default handler ran off the default queue") }
    }

    /// `whenComplete` on `.default` past a root's first observer: a box that stores no
    /// context, whose observer still runs on the default queue.
    func testDefaultObserverBoxesRunOnTheDefaultQueue() {
        let key = DispatchSpecificKey<Int>()
        DefaultExecutionContext.queue.setSpecific(key: key, value: 1)
        defer { DefaultExecutionContext.queue.setSpecific(key: key, value: nil) }
        let promise = Promise<Int>()
        let queues = Recorder<Int?>()
        let done = DispatchGroup()
        for _ in 0..<3 {  // the first takes the root's own slot; the others are boxes
            done.enter()
            promise.whenComplete { _ in
                queues.append(DispatchQueue.getSpecific(key: key))
                done.leave()
            }
        }
        promise.fulfill(1)
        XCTAssertEqual(done.wait(timeout: .now() + testTimeoutSeconds), .success)
        XCTAssertEqual(queues.values, [1, 1, 1], "a .default observer ran off the default queue")
    }

    /// `whenComplete` on `.immediate` past a root's first observer (and every one on a
    /// child): a bare node that the run frees. Each runs once, in order, with the value,
    /// whether the settling call's caller lends the promise (a settle from outside) or the
    /// node holds it (a settle inside another promise's firing, whose caller drops the
    /// promise before the node runs); and each lets go of its captures once it ran. A value
    /// too large for the promise's inline words goes through the same delivery.
    func testImmediateObserverNodesRunOnceInOrderAndLetGoOfWhatTheyHeld() {
        let life = LifeTracker()
        let ran = Recorder<String>()

        func observe(_ promise: Promise<Payload>, tag: String) {
            let captured = Payload(bytes: [], tracker: life)
            promise.whenComplete(on: .immediate) { result in
                withExtendedLifetime(captured) { ran.append("\(tag):\((try? result.get())?.bytes.count ?? -1)") }
            }
        }

        // Lent: fulfilled from outside any firing.
        let lent = Promise<Payload>()
        for tag in ["a", "b", "c"] { observe(lent, tag: tag) }
        let child = lent.then(on: .immediate) { $0 }
        for tag in ["d", "e"] { observe(child, tag: tag) }
        XCTAssertEqual(life.alive, 5)
        lent.fulfill(Payload(bytes: [1, 2, 3], tracker: life))
        XCTAssertEqual(ran.values, ["a:3", "b:3", "c:3", "d:3", "e:3"])

        // Held: fulfilled inside another promise's firing, by a handler that drops it.
        weak var weakHeld: Promise<Payload>?
        let trigger = Promise<Void>()
        do {
            let held = Promise<Payload>()
            weakHeld = held
            for tag in ["f", "g", "h"] { observe(held, tag: tag) }
            let handoff = Handoff(held)
            trigger.whenComplete(on: .immediate) { _ in
                handoff.take()?.fulfill(Payload(bytes: [4], tracker: life))
            }
        }
        trigger.fulfill(())
        XCTAssertEqual(ran.values.suffix(3), ["f:1", "g:1", "h:1"])
        XCTAssertNil(weakHeld, "a node kept its settled promise after it ran")
        XCTAssertEqual(ran.count, 8, "a node ran twice")
        // Left alive: the value `lent` and `child` hold, nothing an observer captured.
        XCTAssertEqual(life.alive, 1, "a node kept what its closure captured after it ran")
    }
}
