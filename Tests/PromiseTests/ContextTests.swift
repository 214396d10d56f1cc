// Execution contexts: where and when handlers run.
import Dispatch
import Foundation
import Promise
import XCTest

final class ContextTests: XCTestCase {

    /// Every context except `.immediate` (and `.main`, tested on its own below).
    private func asyncContexts() -> [(name: String, context: any ExecutionContext)] {
        var contexts: [(name: String, context: any ExecutionContext)] = [
            ("default", .default),
            ("serial queue", DispatchQueue(label: "PromiseTests.serial")),
            ("concurrent queue", DispatchQueue(label: "PromiseTests.concurrent", attributes: .concurrent)),
            (".concurrent(queue)", .concurrent(DispatchQueue(label: "PromiseTests.concurrent2", attributes: .concurrent))),
            ("global queue", DispatchQueue.global()),
            ("custom context", CountingContext()),
        ]
        #if Foundation  // the package trait, on by default
        contexts.append(("operation queue", OperationQueue()))
        #endif
        return contexts
    }

    // MARK: No Zalgo

    /// On an already settled promise, no handler on an asynchronous context runs inside
    /// the call that registers it: each handler checks a marker that is set on the
    /// registering thread only for the duration of the registering call.
    func testNoHandlerRunsInsideRegistrationOnSettledPromise() {
        let fulfilled = Promise(value: 1)
        let rejected = Promise<Int>(error: TestError(1))
        let cancelled = Promise<Int>()
        cancelled.cancel(reason: TestError(2))

        let inline = Recorder<String>()
        let ran = Recorder<String>()
        let done = Countdown()

        for (name, context) in asyncContexts() {
            for (state, p) in [("fulfilled", fulfilled), ("rejected", rejected), ("cancelled", cancelled)] {
                // One probe per form: it notes whether it ran inside the registering call.
                func probe(_ form: String) -> @Sendable () -> Void {
                    done.add()
                    let label = "\(name)/\(state)/\(form)"
                    return {
                        if ThreadMarker.isInside("register") { inline.append(label) }
                        ran.append(label)
                        done.countDown()
                    }
                }
                let mapProbe = probe("then")
                let flatProbe = probe("flatMap")
                let bothProbe = probe("then2")
                let recoverProbe = probe("recover")
                let flatRecoverProbe = probe("recover->Promise")
                let mapErrorProbe = probe("mapError")
                let catchProbe = probe("catch")
                let alwaysProbe = probe("always")
                let validateProbe = probe("validate")
                let completeProbe = probe("whenComplete")
                // Handlers that the outcome does not select never run: leave for them.
                var unselected: [String] = []
                ThreadMarker.inside("register") {
                    _ = p.then(on: context) { v -> Int in mapProbe(); return v }
                    _ = p.flatMap(on: context) { v -> Promise<Int> in flatProbe(); return Promise(value: v) }
                    _ = p.then(on: context, { v -> Int in bothProbe(); return v }, { _ -> Int in bothProbe(); return 0 })
                    _ = p.recover(on: context) { _ -> Int in recoverProbe(); return 0 }
                    _ = p.recover(on: context) { _ -> Promise<Int> in flatRecoverProbe(); return Promise(value: 0) }
                    _ = p.mapError(on: context) { e -> any Error in mapErrorProbe(); return e }
                    _ = p.catch(on: context) { _ in catchProbe() }
                    _ = p.always(on: context) { alwaysProbe() }
                    _ = p.validate(on: context) { _ in validateProbe(); return true }
                    p.whenComplete(on: context) { _ in completeProbe() }
                }
                if p.isFulfilled {
                    unselected = ["recover", "recover->Promise", "mapError", "catch"]
                } else {
                    unselected = ["then", "flatMap", "validate"]
                }
                for _ in unselected { done.countDown() }
            }
        }
        XCTAssertTrue(done.wait(), "handlers ran: \(ran.count)")
        XCTAssertEqual(done.overshoot, 0, "a handler ran twice")
        XCTAssertEqual(inline.values, [], "handlers that ran inside the registering call")
    }

    /// The probe above can fail: with a context that breaks the `execute` contract by
    /// running work inline, the handler does see the registering call's marker.
    func testZalgoProbeDetectsAContextThatRunsWorkInline() {
        struct InlineContext: ExecutionContext {
            func execute(_ work: @escaping @Sendable () -> Void) { work() }
        }
        let sawMarker = Flag()
        let child = ThreadMarker.inside("register") {
            Promise(value: 1).then(on: InlineContext()) { v -> Int in
                if ThreadMarker.isInside("register") { sawMarker.set() }
                return v
            }
        }
        XCTAssertEqual(value(child), 1)
        XCTAssertTrue(sawMarker.isSet)
    }

    /// The same check for `then` on a pending promise that settles on another thread:
    /// the handler does not run inside `fulfill` either (only `.immediate` does).
    func testNoHandlerRunsInsideFulfillOnAsyncContexts() {
        let inline = Recorder<String>()
        var children: [Promise<Int>] = []
        let p = Promise<Int>()
        for (name, context) in asyncContexts() {
            children.append(p.then(on: context) { v -> Int in
                if ThreadMarker.isInside("fulfill") { inline.append(name) }
                return v
            })
        }
        ThreadMarker.inside("fulfill") { _ = p.fulfill(1) }
        for child in children { XCTAssertEqual(value(child), 1) }
        XCTAssertEqual(inline.values, [])
    }

    // MARK: .immediate

