#if SwiftNIO
import NIOCore
import NIOPosix
import Promise
import PromiseNIO
import XCTest

private struct Boom: Error, Equatable {}

private final class WeakReference {
    weak var object: AnyObject?
    init(_ object: AnyObject) { self.object = object }
}

final class PromiseNIOTests: XCTestCase {
    private var group: MultiThreadedEventLoopGroup!

    override func setUp() {
        group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
    }

    override func tearDown() {
        try? group.syncShutdownGracefully()
        group = nil
    }

    /// A promise bridged from a future or a scheduled task names where the caller made it
    /// (debug builds of the library record it), not the bridge's own source.
    func testBridgedPromisesNameWhereTheCallerMadeThem() throws {
        let loop = group.next()
        let future = loop.makePromise(of: Int.self)
        let made: [(Promise<Int>, UInt)] = [
            (Promise(future.futureResult), #line),
            (future.futureResult.promise(), #line),
            (Promise(loop.scheduleTask(in: .seconds(60)) { 1 }), #line),
            (loop.scheduleTask(in: .seconds(60)) { 1 }.promise(), #line),
        ]
        for (promise, line) in made {
            #if DEBUG
            XCTAssertTrue(promise.debugDescription.contains("made at \(#fileID):\(line)"), promise.debugDescription)
            #else
            XCTAssertFalse(promise.debugDescription.contains("made at"), promise.debugDescription)
            #endif
            promise.cancel()
        }
        future.succeed(1)
    }

    func testHandlersRunOnTheLoop() throws {
        let loop = group.next()
        let onLoop = Promise<Int>(on: .default) { 1 }.then(on: .eventLoop(loop)) { _ in loop.inEventLoop }
        XCTAssertTrue(try onLoop.wait(timeout: .seconds(5)))
        let viaProperty = Promise(value: 2).then(on: loop.executionContext) { _ in loop.inEventLoop }
        XCTAssertTrue(try viaProperty.wait(timeout: .seconds(5)))
    }

    func testNoZalgoOnTheLoopItself() throws {
        let loop = group.next()
        // Registered on the loop, on a settled promise: the handler must not run inside `then`.
        let ranInside = try loop.submit { () -> Bool in
            final class Flag: @unchecked Sendable { var value = false }
            let flag = Flag()
            Promise(value: 1).then(on: .eventLoop(loop)) { _ in flag.value = true }
            return flag.value
        }.wait()
        XCTAssertFalse(ranInside)
    }

    func testHandlersOnOneLoopRunInRegistrationOrder() throws {
        let loop = group.next()
        let ready = Promise<Void>()
        let steps = (0..<100).map { index in ready.then(on: .eventLoop(loop)) { index } }
        final class Order: @unchecked Sendable { var seen: [Int] = [] }
        let order = Order()
        let recorded = steps.map { step in step.then(on: .eventLoop(loop)) { order.seen.append($0) } }
        ready.fulfill(())
        for step in recorded { try step.wait(timeout: .seconds(5)) }
        XCTAssertEqual(order.seen, Array(0..<100))
    }

    func testFutureResultSucceedsFailsAndCancels() throws {
        let loop = group.next()
        XCTAssertEqual(try Promise(value: 7).futureResult(on: loop).wait(), 7)

        let pending = Promise<Int>()
        let future = pending.futureResult(on: loop)
        pending.fulfill(8)
        XCTAssertEqual(try future.wait(), 8)

        XCTAssertThrowsError(try Promise<Int>(error: Boom()).futureResult(on: loop).wait()) {
            XCTAssertEqual($0 as? Boom, Boom())
        }

        let cancelled = Promise<Int>()
        let cancelledFuture = cancelled.futureResult(on: loop)
        cancelled.cancel()
        XCTAssertThrowsError(try cancelledFuture.wait()) { XCTAssertTrue($0 is CancellationError) }
    }

    func testFutureOfAnAbandonedPromiseFails() throws {
        let loop = group.next()
        var promise: Promise<Int>? = Promise<Int>()
        let future = promise!.futureResult(on: loop)
        promise = nil  // nothing can settle it any more
        XCTAssertThrowsError(try future.wait()) {
            guard case PromiseError.brokenPromise = $0 else { return XCTFail("got \($0)") }
        }
    }

    func testPromiseFromFuture() throws {
        let loop = group.next()
        let succeeded = loop.makePromise(of: Int.self)
        let fromFuture = Promise(succeeded.futureResult).then(on: .immediate) { ($0, loop.inEventLoop) }
        succeeded.succeed(9)
        let (value, onLoop) = try fromFuture.wait(timeout: .seconds(5))
        XCTAssertEqual(value, 9)
        XCTAssertTrue(onLoop, "settles on the future's loop, so .immediate handlers run there")

        let failed = loop.makeFailedFuture(Boom()).map { (_: Void) in 0 }.promise()
        XCTAssertThrowsError(try failed.wait(timeout: .seconds(5))) { XCTAssertEqual($0 as? Boom, Boom()) }
    }

    func testCancellingAPromiseFromAFutureIgnoresTheLateCompletion() throws {
        let loop = group.next()
        let nio = loop.makePromise(of: Int.self)
        let promise = Promise(nio.futureResult)
        promise.cancel()
        nio.succeed(1)
        // The completion reaches the promise on the loop: wait until it has, then look.
        XCTAssertEqual(try nio.futureResult.wait(), 1)
        try loop.submit {}.wait()
        XCTAssertTrue(promise.isCancelled)
    }

    func testCancellingAPromiseFromAFutureStopsWaitingAtOnce() throws {
        let loop = group.next()
        let nio = loop.makePromise(of: Int.self)
        let promise = Promise(nio.futureResult)
        let child = promise.then(on: .immediate) { $0 + 1 }
        final class Flag: @unchecked Sendable { var value = false }
        let stopped = Flag()
        promise.onCancel { stopped.value = true }
        promise.cancel()
        // Settled before the future completes: nobody waits for NIO any more.
        XCTAssertTrue(promise.isCancelled)
        XCTAssertTrue(child.isCancelled)
        XCTAssertTrue(stopped.value, "onCancel is where the caller stops the work NIO cannot cancel")
        nio.succeed(1)
        XCTAssertThrowsError(try child.wait(timeout: .seconds(5))) { XCTAssertTrue($0 is CancellationError) }
    }

    func testCancellingAPromiseFromAScheduledTaskCancelsTheTask() throws {
        let loop = group.next()
        final class Flag: @unchecked Sendable { var value = false }
        let ran = Flag()
        let scheduled = loop.scheduleTask(in: .milliseconds(200)) { () -> Int in
            ran.value = true
            return 1
        }
        let promise = Promise(scheduled)
        promise.cancel()
        // The task's future fails with NIO's own cancellation error once the task is cancelled.
        XCTAssertThrowsError(try scheduled.futureResult.wait()) {
            XCTAssertEqual($0 as? EventLoopError, EventLoopError.cancelled)
        }
        XCTAssertFalse(try loop.submit { ran.value }.wait(), "the cancelled task never ran")
        XCTAssertTrue(promise.isCancelled)

        let onTime = loop.scheduleTask(in: .milliseconds(1)) { 3 }.promise()
        XCTAssertEqual(try onTime.wait(timeout: .seconds(5)), 3)
    }

    /// A cancelled hop has no handler of the user's whose error side a cancel would still
    /// run: it waits for nothing, so a long-lived receiver lets it go (as it does a
    /// cancelled `then`), where an `always {}` child stayed until the receiver settled.
    func testCancelledHopsLeaveALongLivedReceiver() {
        let loop = group.next()
        let longLived = Promise<Int>()
        let hops = (0..<2_000).map { _ -> WeakReference in
            let hop = longLived.hop(to: loop)
            hop.cancel()
            XCTAssertTrue(hop.isCancelled)
            return WeakReference(hop)
        }
        // At most the hops cancelled since the receiver's last prune (it prunes once as
        // many observers gave up as stayed, and at least 8).
        XCTAssertLessThanOrEqual(hops.filter { $0.object != nil }.count, 16, "cancelled hops stay alive")
        XCTAssertTrue(longLived.isPending)
        longLived.cancel()
    }

    func testHopSettlesOnTheLoop() throws {
        let loop = group.next()
        let source = Promise<Int>()
        let hopped = source.hop(to: loop)
        XCTAssertTrue(hopped.parent === source)
        let seen = hopped.then(on: .immediate) { ($0, loop.inEventLoop) }
        source.fulfill(4)  // on this test thread, not the loop
        let (value, onLoop) = try seen.wait(timeout: .seconds(5))
        XCTAssertEqual(value, 4)
        XCTAssertTrue(onLoop)

        // Registered while the source is pending: an `.immediate` handler registered on a
        // promise that has already settled runs inline, on the registering thread.
        let failing = Promise<Int>()
        let failed = failing.hop(to: loop)
            .recover(on: .immediate) { _ in loop.inEventLoop ? 1 : 0 }
        failing.reject(Boom())
        XCTAssertEqual(try failed.wait(timeout: .seconds(5)), 1, "a rejection hops too")

        // On the loop itself it still hops: nothing runs inside the call.
        let inline = try loop.submit { () -> Bool in
            Promise(value: 1).hop(to: loop).isPending
        }.wait()
        XCTAssertTrue(inline)
    }

    /// A loop that has shut down drops the work handed to it (NIO prints an error): a hop
    /// or a handler on it rejects with `brokenPromise` instead of staying pending; a hop
    /// or a value handler of a rejected promise, which would only have passed the error
    /// on, rejects with that error.
    func testAHopToALoopThatShutDownBreaks() throws {
        let stopped = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = stopped.next()
        try stopped.syncShutdownGracefully()
        let hopped = Promise(value: 1).hop(to: loop)
        let handled = Promise(value: 2).then(on: .eventLoop(loop)) { $0 + 1 }
        for promise in [hopped, handled] {
            XCTAssertThrowsError(try promise.wait(timeout: .seconds(5))) { error in
                guard case PromiseError.brokenPromise = error else {
                    return XCTFail("\(error) instead of brokenPromise")
                }
            }
        }
        let hoppedError = Promise<Int>(error: Boom()).hop(to: loop)
        let passedError = Promise<Int>(error: Boom()).then(on: .eventLoop(loop)) { $0 + 1 }
        for promise in [hoppedError, passedError] {
            XCTAssertThrowsError(try promise.wait(timeout: .seconds(5))) { XCTAssertEqual($0 as? Boom, Boom()) }
        }
    }

    func testCompleteANIOPromiseWithAPromise() throws {
        let loop = group.next()
        let fulfilled = loop.makePromise(of: Int.self)
        let source = Promise<Int>()
        fulfilled.completeWith(source)
        source.fulfill(6)
        XCTAssertEqual(try fulfilled.futureResult.wait(), 6)

        let cancelled = loop.makePromise(of: Int.self)
        let cancelledSource = Promise<Int>()
        cancelled.completeWith(cancelledSource)
        cancelledSource.cancel(reason: Boom())
        XCTAssertThrowsError(try cancelled.futureResult.wait()) { XCTAssertEqual($0 as? Boom, Boom()) }

        let broken = loop.makePromise(of: Int.self)
        var dropped: Promise<Int>? = Promise<Int>()
        broken.completeWith(dropped!)
        dropped = nil
        XCTAssertThrowsError(try broken.futureResult.wait()) {
            guard case PromiseError.brokenPromise = $0 else { return XCTFail("got \($0)") }
        }
    }

    func testTimeoutOnALoopRejectsThereWhenTimeRunsOut() throws {
        let loop = group.next()
        let never = Promise<Int>()
        // Set up in a task of the loop, so the timer (a task of the same loop) cannot fire
        // before the `.immediate` handler is registered, however slow this thread is.
        let timedOut = try loop.submit {
            never.timeout(.milliseconds(20), on: loop).then(on: .immediate, { _ in false }, { error in
                guard case PromiseError.timedOut = error else { throw error }
                return loop.inEventLoop
            })
        }.wait()
        XCTAssertTrue(try timedOut.wait(timeout: .seconds(5)), "timed out, on the loop")
        XCTAssertTrue(never.isPending, "the receiver is untouched")
    }

    /// As for `timeout(_:)`: a negative interval means now, however far below zero (NIO's
    /// `TimeAmount` clamps an overflow to its largest value, so `.seconds(Int64.min)` never
    /// fired), and one longer than a hundred years never elapses.
    func testTimeoutOnALoopTakesIntervalsAsTimeoutDoes() throws {
        let loop = group.next()
        let receiver = Promise<Int>()
        for interval in [Duration.seconds(Int64.min), .seconds(-10_000_000_000), .zero] {
            let child = receiver.timeout(interval, on: loop)
            XCTAssertThrowsError(try child.wait(timeout: .seconds(5)), "\(interval)") {
                guard case PromiseError.timedOut = $0 else { return XCTFail("\(interval): \($0)") }
            }
            XCTAssertTrue(child.isRejected, "\(interval): the wait gave up, the child is \(child.state)")
        }
        let never = receiver.timeout(.seconds(Int64.max), on: loop)
        try loop.scheduleTask(in: .milliseconds(50)) {}.futureResult.wait()
        XCTAssertTrue(never.isPending)
        receiver.fulfill(3)
        XCTAssertEqual(try never.wait(timeout: .seconds(5)), 3)
    }

    /// A promise may follow its own timeout child on a loop, as it may the library's: the
    /// timer settles it, so it is no cycle (it was rejected with `cycle` at once).
    func testAPromiseMayFollowItsOwnTimeoutOnALoop() throws {
        let loop = group.next()
        let promise = Promise<Int>()
        promise.resolve(with: promise.timeout(.milliseconds(20), on: loop))
        XCTAssertThrowsError(try promise.wait(timeout: .seconds(5))) {
            guard case PromiseError.timedOut = $0 else { return XCTFail("got \($0)") }
        }
        XCTAssertTrue(promise.isRejected, "the wait gave up: \(promise.state)")
    }

    func testTimeoutOnALoopLetsGoOfItsChildOnceSettled() throws {
        let loop = group.next()
        let source = Promise<[Int]>()
        weak var weakChild: Promise<[Int]>?
        do {
            let child = source.timeout(.seconds(60), on: loop)
            weakChild = child
            source.fulfill([1, 2, 3])
            XCTAssertEqual(try child.wait(timeout: .seconds(5)), [1, 2, 3])
        }
        // The scheduled task was cancelled when the child settled, which took it (and the
        // child it held) off the loop: nothing waits the 60 seconds out.
        try loop.submit {}.wait()
        XCTAssertNil(weakChild)
    }

    func testAwaitingAcrossTheBridge() async throws {
        let loop = group.next()
        let value = try await Promise(loop.makeSucceededFuture(41)).then(on: .eventLoop(loop)) { $0 + 1 }.value
        XCTAssertEqual(value, 42)
        let back = try await Promise(value: 5).futureResult(on: loop).get()
        XCTAssertEqual(back, 5)
    }
}
#endif
