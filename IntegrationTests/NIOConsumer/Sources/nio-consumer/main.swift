// PromiseNIO from a package of its own (Swift 6 language mode, warnings as errors):
// prints each check, exits 1 if any failed, 2 if it hangs.
import Dispatch
import Foundation
import NIOCore
import NIOPosix
import Promise
import PromiseNIO

struct Failure: Error, Equatable {}

extension Result {
    var failureValue: Failure? {
        if case .failure(let error) = self { error } else { nil }
    }
}

DispatchQueue.global().asyncAfter(deadline: .now() + 60) {
    print("FAIL  watchdog: nio-consumer did not finish within 60 s")
    exit(2)
}

nonisolated(unsafe) var failed = 0
func check(_ condition: Bool, _ what: String) {
    print(condition ? "  ok    \(what)" : "  FAIL  \(what)")
    if !condition { failed += 1 }
}

let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
let loop = group.next()

// An event loop as an execution context.
let onLoop = Promise<Int>(on: .eventLoop(loop)) { 20 }.then(on: loop.executionContext) { ($0 + 1, loop.inEventLoop) }
let (sum, ranOnLoop) = try onLoop.wait(timeout: .seconds(10))
check(sum == 21 && ranOnLoop, "Promise(on: .eventLoop(loop)) and then(on: loop.executionContext) run on the loop")

// Promise -> EventLoopFuture -> Promise.
let roundTrip = Promise(value: 21).futureResult(on: loop).map { $0 * 2 }.promise()
check((try? roundTrip.wait(timeout: .seconds(10))) == 42, "futureResult(on:) and promise() convert both ways")

let failedFuture = Promise<Int>(error: Failure()).futureResult(on: loop)
check((try? failedFuture.wait()) == nil, "a rejected promise fails its future")

// hop(to:): .immediate handlers of the hopped promise run on the loop.
let source = Promise<Int>()
let hopped = source.hop(to: loop).then(on: .immediate) { _ in loop.inEventLoop }
source.fulfill(1)
check((try? hopped.wait(timeout: .seconds(10))) == true, "hop(to:) settles on the loop")

// EventLoopPromise.completeWith(Promise).
let nioPromise = loop.makePromise(of: String.self)
nioPromise.completeWith(Promise(value: "done"))
check((try? nioPromise.futureResult.wait()) == "done", "EventLoopPromise.completeWith(promise)")

// Cancellation reaches a scheduled task.
let task = loop.scheduleTask(in: .seconds(30)) { 0 }
let never = Promise(task)
never.cancel()
check(never.isCancelled, "cancelling Promise(scheduled) settles it at once")
let taskOutcome = Result { try task.futureResult.wait() }
check((try? taskOutcome.get()) == nil && (taskOutcome.failureValue as? EventLoopError) == .cancelled,
      "... and cancels the scheduled task")

// timeout(_:on:): the deadline on the loop.
let slow = Promise<Int>()  // held: a source dropped pending would break the child at once
let late = slow.timeout(.milliseconds(10), on: loop)
let lateOutcome = Result { try late.wait(timeout: .seconds(10)) }
check(slow.isPending, "timeout(_:on:) leaves its receiver alone")
check({ if case .failure(PromiseError.timedOut) = lateOutcome { true } else { false } }(),
      "timeout(_:on:) rejects with PromiseError.timedOut")

try group.syncShutdownGracefully()
print(failed == 0 ? "nio-consumer: all checks passed" : "nio-consumer: \(failed) failed")
exit(failed == 0 ? 0 : 1)