    func testImmediateRunsInlineOnSettlingThreadBeforeFulfillReturns() {
        let p = Promise<Int>()
        let ranInsideFulfill = Flag()
        let ranBeforeReturn = Flag()
        let handlerRan = Flag()
        _ = p.then(on: .immediate) { v -> Int in
            if ThreadMarker.isInside("fulfill") { ranInsideFulfill.set() }
            handlerRan.set()
            return v
        }
        let done = DispatchSemaphore(value: 0)
        Thread {
            ThreadMarker.inside("fulfill") { _ = p.fulfill(1) }
            if handlerRan.isSet { ranBeforeReturn.set() }
            done.signal()
        }.start()
        XCTAssertEqual(done.wait(timeout: .now() + testTimeoutSeconds), .success)
        XCTAssertTrue(ranBeforeReturn.isSet, "handler had not run when fulfill returned")
        XCTAssertTrue(ranInsideFulfill.isSet, "handler did not run on the settling thread inside fulfill")
    }

    func testImmediateRunsInlineInThenOnSettledPromise() {
        let ran = Flag()
        let child = ThreadMarker.inside("then") {
            Promise(value: 2).then(on: .immediate) { v -> Int in
                if ThreadMarker.isInside("then") { ran.set() }
                return v * 2
            }
        }
        XCTAssertTrue(ran.isSet, "handler did not run inline in then")
        XCTAssertEqual(child.state, .fulfilled)
        XCTAssertEqual(value(child), 4)
    }

    func testImmediateWhenCompleteRunsInlineOnSettledPromise() {
        let ran = Flag()
        Promise(value: 2).whenComplete(on: .immediate) { _ in ran.set() }
        XCTAssertTrue(ran.isSet)
    }

    /// An immediate observer of a settled promise registered from inside another immediate
    /// handler waits for that handler to return (it queues on the trampoline) instead of
    /// running in the middle of it.
    func testImmediateWhenCompleteOnSettledPromiseFromAHandlerRunsAfterIt() {
        let settled = Promise(value: 1)
        let trigger = Promise<Int>()
        let log = Recorder<String>()
        trigger.whenComplete(on: .immediate) { _ in
            settled.whenComplete(on: .immediate) { _ in log.append("inner") }
            log.append("outer returns")
        }
        trigger.fulfill(0)
        XCTAssertEqual(log.values, ["outer returns", "inner"])
    }

    /// What an immediate observer run at once on a settled promise triggers (here it
    /// settles a promise with an immediate observer) runs after it returns, and before
    /// `whenComplete` returns.
    func testWorkTriggeredByAnImmediateObserverOfASettledPromiseRunsAfterIt() {
        let settled = Promise(value: 1)
        let next = Promise<Int>()
        let log = Recorder<String>()
        next.whenComplete(on: .immediate) { _ in log.append("next") }
        settled.whenComplete(on: .immediate) { _ in
            next.fulfill(2)
            log.append("first returns")
        }
        XCTAssertEqual(log.values, ["first returns", "next"])
    }

    /// Work an immediate handler triggers (settling its child, which fires further
    /// immediate handlers) still completes before the outermost `fulfill` returns.
    func testImmediateChainSettlesCompletelyBeforeFulfillReturns() {
        let p = Promise<Int>()
        let inner = Promise<Int>()
        let end = p
            .then(on: .immediate) { $0 + 1 }
            .flatMap(on: .immediate) { v -> Promise<Int> in inner.fulfill(v * 10); return inner }
            .recover(on: .immediate) { _ in -1 }
            .then(on: .immediate) { $0 + 2 }
        p.fulfill(1)
        XCTAssertEqual(end.state, .fulfilled)
        XCTAssertEqual(value(end), 22)
    }

    func testImmediateHandlersRunInRegistrationOrder() {
        let p = Promise<Int>()
        let order = Recorder<Int>()
        for i in 0..<500 { p.whenComplete(on: .immediate) { _ in order.append(i) } }
        p.fulfill(0)
        XCTAssertEqual(order.values, Array(0..<500))
    }

    func testARootsInlineSlotTakenByALaterObserverKeepsRegistrationOrder() {
        // A root keeps its first `.immediate` or `.default` observer inline; a first one on
        // a queue goes to a box, and the next `.immediate` one takes the slot. Order holds.
        let queue = DispatchQueue(label: "PromiseTests.slotOrder")
        let p = Promise<Int>()
        let order = Recorder<String>()
        p.whenComplete(on: queue) { _ in order.append("queue") }
        for i in 1...3 { p.whenComplete(on: .immediate) { _ in order.append("inline \(i)") } }
        p.fulfill(1)
        XCTAssertEqual(order.values.filter { $0.hasPrefix("inline") }, ["inline 1", "inline 2", "inline 3"],
                       "the inline observers, in order, before fulfill returns")
        queue.sync {}
        XCTAssertEqual(order.values.count, 4)

        let q = Promise<Int>()
        let queued = Recorder<Int>()
        q.whenComplete(on: queue) { _ in queued.append(0) }
        q.whenComplete(on: .default) { _ in }  // takes the slot
        for i in 1...5 { q.whenComplete(on: queue) { _ in queued.append(i) } }
        q.fulfill(2)
        queue.sync {}
        XCTAssertEqual(queued.values, Array(0...5), "the queue's observers in registration order around the slot")
    }

    // MARK: Serial queues

    func testSerialQueueRunsHandlersInRegistrationOrder() {
        let queue = DispatchQueue(label: "PromiseTests.order")
        let p = Promise<Int>()
        let order = Recorder<Int>()
        var children: [Promise<Void>] = []
        for i in 0..<1_000 { children.append(p.then(on: queue) { _ in order.append(i) }) }
        DispatchQueue.global().async { p.fulfill(0) }
        for child in children { settle(child) }
        XCTAssertEqual(order.values, Array(0..<1_000))
    }

