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
}
