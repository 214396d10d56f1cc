// A handler sent to one of Dispatch's queues goes as a C function and its promise, not as
// a block: the queue it reaches, and that the path is taken where it should be.
import CAtomicOps
@preconcurrency import CPromiseCore
import Dispatch
import Foundation
@testable import Promise
import XCTest

final class DispatchBridgeTests: XCTestCase {
    /// On Linux the overlay's queue object is where `DispatchBridge` reads it, so handlers
    /// skip the block; were the check to fail, they would still run, only slower, and
    /// nothing else would say so.
    func testTheQueueBehindADispatchQueueIsFound() throws {
        #if os(Linux)
        XCTAssertTrue(DispatchBridge.queueLayoutAsExpected)
        let queue = DispatchQueue(label: "PromiseTests.bridge")
        XCTAssertNotNil(DispatchBridge.dispatchQueue(of: queue))
        XCTAssertEqual(DispatchBridge.dispatchQueue(of: queue), DispatchBridge.dispatchQueue(of: queue))
        XCTAssertNotEqual(DispatchBridge.dispatchQueue(of: queue), DispatchBridge.dispatchQueue(of: .main))
        #else
        XCTAssertNil(DispatchBridge.dispatchQueue(of: DispatchQueue(label: "PromiseTests.bridge")))
        #endif
    }

    /// Each of Dispatch's contexts runs the handler on its own queue, with the value, once.
    func testAHandlerRunsOnTheQueueItWasGiven() {
        let key = DispatchSpecificKey<String>()
        let serial = DispatchQueue(label: "PromiseTests.bridge.serial")
        let concurrent = DispatchQueue(label: "PromiseTests.bridge.concurrent", attributes: .concurrent)
        serial.setSpecific(key: key, value: "serial")
        concurrent.setSpecific(key: key, value: "concurrent")
        DefaultExecutionContext.queue.setSpecific(key: key, value: "default")
        defer { DefaultExecutionContext.queue.setSpecific(key: key, value: nil) }
        let contexts: [(String, any ExecutionContext)] = [
            ("serial", serial), ("concurrent", concurrent), ("concurrent", .concurrent(concurrent)), ("default", .default),
        ]
        for (name, context) in contexts {
            let parent = Promise<Int>()
            let child = parent.then(on: context) { value in (value, DispatchQueue.getSpecific(key: key)) }
            parent.fulfill(7)
            let ran = value(child)
            XCTAssertEqual(ran?.0, 7, name)
            XCTAssertEqual(ran?.1, name, "the handler ran on \(ran?.1 ?? "no queue of ours"), not \(name)")
        }
    }
}

// MARK: The bridge against the overlay's async: the same behaviour either way

/// The layout word, stored whole (relaxed: as `pc_runtime_layout_set` writes it).
private func storeLayoutWord(_ value: UInt) {
    withUnsafeMutablePointer(to: &__pc_runtime_layout_word) { word in
        word.withMemoryRebound(to: Int.self, capacity: 1) { AO_store($0, Int(bitPattern: value)) }
    }
}

/// Runs `body` with `DispatchBridge` on (`bridged`), or as if its reflection check had
/// failed (the dispatch answer of the layout word made _OTHER), then puts the word back.
private func withDispatchBridge(_ bridged: Bool, _ body: () -> Void) {
    let shift = UInt(PC_RUNTIME_DISPATCH_QUEUE)
    let saved = pc_word_load(&__pc_runtime_layout_word)
    let answer = UInt(bridged ? PC_RUNTIME_LAYOUT_EXPECTED : PC_RUNTIME_LAYOUT_OTHER)
    storeLayoutWord((saved & ~(3 << shift)) | (answer << shift))
    defer { storeLayoutWord(saved) }
    #if os(Linux)
    XCTAssertEqual(DispatchBridge.dispatchQueue(of: .main) != nil, bridged)
    #endif
    body()
}

final class DispatchBridgeBehaviourTests: XCTestCase {
    private let modes = [true, false]