    func testSerialQueueRunsHandlersInRegistrationOrderOnSettledPromise() {
        let queue = DispatchQueue(label: "PromiseTests.orderSettled")
        let p = Promise(value: 0)
        let order = Recorder<Int>()
        for i in 0..<1_000 {
            if i.isMultiple(of: 3) {
                p.whenComplete(on: queue) { _ in order.append(i) }
            } else {
                _ = p.then(on: queue) { _ in order.append(i) }
            }
        }
        queue.sync {}  // whenComplete handlers leave nothing to wait on: drain the queue
        XCTAssertEqual(order.values, Array(0..<1_000))
    }

    func testHandlerRunsOnTheGivenDispatchQueue() {
        let queue = DispatchQueue(label: "PromiseTests.specific")
        let key = DispatchSpecificKey<String>()
        queue.setSpecific(key: key, value: "mine")
        let child = Promise(value: 1).then(on: queue) { _ in DispatchQueue.getSpecific(key: key) }
        XCTAssertEqual(value(child), "mine")
        let errorSide = Promise<Int>(error: TestError(1)).recover(on: queue) { _ in
            DispatchQueue.getSpecific(key: key) == "mine" ? 1 : 0
        }
        XCTAssertEqual(value(errorSide), 1)
    }

    // MARK: Concurrent queues: barrier vs .concurrent

    /// Handlers registered with `then(on: concurrentQueue)` get a barrier: even with work
    /// in each, no two of them are ever inside their bodies at once.
    func testThenOnConcurrentQueueNeverOverlaps() {
        let queue = DispatchQueue(label: "PromiseTests.barrier", attributes: .concurrent)
        let tracker = ConcurrencyTracker()
        let p = Promise<Int>()
        var children: [Promise<Void>] = []
        for _ in 0..<200 {
            children.append(p.then(on: queue) { _ in tracker.track(workMicroseconds: 100) })
        }
        p.fulfill(1)
        for child in children { settle(child) }
        XCTAssertEqual(tracker.entries, 200)
        XCTAssertEqual(tracker.maxConcurrency, 1, "handlers on one concurrent queue overlapped")
    }

    /// The barrier holds across promises: handlers of different promises, settled from
    /// different threads, on one concurrent queue never overlap either.
    func testHandlersOfDifferentPromisesOnOneConcurrentQueueNeverOverlap() {
        let queue = DispatchQueue(label: "PromiseTests.barrier2", attributes: .concurrent)
        let tracker = ConcurrencyTracker()
        let promises = (0..<8).map { _ in Promise<Int>() }
        var children: [Promise<Void>] = []
        for p in promises {
            for _ in 0..<25 {
                children.append(p.then(on: queue) { _ in tracker.track(workMicroseconds: 100) })
                p.whenComplete(on: queue) { _ in tracker.track(workMicroseconds: 20) }
            }
        }
        DispatchQueue.concurrentPerform(iterations: promises.count) { i in promises[i].fulfill(i) }
        for child in children { settle(child) }
        queue.sync(flags: .barrier) {}  // the whenComplete handlers
        XCTAssertEqual(tracker.entries, 400)
        XCTAssertEqual(tracker.maxConcurrency, 1)
    }

    /// `.concurrent(queue)` drops the barrier; overlap is allowed, not required, so the
    /// test only asserts that every handler runs, once.
    func testConcurrentContextRunsAllHandlers() {
        let queue = DispatchQueue(label: "PromiseTests.noBarrier", attributes: .concurrent)
        let tracker = ConcurrencyTracker()
        let p = Promise<Int>()
        var children: [Promise<Int>] = []
        for i in 0..<200 {
            children.append(p.then(on: .concurrent(queue)) { v -> Int in
                tracker.track(workMicroseconds: 50)
                return v + i
            })
        }
        p.fulfill(1)
        for (i, child) in children.enumerated() { XCTAssertEqual(value(child), 1 + i) }
        XCTAssertEqual(tracker.entries, 200)
        print("testConcurrentContextRunsAllHandlers: max concurrency \(tracker.maxConcurrency)")
    }

    // MARK: OperationQueue, custom contexts

    #if Foundation  // the package trait, on by default
    func testOperationQueueRunsHandler() {
        let operationQueue = OperationQueue()
        operationQueue.maxConcurrentOperationCount = 1
        let ranOnQueue = Flag()
        let child = Promise(value: 3).then(on: operationQueue) { v -> Int in
            if OperationQueue.current === operationQueue { ranOnQueue.set() }
            return v + 1
        }
        XCTAssertEqual(value(child), 4)
        XCTAssertTrue(ranOnQueue.isSet, "handler did not run on the operation queue")
    }
    #endif

    func testContextsOfEverySizeRunTheirHandlersAndAreReleased() {
        // A derived promise keeps a context of up to two words inline and a larger one in a
        // box: each runs its handler once, on its queue, and is released with the promise,
        // sent or not.
        let queue = DispatchQueue(label: "PromiseTests.sizedContexts")
        let key = DispatchSpecificKey<Bool>()
        queue.setSpecific(key: key, value: true)
        XCTAssertEqual(sizedContextMakers.map(\.size), [8, 16, 32])
        for (name, _, make) in sizedContextMakers {
            weak var sentOwner: ContextOwner?
            weak var unsentOwner: ContextOwner?
            do {
                let owner = ContextOwner(queue: queue), otherOwner = ContextOwner(queue: queue)
                sentOwner = owner
                unsentOwner = otherOwner
                let child = Promise(value: 2).then(on: make(owner)) { v -> Bool in
                    DispatchQueue.getSpecific(key: key) == true && v == 2
                }
                XCTAssertEqual(value(child), true, "\(name): the handler ran on its queue")
                // Never sent: a cancelled parent gives a handler without an error side nothing
                // to run, so the child is cancelled in place.
                let cancelled = Promise<Int>()
                _ = cancelled.then(on: make(otherOwner)) { $0 }
                cancelled.cancel()
            }
            queue.sync {}
            XCTAssertNil(sentOwner, "\(name): a sent context is released")
            XCTAssertNil(unsentOwner, "\(name): a context never sent is released with its promise")
        }
    }

