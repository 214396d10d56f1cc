// What timers and runs (`retry`, `sequence`, `all(_:maxConcurrent:)`) and combinator
// outputs keep once nothing can use it: a timer that never elapses does not keep the
// promise it would settle; an output settled from outside leaves the long-lived input or
// step it waited on; a run whose context drops its work breaks the output it can no
// longer settle.
import Dispatch
import Foundation
import Promise
import XCTest
@testable import Promise

private struct Reason: Error, Equatable { let tag: Int }

/// Whether `error` is `PromiseError.brokenPromise`.
private func isBroken(_ error: (any Error)?) -> Bool {
    if case PromiseError.brokenPromise? = error as? PromiseError { return true }
    return false
}

/// The error `promise` settles with within `seconds`; `PromiseError.timedOut` if it stays
/// pending that long, nil if it fulfils.
private func errorWithin<T>(_ promise: Promise<T>, seconds: Int64 = 3) -> (any Error)? {
    do {
        _ = try promise.wait(timeout: .seconds(seconds))
        return nil
    } catch {
        return error
    }
}

/// Runs the first `limit` works it is given on a serial queue and drops the rest unrun
/// (an executor that shuts down part-way).
private final class LimitedContext: ExecutionContext, @unchecked Sendable {
    private let lock = NSLock()
    private var left: Int
    private let queue = DispatchQueue(label: "RunLifetimeTests.LimitedContext")

    init(running limit: Int) { left = limit }

    func execute(_ work: @escaping @Sendable () -> Void) {
        let run: Bool = lock.withLock {
            guard left > 0 else { return false }
            left -= 1
            return true
        }
        if run { queue.async(execute: work) }
    }
}

final class RunLifetimeTests: XCTestCase {
    /// A long-lived promise may keep this many nodes that gave up (prunes are amortised).
    private let nodeBound = 2 * RareState.minimumGaveUpBeforePrune + 8
    private let rounds = 10_000

    // MARK: Combinator outputs settled from outside

    // Whoever holds a combinator's output may settle it. Then, as when its inputs settle
    // it, the aggregator lets go of the settled inputs and of the output, and its slots on
    // the inputs still pending give up.

    func testAggregateOutputsSettledFromOutsideLeaveALongLivedInput() {
        func check(_ name: String, _ round: (_ longLived: Promise<Payload>, _ tracker: LifeTracker, _ index: Int) -> Void) {
            let longLived = Promise<Payload>()
            let tracker = LifeTracker()
            for index in 0..<rounds { round(longLived, tracker, index) }
            XCTAssertLessThanOrEqual(longLived.debugObserverNodeCount, nodeBound,
                                     "\(name): settled outputs stay registered on the long-lived input")
            XCTAssertEqual(tracker.alive, 0, "\(name): settled outputs nobody holds keep their inputs' values")
            longLived.cancel()
        }
        check("all") { longLived, tracker, index in
            let first = Promise<Payload>()
            let output = Promise.all([first, longLived])
            first.fulfill(Payload(bytes: [1], tracker: tracker))
            output.reject(Reason(tag: index))
        }
        check("allSettled") { longLived, tracker, index in
            let first = Promise<Payload>()
            let output = Promise.allSettled([first, longLived])
            first.fulfill(Payload(bytes: [1], tracker: tracker))
            output.reject(Reason(tag: index))
        }
        check("any") { longLived, tracker, index in
            let first = Promise<Payload>()
            let output = Promise.any([first, longLived])
            first.reject(Reason(tag: index))
            output.fulfill(Payload(bytes: [1], tracker: tracker))
        }
        check("race") { longLived, tracker, index in
            let output = Promise.race([longLived])
            output.fulfill(Payload(bytes: [1], tracker: tracker))
        }
        check("and") { longLived, tracker, index in
            let output = longLived.and(Promise(value: Payload(bytes: [1], tracker: tracker)))
            output.reject(Reason(tag: index))
        }
    }
}