    /// A serial queue runs, in the order they were sent, handlers (`then`, `recover`),
    /// `whenComplete` boxes, `.concurrent(queue)` handlers on it and the user's own
    /// blocks, whichever way each went.
    func testASerialQueueRunsHandlersBoxesAndTheUsersBlocksInTheOrderSent() {
        for bridged in modes {
            withDispatchBridge(bridged) {
                let queue = DispatchQueue(label: "PromiseTests.bridge.order")
                let order = Recorder<Int>()
                var children: [Promise<Void>] = []
                let settled = Promise(value: 0), rejected = Promise<Int>(error: TestError(1))
                for i in 0..<400 {
                    switch i % 6 {
                    case 0: children.append(settled.then(on: queue) { _ in order.append(i) })
                    case 1: settled.whenComplete(on: queue) { _ in order.append(i) }
                    case 2: queue.async { order.append(i) }
                    case 3: children.append(settled.then(on: .concurrent(queue)) { _ in order.append(i) })
                    case 4:
                        let pending = Promise<Int>()
                        children.append(pending.then(on: queue) { _ in order.append(i) })
                        pending.whenComplete(on: .immediate) { _ in }
                        pending.fulfill(i)  // sends the handler now
                    default: children.append(rejected.recover(on: queue) { _ in order.append(i); return 0 }.then(on: .immediate) { _ in })
                    }
                }
                queue.sync {}
                XCTAssertEqual(order.values, Array(0..<400), "bridged: \(bridged)")
                for child in children { settle(child) }
            }
        }
    }

    /// On a concurrent queue, handlers and boxes sent to the queue itself are barriers:
    /// they overlap nothing, not each other, not the user's blocks.
    func testOnAConcurrentQueueHandlersAndBoxesOverlapNothing() {
        for bridged in modes {
            withDispatchBridge(bridged) {
                let queue = DispatchQueue(label: "PromiseTests.bridge.barrier", attributes: .concurrent)
                let tracker = ConcurrencyTracker()
                let barriers = ConcurrencyTracker()
                let p = Promise<Int>()
                var children: [Promise<Void>] = []
                for i in 0..<120 {
                    if i.isMultiple(of: 2) {
                        children.append(p.then(on: queue) { _ -> Void in
                            barriers.enter(); tracker.track(workMicroseconds: 50); barriers.leave()
                        })
                    } else {
                        p.whenComplete(on: queue) { _ in
                            barriers.enter(); tracker.track(workMicroseconds: 50); barriers.leave()
                        }
                    }
                }
                let users = DispatchGroup()
                p.fulfill(1)
                for _ in 0..<120 { queue.async(group: users) { tracker.track(workMicroseconds: 50) } }
                for child in children { settle(child) }
                queue.sync(flags: .barrier) {}
                XCTAssertEqual(users.wait(timeout: .now() + testTimeoutSeconds), .success)
                XCTAssertEqual(barriers.entries, 120)
                XCTAssertEqual(barriers.maxConcurrency, 1, "bridged: \(bridged): two barrier handlers overlapped")
                XCTAssertEqual(tracker.entries, 240)
            }
        }
    }

    /// `.concurrent(queue)` sends without a barrier: two of its handlers can be inside
    /// their bodies at once (each waits, bounded, for the other to arrive).
    func testConcurrentContextHandlersCanOverlap() {
        for bridged in modes {
            withDispatchBridge(bridged) {
                let queue = DispatchQueue(label: "PromiseTests.bridge.noBarrier", attributes: .concurrent)
                let first = DispatchSemaphore(value: 0), second = DispatchSemaphore(value: 0)
                let p = Promise<Int>()
                let a = p.then(on: .concurrent(queue)) { _ -> Bool in
                    first.signal()
                    return second.wait(timeout: .now() + testTimeoutSeconds) == .success
                }
                let b = Promise<Int>()
                b.whenComplete(on: .concurrent(queue)) { _ in
                    second.signal()
                    _ = first.wait(timeout: .now() + testTimeoutSeconds)
                }
                p.fulfill(1)
                b.fulfill(2)
                XCTAssertEqual(value(a), true, "bridged: \(bridged): the handler and the box never overlapped")
            }
        }
    }