    func testObserverBoxesOnContextsOfEverySizeRunOnTheirQueueAndReleaseThem() {
        // A `whenComplete` that is not a root's first keeps its context the same way, in its
        // box: it runs there once and lets go of it.
        let queue = DispatchQueue(label: "PromiseTests.sizedBoxes")
        let key = DispatchSpecificKey<Bool>()
        queue.setSpecific(key: key, value: true)
        XCTAssertEqual(sizedContextMakers.map(\.size), [8, 16, 32])
        for (name, _, make) in sizedContextMakers {
            weak var weakOwner: ContextOwner?
            let onQueue = Flag()
            do {
                let owner = ContextOwner(queue: queue)
                weakOwner = owner
                let promise = Promise<Int>()
                promise.whenComplete(on: .immediate) { _ in }  // takes the root's own slot
                promise.whenComplete(on: make(owner)) { result in
                    if DispatchQueue.getSpecific(key: key) == true, case .success(2) = result { onQueue.set() }
                }
                promise.fulfill(2)
            }
            queue.sync {}
            XCTAssertTrue(onQueue.isSet, "\(name): the observer ran on its queue with the value")
            XCTAssertNil(weakOwner, "\(name): the box let go of its context")
        }
    }

    func testCustomContextRunsEveryHandlerThroughExecuteOnce() {
        let context = CountingContext()
        let key = DispatchSpecificKey<Bool>()
        context.queue.setSpecific(key: key, value: true)
        let onContext = Counter()
        let note: @Sendable () -> Void = {
            if DispatchQueue.getSpecific(key: key) == true { onContext.increment() }
        }
        let p = Promise<Int>()
        let a = p.then(on: context) { v -> Int in note(); return v + 1 }
        let b = p.flatMap(on: context) { v -> Promise<Int> in note(); return Promise(value: v + 2) }
        let c = p.always(on: context) { note() }
        let d = p.validate(on: context) { _ in note(); return true }
        let e = p.then(on: context, { v -> Int in note(); return v }, { _ in 0 })
        let done = expectation(description: "whenComplete")
        p.whenComplete(on: context) { _ in note(); done.fulfill() }
        XCTAssertEqual(context.calls.value, 0, "execute called before the promise settled")
        p.fulfill(1)
        XCTAssertEqual(value(a), 2)
        XCTAssertEqual(value(b), 3)
        XCTAssertEqual(value(c), 1)
        XCTAssertEqual(value(d), 1)
        XCTAssertEqual(value(e), 1)
        wait(for: [done], timeout: testTimeoutSeconds)
        XCTAssertEqual(context.calls.value, 6)
        XCTAssertEqual(onContext.value, 6)
    }

    func testCustomContextRunsErrorHandlersThroughExecute() {
        let context = CountingContext()
        let p = Promise<Int>()
        let a = p.recover(on: context) { _ in 1 }
        let b = p.recover(on: context) { _ in Promise(value: 2) }
        let c = p.mapError(on: context) { WrappedError(underlying: $0) }
        let d = p.catch(on: context) { _ in }
        p.reject(TestError(3))
        XCTAssertEqual(value(a), 1)
        XCTAssertEqual(value(b), 2)
        XCTAssertTrue(error(c) is WrappedError)
        XCTAssertEqual(error(d) as? TestError, TestError(3))
        XCTAssertEqual(context.calls.value, 4)
    }

    // MARK: .main and .default

    func testMainContextRunsOnMainThread() {
        XCTAssertTrue(Thread.isMainThread, "XCTest is expected to run tests on the main thread")
        let p = Promise<Int>()
        let onMain = Flag()
        let done = expectation(description: "main handler")
        _ = p.then(on: .main) { _ in
            if Thread.isMainThread { onMain.set() }
            done.fulfill()
        }
        DispatchQueue.global().async { p.fulfill(1) }
        wait(for: [done], timeout: testTimeoutSeconds)
        XCTAssertTrue(onMain.isSet, "handler on .main ran off the main thread")
    }

    func testMainContextDoesNotRunInsideThenOnSettledPromise() {
        let ranInline = Flag()
        let ranOnMain = Flag()
        let done = expectation(description: "main handler")
        ThreadMarker.inside("then") {
            Promise(value: 1).whenComplete(on: .main) { _ in
                if ThreadMarker.isInside("then") { ranInline.set() }
                if Thread.isMainThread { ranOnMain.set() }
                done.fulfill()
            }
        }
        XCTAssertFalse(ranInline.isSet)
        wait(for: [done], timeout: testTimeoutSeconds)
        XCTAssertFalse(ranInline.isSet, "handler on .main ran inside whenComplete")
        XCTAssertTrue(ranOnMain.isSet)
    }

    func testDefaultContextRunsOffTheCallingThread() {
        XCTAssertTrue(Thread.isMainThread)
        let p = Promise(value: 1)
        let child = p.then(on: .default) { _ in Thread.isMainThread }
        XCTAssertEqual(value(child), false, "a .default handler ran on the calling (main) thread")
        let implicit = p.then { _ in Thread.isMainThread }  // `on:` left out means .default
        XCTAssertEqual(value(implicit), false)
    }
}

/// Contexts of one, two and four words: the first two inline, the last boxed (the tests
/// check the sizes, so that each path is the one its name says).
private let sizedContextMakers: [(name: String, size: Int, make: @Sendable (ContextOwner) -> any ExecutionContext)] = [
    ("one word", MemoryLayout<NarrowContext>.size, { NarrowContext(owner: $0) }),
    ("two words", MemoryLayout<WideContext>.size, { WideContext(owner: $0) }),
    ("four words, boxed", MemoryLayout<LargeContext>.size, { LargeContext(owner: $0) }),
]

/// A class a context holds, to see when the context is released.
private final class ContextOwner: Sendable {
    let queue: DispatchQueue
    init(queue: DispatchQueue) { self.queue = queue }
}

/// One word: a reference, inline.
private struct NarrowContext: ExecutionContext {
    let owner: ContextOwner
    func execute(_ work: @escaping @Sendable () -> Void) { owner.queue.async(execute: work) }
}

/// Four words and more: boxed.
private struct LargeContext: ExecutionContext {
    let owner: ContextOwner
    let extra: (Int, Int, Int) = (1, 0, 0)
    func execute(_ work: @escaping @Sendable () -> Void) { owner.queue.async(execute: work) }
}

/// Two words: a reference and a count, inline.
private struct WideContext: ExecutionContext {
    let owner: ContextOwner
    let count = 7
    func execute(_ work: @escaping @Sendable () -> Void) { owner.queue.async(execute: work) }
}

/// A context that breaks its contract by running each piece of work twice, on two threads
/// at once or one after the other.
private struct RunsTwiceContext: ExecutionContext {
    let concurrently: Bool

    func execute(_ work: @escaping @Sendable () -> Void) {
        if concurrently {
            // Both runs released at once, so that they overlap.
            let barrier = SpinBarrier(parties: 2)
            for _ in 0..<2 {
                Thread {
                    barrier.arriveAndWait(round: 0)
                    work()
                }.start()
            }
        } else {
            DispatchQueue.global().async { work(); work() }
        }
    }
}

extension ContextTests {
    /// A context that runs work twice gets each observation once, not a crash (a
    /// `whenComplete` box unwrapped the source the first run took), as a `then` handler
    /// does, and a bounded fan-out starts each input once (a second step for a slot
    /// overcounted and trapped).
    func testAContextThatRunsWorkTwiceRunsEachObservationOnce() {
        runInChildProcess {
            for concurrently in [false, true] {
                let context = RunsTwiceContext(concurrently: concurrently)
                let completions = Counter(), handlers = Counter(), starts = Counter()
                let settled = Promise<Int>()
                settled.whenComplete(on: context) { _ in completions.increment() }
                let child = settled.then(on: context) { value -> Int in
                    handlers.increment()
                    return value + 1
                }
                let all = Promise<Int>.all(0..<20, maxConcurrent: 3, on: context) { input -> Promise<Int> in
                    starts.increment()
                    return Promise(value: input * 2)
                }
                settled.fulfill(1)
                XCTAssertEqual(value(all), (0..<20).map { $0 * 2 })
                XCTAssertEqual(value(child), 2)
                XCTAssertTrue(eventually { completions.value == 1 })
                // Let the second runs land.
                _ = try? Promise<Void>.after(.milliseconds(100)).wait(timeout: testTimeout)
                XCTAssertEqual(completions.value, 1, "concurrently: \(concurrently)")
                XCTAssertEqual(handlers.value, 1, "concurrently: \(concurrently)")
                XCTAssertEqual(starts.value, 20, "concurrently: \(concurrently)")
            }
        }
    }
}

extension ContextTests {
    /// The same for a `then` handler on many rounds (two overlapping runs released the
    /// handler twice: a crash), for `Promise(on:)`'s work, and for `retry`'s attempts and
    /// `shouldRetry` (a second attempt started, which the output's cancel then missed).
    func testAContextThatRunsWorkTwiceRunsEachHandlerAndAttemptOnce() {
        runInChildProcess {
            for concurrently in [false, true] {
                let context = RunsTwiceContext(concurrently: concurrently)
                let handlers = Counter()
                for round in 0..<300 {
                    let parent = Promise<Int>()
                    let child = parent.then(on: context) { value -> Int in
                        handlers.increment()
                        return value + 1
                    }
                    parent.fulfill(round)
                    XCTAssertEqual(value(child), round + 1)
                }
                let works = Counter()
                let made = Promise<Int>(on: context) {
                    works.increment()
                    Thread.sleep(forTimeInterval: 0.01)
                    return 1
                }
                XCTAssertEqual(value(made), 1)
                let bodies = Counter(), asked = Counter()
                let attempts = Recorder<Promise<Int>>()
                let output = Promise<Int>.retry(attempts: 3, backoff: .fixed(.zero), on: context, shouldRetry: { _ in
                    asked.increment()
                    return true
                }) {
                    let attempt = bodies.increment() == 1 ? Promise<Int>(error: TestError(1)) : Promise<Int>()
                    attempts.append(attempt)
                    return attempt
                }
                XCTAssertTrue(eventually { bodies.value >= 2 })
                _ = try? Promise<Void>.after(.milliseconds(100)).wait(timeout: testTimeout)
                output.cancel()
                XCTAssertEqual(handlers.value, 300, "concurrently: \(concurrently)")
                XCTAssertEqual(works.value, 1, "concurrently: \(concurrently)")
                XCTAssertEqual(bodies.value, 2, "concurrently: \(concurrently)")
                XCTAssertEqual(asked.value, 1, "concurrently: \(concurrently)")
                for attempt in attempts.values where !attempt.isRejected {
                    XCTAssertTrue(attempt.isCancelled, "an attempt the output's cancel missed")
                }
            }
        }
    }
}