    /// The user's last reference to the queue may go right after `then(on:)`: the child
    /// holds the queue until it sends the handler, and lets go of it then (before the
    /// settling call returns); the handler runs on that queue; and once it and the boxes
    /// ran, nothing holds the queue, the child, the boxes or what they captured.
    func testAQueueTheUserDroppedRunsTheWorkAndEverythingIsReleased() {
        for bridged in modes {
            withDispatchBridge(bridged) {
                let key = DispatchSpecificKey<Int>()
                weak var weakQueue: DispatchQueue?
                let parent = Promise<Int>()
                var child: Promise<Int>? = nil
                do {
                    let queue = DispatchQueue(label: "PromiseTests.bridge.dropped")
                    queue.setSpecific(key: key, value: 7)
                    weakQueue = queue
                    child = parent.then(on: queue) { v in v + (DispatchQueue.getSpecific(key: key) ?? -100) }
                }
                XCTAssertNotNil(weakQueue, "the child holds the queue until it sends its handler")
                parent.fulfill(1)
                XCTAssertNil(weakQueue, "bridged: \(bridged): the queue's wrapper outlived the send")
                XCTAssertEqual(child.map { value($0) }, 8)
                child = nil

                weak var weakChild: Promise<Int>?
                let boxesRan = expectation(description: "boxes")
                boxesRan.expectedFulfillmentCount = 2
                let life = LifeTracker()
                let second = Promise<Int>()
                do {
                    let queue = DispatchQueue(label: "PromiseTests.bridge.dropped2", attributes: .concurrent)
                    weakQueue = queue
                    let child = second.then(on: queue) { $0 + 1 }
                    weakChild = child
                    let payload = Payload(bytes: [1], tracker: life)
                    child.whenComplete(on: queue) { result in
                        _ = payload
                        if case .success(3) = result { boxesRan.fulfill() }
                    }
                    child.whenComplete(on: .concurrent(queue)) { result in
                        _ = payload
                        if case .success(3) = result { boxesRan.fulfill() }
                    }
                }
                second.fulfill(2)
                wait(for: [boxesRan], timeout: testTimeoutSeconds)
                XCTAssertTrue(eventually { weakChild == nil && weakQueue == nil && life.alive == 0 },
                              "bridged: \(bridged): something leaked")
            }
        }
    }

    /// A suspended queue keeps what was sent to it, and runs it, in order, once resumed.
    func testASuspendedQueueRunsTheWorkOnceResumed() {
        for bridged in modes {
            withDispatchBridge(bridged) {
                let queue = DispatchQueue(label: "PromiseTests.bridge.suspended")
                queue.suspend()
                let order = Recorder<Int>()
                let p = Promise(value: 1)
                let child = p.then(on: queue) { _ in order.append(0) }
                p.whenComplete(on: queue) { _ in order.append(1) }
                let other = p.then(on: .concurrent(queue)) { _ in order.append(2) }
                XCTAssertEqual(order.values, [], "bridged: \(bridged): work ran on a suspended queue")
                queue.resume()
                queue.sync {}
                XCTAssertEqual(order.values, [0, 1, 2], "bridged: \(bridged)")
                settle(child)
                settle(other)
            }
        }
    }

    /// `.main`: handlers and boxes run on the main thread, in the order sent, among the
    /// user's own blocks on the main queue.
    func testTheMainQueueRunsHandlersBoxesAndTheUsersBlocksInOrder() {
        for bridged in modes {
            withDispatchBridge(bridged) {
                let order = Recorder<Int>()
                let offMain = Flag()
                let done = expectation(description: "last block, bridged: \(bridged)")
                let settled = Promise(value: 0)
                for i in 0..<60 {
                    let record: @Sendable () -> Void = {
                        if !Thread.isMainThread { offMain.set() }
                        order.append(i)
                    }
                    switch i % 3 {
                    case 0: _ = settled.then(on: .main) { _ in record() }
                    case 1: settled.whenComplete(on: .main) { _ in record() }
                    default: DispatchQueue.main.async { record() }
                    }
                }
                DispatchQueue.main.async { done.fulfill() }
                wait(for: [done], timeout: testTimeoutSeconds)
                XCTAssertEqual(order.values, Array(0..<60), "bridged: \(bridged)")
                XCTAssertFalse(offMain.isSet)
            }
        }
    }

    /// Threads that find both answers of the layout word unknown record them at once:
    /// each answer ends up _EXPECTED, neither clobbers the other.
    func testThreadsRecordingBothLayoutAnswersAtOnceKeepBoth() {
        #if os(Linux)
        let saved = pc_word_load(&__pc_runtime_layout_word)
        defer { storeLayoutWord(saved) }
        let queue = DispatchQueue(label: "PromiseTests.bridge.layoutRace")
        for _ in 0..<200 {
            storeLayoutWord(0)
            DispatchQueue.concurrentPerform(iterations: 4) { i in
                if i.isMultiple(of: 2) {
                    XCTAssertEqual(DispatchBridge.dispatchQueue(of: queue) != nil, DispatchBridge.queueLayoutAsExpected)
                } else {
                    XCTAssertTrue(SwiftRuntime.countWordHasExpectedLayout)
                }
            }
            XCTAssertEqual(pc_runtime_layout(UInt(PC_RUNTIME_DISPATCH_QUEUE)),
                           UInt(DispatchBridge.queueLayoutAsExpected ? PC_RUNTIME_LAYOUT_EXPECTED : PC_RUNTIME_LAYOUT_OTHER))
            XCTAssertEqual(pc_runtime_layout(UInt(PC_RUNTIME_COUNT_WORD)), UInt(PC_RUNTIME_LAYOUT_EXPECTED))
        }
        #endif
    }
}