/// Runs work inside `execute`, always: against the contract ("later, never inside the
/// call"), as an executor that runs work at once does.
private struct RunsInlineContext: ExecutionContext {
    func execute(_ work: @escaping @Sendable () -> Void) { work() }
}

/// Runs work inside `execute` when called on its own queue, else queues it: the common
/// "inline if already on my loop" executor.
private final class QueueOrInlineContext: ExecutionContext, @unchecked Sendable {
    let queue = DispatchQueue(label: "PromiseTests.QueueOrInline")
    private let key = DispatchSpecificKey<Int>()

    init() { queue.setSpecific(key: key, value: 1) }

    var isOnQueue: Bool { DispatchQueue.getSpecific(key: key) == 1 }

    func execute(_ work: @escaping @Sendable () -> Void) {
        if isOnQueue { work() } else { queue.async(execute: work) }
    }
}

/// Runs work inside `execute` under its lock, and knows whether a call is running: a
/// synchronous executor that serialises its work (against the contract, which wants it
/// later).
private final class LockedInlineContext: ExecutionContext, @unchecked Sendable {
    private let lock = NSRecursiveLock()
    private var running = 0

    var isRunning: Bool { lock.withLock { running > 0 } }

    func execute(_ work: @escaping @Sendable () -> Void) {
        lock.withLock {
            running += 1
            work()
            running -= 1
        }
    }
}

extension ContextTests {
    /// A context that runs work inside `execute` cannot make a long chain overflow the
    /// stack (it crashed at 2,000 to 5,000 steps): handlers on it, and `whenComplete`
    /// observers on it that each settle the next promise, 20,000 deep, each run once, in
    /// order, on the thread the context ran them on.
    func testAContextThatRunsWorkInlineCannotOverflowTheStack() {
        runInChildProcess {
            let depth = 20_000
            /// A chain of `depth` handlers on `context`, settled: its end's value, and how
            /// many handlers `isInPlace` said ran where they should not.
            func chain(on context: some ExecutionContext, isInPlace: @escaping @Sendable () -> Bool) -> (Int?, Int) {
                let misplaced = Counter()
                let start = Promise<Int>()
                var step = start
                for _ in 0..<depth {
                    step = step.then(on: context) { value -> Int in
                        if !isInPlace() { misplaced.increment() }
                        return value + 1
                    }
                }
                start.fulfill(0)
                return (value(step), misplaced.value)
            }
            XCTAssertEqual(chain(on: RunsInlineContext()) { true }.0, depth)

            let links = (0...depth).map { _ in Promise<Int>() }
            let order = Recorder<Int>()
            for index in 0..<depth {
                let next = links[index + 1]
                links[index].whenComplete(on: RunsInlineContext()) { result in
                    order.append(index)
                    next.resolve(result.map { $0 + 1 })
                }
            }
            links[0].fulfill(0)
            XCTAssertEqual(value(links[depth]), depth)
            XCTAssertEqual(order.values, Array(0..<depth), "observers ran out of order")

            let loop = QueueOrInlineContext()
            let onLoop = chain(on: loop) { loop.isOnQueue }
            XCTAssertEqual(onLoop.0, depth)
            XCTAssertEqual(onLoop.1, 0, "handlers ran off the context's queue")

            // Each handler still runs inside its context's `execute`, however deep.
            let locked = LockedInlineContext()
            let inLock = chain(on: locked) { locked.isRunning }
            XCTAssertEqual(inLock.0, depth)
            XCTAssertEqual(inLock.1, 0, "handlers ran outside their context's execute")
        }
    }
}

// MARK: A context that drops the work

/// Keeps the work it is given until the test runs it or lets go of it unrun (an executor
/// that shuts down with work queued).
private final class HoldingContext: ExecutionContext, @unchecked Sendable {
    private let lock = NSLock()
    private var held: [@Sendable () -> Void] = []

    func execute(_ work: @escaping @Sendable () -> Void) {
        lock.withLock { held.append(work) }
    }

    var count: Int { lock.withLock { held.count } }

    /// Lets go of the work unrun.
    func dropAll() {
        let works = lock.withLock { () -> [@Sendable () -> Void] in
            defer { held = [] }
            return held
        }
        _ = consume works
    }

    /// Runs the work, once each, on this thread.
    func runAll() {
        let works = lock.withLock { () -> [@Sendable () -> Void] in
            defer { held = [] }
            return held
        }
        for work in works { work() }
    }
}

/// An executor that, shut down, lets go of its queued work inside its own lock and drops
/// any work handed to it later.
private final class ShutDownContext: ExecutionContext, @unchecked Sendable {
    private let lock = NSLock()
    private var held: [@Sendable () -> Void] = []
    private var isShutDown = false

    func execute(_ work: @escaping @Sendable () -> Void) {
        lock.withLock {
            if !isShutDown { held.append(work) }
        }
    }

    func shutDown() {
        lock.withLock {
            isShutDown = true
            held.removeAll()  // the work is released here, inside the lock
        }
    }
}

private func isBroken(_ error: (any Error)?) -> Bool {
    if case PromiseError.brokenPromise? = error as? PromiseError { return true }
    return false
}

extension ContextTests {
    /// A context that lets go of a handler unrun (an executor shut down) breaks the child
    /// the handler would have settled, for every form of continuation and whether the
    /// parent settled before or after the registration; the child lets go of the parent
    /// and of the handler's captures then, not when it dies. Before, a held child stayed
    /// pending for ever.
    func testAContextThatDropsAHandlerBreaksItsChild() {
        let tracker = LifeTracker()
        let context = HoldingContext()
        var pendingParent: Promise<Int>? = Promise<Int>()
        weak let weakParent = pendingParent
        let failing = Promise<Int>()
        var children: [Promise<Int>] = []
        for parent in [pendingParent!, Promise(value: 1)] {
            let capture = Payload(bytes: [1], tracker: tracker)
            children.append(parent.then(on: context) { $0 + capture.bytes.count })
            children.append(parent.then(on: context) { _ in Promise(value: capture.bytes.count) })
            children.append(parent.always(on: context) { _ = capture })
        }
        let capture = Payload(bytes: [2], tracker: tracker)
        children.append(failing.recover(on: context) { _ in capture.bytes.count })
        _ = consume capture
        pendingParent?.fulfill(1)
        pendingParent = nil
        failing.reject(PromiseError.validationFailure)
        XCTAssertEqual(context.count, children.count, "every handler went to the context")
        XCTAssertNotNil(weakParent, "the queued handlers hold their parent")
        context.dropAll()
        for (index, child) in children.enumerated() {
            XCTAssertTrue(isBroken(error(child)), "child \(index): \(child) instead of brokenPromise")
        }
        XCTAssertTrue(eventually { tracker.alive == 0 }, "the dropped handlers' captures are kept")
        XCTAssertTrue(eventually { weakParent == nil }, "children whose handlers were dropped keep their parent")
        // A dropped `Promise(on:)` work breaks its promise the same way.
        let work = Promise<Int>(on: DroppingContext()) { 1 }
        XCTAssertTrue(isBroken(error(work)), "Promise(on:) whose work was dropped: \(work)")
    }

    /// A handler that would only have passed its parent's outcome through (`then` on a
    /// rejected parent, `recover`, `mapError` or `catch` on a fulfilled one) runs no user
    /// code, so a context that drops it (an `OperationQueue` shut down) takes nothing from
    /// the child: it passes the value or the error through, as the handler would have,
    /// and lets go of the parent and the captures. Before, it broke like the others.
    func testADroppedHandlerThatWouldOnlyPassTheOutcomeThroughPassesItThrough() {
        struct Boom: Error {}
        let tracker = LifeTracker()
        let context = HoldingContext()
        let fulfilled = Promise(value: 7)
        let rejected = Promise<Int>(error: Boom())
        let capture = Payload(bytes: [1], tracker: tracker)
        let passingValue = [
            fulfilled.recover(on: context) { _ in capture.bytes.count },
            fulfilled.mapError(on: context) { _ = capture; return $0 },
            fulfilled.catch(on: context) { _ in _ = capture },
        ]
        let passingError = [
            rejected.then(on: context) { $0 + capture.bytes.count },
            rejected.flatMap(on: context) { _ in Promise(value: capture.bytes.count) },
            rejected.validate(on: context) { _ in capture.bytes.isEmpty },
        ]
        _ = consume capture
        XCTAssertEqual(context.count, passingValue.count + passingError.count, "every handler went to the context")
        context.dropAll()
        for (index, child) in passingValue.enumerated() {
            XCTAssertEqual(value(child), 7, "child \(index) did not pass the value through")
        }
        for (index, child) in passingError.enumerated() {
            XCTAssertTrue(error(child) is Boom, "child \(index) did not pass the error through")
        }
        XCTAssertTrue(eventually { tracker.alive == 0 }, "the dropped handlers' captures are kept")
    }

    /// A child settled otherwise before its context drops the handler keeps that outcome:
    /// cancelled, or fulfilled by its holder. A context that runs its work late runs it,
    /// and breaks nothing.
    func testADroppedHandlerLosesToASettleThatCameFirst() {
        let context = HoldingContext()
        let parent = Promise<Int>()
        let cancelled = parent.then(on: context) { $0 }
        let fulfilled = parent.then(on: context) { $0 }
        let ran = parent.then(on: context) { $0 + 1 }
        parent.fulfill(1)
        cancelled.cancel()
        fulfilled.fulfill(7)
        context.runAll()
        XCTAssertTrue(cancelled.isCancelled)
        XCTAssertEqual(value(fulfilled), 7)
        XCTAssertEqual(value(ran), 2)

        let again = parent.then(on: context) { $0 }
        again.cancel()
        context.dropAll()
        _ = try? Promise<Void>.after(.milliseconds(50)).wait(timeout: testTimeout)  // the break, had it come
        XCTAssertTrue(again.isCancelled, "a cancelled child whose handler was dropped: \(again)")
    }

    /// A context that lets go of its work inside its own lock gets no call back from the
    /// break while it holds it: the broken child's own children, on that context and on
    /// `.immediate`, are handled after the context's call returned (a break run inside
    /// it handed the child on `ctx` back to `execute`, which waited for its own lock).
    func testADroppedHandlerBreaksOutsideTheContextsCall() {
        let context = ShutDownContext()
        let parent = Promise<Int>()
        let child = parent.then(on: context) { $0 }
        let onSameContext = child.then(on: context) { $0 }
        let inline = child.recover(on: .immediate) { _ in -1 }
        parent.fulfill(1)
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            context.shutDown()
            done.signal()
        }
        XCTAssertEqual(done.wait(timeout: .now() + 5), .success, "the shutdown deadlocked in the break")
        XCTAssertTrue(isBroken(error(child)))
        XCTAssertTrue(isBroken(error(onSameContext)), "dropped by the context that is shut down")
        XCTAssertEqual(value(inline), -1)
    }

    /// The same for a run (`retry`, `sequence`, `all(_:maxConcurrent:)`) whose step the
    /// context lets go of inside its lock: its output breaks, and the output's `.immediate`
    /// observer runs, after the context's call returned. Before, a retry's output broke
    /// inside that call every time (the context's release of the work was the run's last
    /// reference), and a fan-out's whenever its release came after the library's own
    /// watch of the work had let go.
    func testADroppedRunBreaksOutsideTheContextsCall() {
        let runs: [(String, (ShutDownContext) -> Promise<Int>)] = [
            ("retry", { context in Promise<Int>.retry(attempts: 3, on: context) { Promise(value: 1) } }),
            ("sequence", { context in
                Promise<Int>.sequence(on: context, [1, 2]) { Promise(value: $0) }.then(on: .immediate) { $0.count } }),
            ("all(maxConcurrent: 2)", { context in
                Promise<Int>.all([1, 2, 3], maxConcurrent: 2, on: context) { Promise(value: $0) }.then(on: .immediate) { $0.count } }),
        ]
        for (name, makeRun) in runs {
            let inside = Counter()
            for round in 0..<200 {
                let context = ShutDownContext()
                let output = makeRun(context)
                let observed = DispatchSemaphore(value: 0)
                output.whenComplete(on: .immediate) { _ in
                    if ThreadMarker.isInside("ShutDownContext.shutDown") { inside.increment() }
                    observed.signal()
                }
                ThreadMarker.inside("ShutDownContext.shutDown") { context.shutDown() }
                XCTAssertEqual(observed.wait(timeout: .now() + testTimeoutSeconds), .success, "\(name), round \(round): never broke")
                XCTAssertTrue(isBroken(error(output)), "\(name), round \(round): \(output)")
            }
            XCTAssertEqual(inside.value, 0, "\(name): the output broke inside the context's call in \(inside.value) of 200 rounds")
        }
    }

    /// The break does not wait for a thread of Dispatch's global pool: `.default` handlers
    /// blocked in `wait()` on the child whose handler was dropped hold that pool, and get
    /// the break all the same (before, from the default queue, it came seconds late or
    /// after they had timed out).
    func testADroppedHandlerBreaksWhileTheGlobalPoolIsBlocked() {
        let context = HoldingContext()
        let parent = Promise<Int>()
        let child = parent.then(on: context) { $0 }
        parent.fulfill(1)
        let blocked = Counter()
        let waiters = (0..<32).map { _ in
            Promise(value: 0).then(on: .default) { _ -> Bool in
                blocked.increment()
                do { _ = try child.wait(timeout: .seconds(8)) } catch PromiseError.brokenPromise { return true } catch {}
                return false
            }
        }
        _ = eventually(timeout: 2) { blocked.value >= 8 }  // the pool's threads are taken
        context.dropAll()
        for waiter in waiters {
            XCTAssertEqual(try? waiter.wait(timeout: .seconds(20)), true, "a blocked waiter timed out before the break")
        }
    }

    /// A child locked in by its holder (`resolve(with:)`) before its context let go of its
    /// handler settles as the promise it follows, and lets go of its parent and of the
    /// handler's captures at once, as the work would have; so does the error side of a
    /// cancelled parent that the context let go of (before, both kept them while the
    /// child was held).
    func testADroppedHandlerLetsGoOfItsParentAndCapturesWhateverTheChildsState() {
        let tracker = LifeTracker()
        let context = HoldingContext()
        var parent: Promise<Int>? = Promise<Int>()
        weak let weakParent = parent
        let capture = Payload(bytes: [1], tracker: tracker)
        let following = parent!.then(on: context) { $0 + capture.bytes.count }
        let other = Promise<Int>()
        following.resolve(with: other)
        let cancelled = Promise<Int>()
        let cleanUp = cancelled.recover(on: context) { _ in capture.bytes.count }
        _ = consume capture
        parent?.fulfill(1)
        parent = nil
        cancelled.cancel()
        XCTAssertEqual(context.count, 2)
        context.dropAll()
        XCTAssertTrue(eventually { tracker.alive == 0 }, "the dropped handlers' captures are kept")
        XCTAssertTrue(eventually { weakParent == nil }, "the locked-in child keeps its parent")
        XCTAssertTrue(following.isPending, "locked in: it settles as the promise it follows")
        other.fulfill(5)
        XCTAssertEqual(value(following), 5)
        XCTAssertTrue(cleanUp.isCancelled)
    }

    #if Foundation  // the package trait, on by default
    /// `cancelAllOperations()` at shutdown cancels the operations that carry handlers
    /// before they start: each child breaks once the queue lets go of its operation,
    /// instead of waiting for ever.
    func testCancelledOperationsBreakTheChildrenTheyCarried() {
        let queue = OperationQueue()
        queue.isSuspended = true
        let parent = Promise<Int>()
        let children = (0..<5).map { index in parent.then(on: queue) { $0 + index } }
        let work = Promise<Int>(on: queue) { 1 }
        parent.fulfill(1)
        queue.cancelAllOperations()
        queue.isSuspended = false
        for child in children + [work] {
            XCTAssertTrue(isBroken(error(child)), "\(child) instead of brokenPromise")
        }
    }
    #endif
}
