// Every continuation form and the Promises/A+ rules adapted to types.
import Dispatch
import Foundation
import Promise
import XCTest

/// A promise-returning step, as a user's API would be.
private func fetch(_ v: Int) -> Promise<String> {
    Promise<String>(on: .default) { "fetched \(v)" }
}

final class ContinuationTests: XCTestCase {

    // MARK: then / map / flatMap

    func testThenTransformsTheValue() {
        let p = Promise<Int>()
        let child = p.then { v in v + 1 }
        p.fulfill(1)
        XCTAssertEqual(value(child), 2)
    }

    func testThenOnSettledPromiseTransformsTheValue() {
        let child = Promise(value: 20).then { v in "\(v)!" }
        XCTAssertEqual(value(child), "20!")
    }

    func testMapTransformsTheValue() {
        let child = Promise(value: 21).map { $0 * 2 }
        XCTAssertEqual(value(child), 42)
    }

    func testThenReturningPromisePicksFlatMapOverload() {
        let p = Promise(value: 3)
        let child = p.then { v in fetch(v) }
        // The child is Promise<String>, not Promise<Promise<String>>.
        XCTAssertTrue(staticType(of: child) == Promise<String>.self, "got \(staticType(of: child))")
        XCTAssertEqual(value(child), "fetched 3")
    }

    func testFlatMapFollowsReturnedPromiseFulfilment() {
        let child = Promise(value: 4).flatMap { v in fetch(v) }
        XCTAssertEqual(value(child), "fetched 4")
    }

    func testFlatMapFollowsReturnedPromiseRejection() {
        let child = Promise(value: 4).flatMap { _ in Promise<String>(error: TestError(40)) }
        XCTAssertEqual(error(child) as? TestError, TestError(40))
        XCTAssertEqual(child.state, .rejected)
    }

    func testThenFollowsPromiseFulfilledLaterFromAnotherThread() {
        let inner = Promise<String>()
        let handlerRan = DispatchSemaphore(value: 0)
        let child = Promise(value: 1).then { _ -> Promise<String> in
            handlerRan.signal()
            return inner
        }
        XCTAssertEqual(handlerRan.wait(timeout: .now() + testTimeoutSeconds), .success)
        // The handler returned; the child must wait for `inner`, not settle early.
        XCTAssertThrowsError(try child.wait(timeout: .milliseconds(20))) { e in
            XCTAssertTrue(e is PromiseError)
        }
        XCTAssertTrue(child.isPending)
        DispatchQueue.global().async { inner.fulfill("late") }
        XCTAssertEqual(value(child), "late")
    }

    func testThenFollowsPromiseRejectedLaterFromAnotherThread() {
        let inner = Promise<String>()
        let child = Promise(value: 1).flatMap { _ in inner }
        DispatchQueue.global().async { inner.reject(TestError(41)) }
        XCTAssertEqual(error(child) as? TestError, TestError(41))
    }

    func testFlatMapFollowsPromiseCancelledLater() {
        let inner = Promise<String>()
        let child = Promise(value: 1).flatMap { _ in inner }
        DispatchQueue.global().async { inner.cancel(reason: TestError(42)) }
        assertCancelled(child, reason: 42)
    }

    func testNestedReturnedPromisesAreFollowed() {
        let child = Promise(value: 1)
            .flatMap { v in Promise(value: v + 1).flatMap { w in Promise(value: w * 10) } }
        XCTAssertEqual(value(child), 20)
    }

    func testThenReturningVoidFulfilsWithVoid() {
        let seen = Recorder<Int>()
        let child = Promise(value: 5).then { v in seen.append(v) }
        XCTAssertNotNil(value(child))
        XCTAssertEqual(seen.values, [5])
    }

    // MARK: A+ rules

    func testRejectionSkipsSuccessHandlersUntilAnErrorHandler() {
        let successRuns = Counter()
        let recovered = Recorder<Int>()
        let p = Promise<Int>()
        let end = p
            .then { v -> Int in successRuns.increment(); return v }
            .map { v -> Int in successRuns.increment(); return v }
            .flatMap { v -> Promise<Int> in successRuns.increment(); return Promise(value: v) }
            .validate { _ in successRuns.increment(); return true }
            .recover { e -> Int in
                recovered.append((e as? TestError)?.id ?? -1)
                return 7
            }
            .then { $0 + 1 }
        p.reject(TestError(50))
        XCTAssertEqual(value(end), 8)
        XCTAssertEqual(successRuns.value, 0)
        XCTAssertEqual(recovered.values, [50])
    }

    func testRejectionPassesThroughEveryChildUnchanged() {
        let p = Promise<Int>(error: TestError(51))
        XCTAssertEqual(error(p.then { $0 + 1 }) as? TestError, TestError(51))
        XCTAssertEqual(error(p.map { $0 + 1 }) as? TestError, TestError(51))
        XCTAssertEqual(error(p.flatMap { Promise(value: $0) }) as? TestError, TestError(51))
        XCTAssertEqual(error(p.validate { _ in true }) as? TestError, TestError(51))
        XCTAssertEqual(error(p.then { v in fetch(v) }) as? TestError, TestError(51))
    }

    func testThrowingMapHandlerRejectsChild() {
        let child = Promise(value: 1).then { (_: Int) throws -> Int in throw TestError(52) }
        XCTAssertEqual(error(child) as? TestError, TestError(52))
        XCTAssertEqual(child.state, .rejected)
    }

    func testThrowingFlatMapHandlerRejectsChild() {
        let child = Promise(value: 1).flatMap { (_: Int) throws -> Promise<Int> in throw TestError(53) }
        XCTAssertEqual(error(child) as? TestError, TestError(53))
    }

    func testThrowingRecoverHandlerRejectsChildWithTheThrownError() {
        let child = Promise<Int>(error: TestError(1)).recover { (_: any Error) throws -> Int in
            throw TestError(54)
        }
        XCTAssertEqual(error(child) as? TestError, TestError(54))
    }

    func testThrowingPromiseRecoverHandlerRejectsChild() {
        let child = Promise<Int>(error: TestError(1)).recover { (_: any Error) throws -> Promise<Int> in
            throw TestError(55)
        }
        XCTAssertEqual(error(child) as? TestError, TestError(55))
    }

    func testErrorHandlerReturningValueFulfils() {
        let child = Promise<Int>(error: TestError(56)).recover { _ in 99 }
        XCTAssertEqual(value(child), 99)
        XCTAssertEqual(child.state, .fulfilled)
    }

    func testRecoverReceivesTheRejectionError() {
        let seen = Recorder<Int>()
        let child = Promise<Int>(error: TestError(57)).recover { e -> Int in
            seen.append((e as? TestError)?.id ?? -1)
            return 0
        }
        XCTAssertEqual(value(child), 0)
        XCTAssertEqual(seen.values, [57])
    }

    func testRecoverPassesValueThroughWithoutCallingHandler() {
        let runs = Counter()
        let child = Promise(value: 3).recover { _ -> Int in runs.increment(); return 0 }
        XCTAssertEqual(value(child), 3)
        let flatChild = Promise(value: 4).recover { _ -> Promise<Int> in runs.increment(); return Promise(value: 0) }
        XCTAssertEqual(value(flatChild), 4)
        XCTAssertEqual(runs.value, 0)
    }

    func testRecoverReturningPromiseIsFollowedOnFulfilment() {
        let child = Promise<Int>(error: TestError(1)).recover { _ in Promise<Int>(on: .default) { 58 } }
        XCTAssertEqual(value(child), 58)
    }

    func testRecoverReturningPromiseIsFollowedOnRejection() {
        let child = Promise<Int>(error: TestError(1)).recover { _ in Promise<Int>(error: TestError(59)) }
        XCTAssertEqual(error(child) as? TestError, TestError(59))
    }

    func testRecoverReturningPromiseSettledLaterFromAnotherThread() {
        let inner = Promise<Int>()
        let child = Promise<Int>(error: TestError(1)).recover { _ in inner }
        DispatchQueue.global().async { inner.fulfill(60) }
        XCTAssertEqual(value(child), 60)
    }

    func testMapErrorReplacesTheError() {
        let child = Promise<Int>(error: TestError(61)).mapError { e in WrappedError(underlying: e) }
        let e = error(child)
        XCTAssertEqual((e as? WrappedError)?.underlying as? TestError, TestError(61))
        XCTAssertEqual(child.state, .rejected)
    }

    func testMapErrorPassesValueThroughWithoutCallingHandler() {
        let runs = Counter()
        let child = Promise(value: 62).mapError { e -> any Error in runs.increment(); return e }
        XCTAssertEqual(value(child), 62)
        XCTAssertEqual(runs.value, 0)
    }

    func testCatchRunsOnRejectionAndPassesTheRejectionOn() {
        let seen = Recorder<Int>()
        let child = Promise<Int>(error: TestError(63)).catch { e in seen.append((e as? TestError)?.id ?? -1) }
        XCTAssertEqual(error(child) as? TestError, TestError(63))
        XCTAssertEqual(child.state, .rejected)
        XCTAssertEqual(seen.values, [63])
    }

    func testCatchPassesValueOnWithoutCallingHandler() {
        let runs = Counter()
        let child = Promise(value: 64).catch { _ in runs.increment() }
        XCTAssertEqual(value(child), 64)
        XCTAssertEqual(runs.value, 0)
    }

    func testAlwaysRunsOnFulfilmentAndPassesTheValueOn() {
        let runs = Counter()
        let child = Promise(value: 65).always { runs.increment() }
        XCTAssertEqual(value(child), 65)
        XCTAssertEqual(runs.value, 1)
    }

    func testAlwaysRunsOnRejectionAndPassesTheErrorOn() {
        let runs = Counter()
        let child = Promise<Int>(error: TestError(66)).always { runs.increment() }
        XCTAssertEqual(error(child) as? TestError, TestError(66))
        XCTAssertEqual(runs.value, 1)
    }

    func testValidateTruePassesTheValue() {
        let child = Promise(value: 5).validate { v in v > 0 }
        XCTAssertEqual(value(child), 5)
    }

    func testValidateFalseRejectsWithValidationFailure() {
        let child = Promise(value: -5).validate { v in v > 0 }
        let e = error(child)
        guard case .validationFailure? = e as? PromiseError else {
            return XCTFail("expected PromiseError.validationFailure, got \(String(describing: e))")
        }
        XCTAssertEqual(child.state, .rejected)
    }

    func testValidateThrowRejectsWithTheThrownError() {
        let child = Promise(value: 5).validate { (_: Int) throws -> Bool in throw TestError(67) }
        XCTAssertEqual(error(child) as? TestError, TestError(67))
    }

    // MARK: two-handler then

    func testTwoHandlerThenRunsOnlyTheSuccessHandlerOnFulfilment() {
        let errorRuns = Counter()
        let child = Promise(value: 7).then({ v in "ok \(v)" }, { _ in errorRuns.increment(); return "handled" })
        XCTAssertEqual(value(child), "ok 7")
        XCTAssertEqual(errorRuns.value, 0)
    }

    func testTwoHandlerThenRunsOnlyTheErrorHandlerOnRejectionAndFulfils() {
        let successRuns = Counter()
        let seen = Recorder<Int>()
        let child = Promise<Int>(error: TestError(68)).then(
            { v -> String in successRuns.increment(); return "ok \(v)" },
            { e -> String in seen.append((e as? TestError)?.id ?? -1); return "handled" })
        XCTAssertEqual(value(child), "handled")
        XCTAssertEqual(child.state, .fulfilled)
        XCTAssertEqual(successRuns.value, 0)
        XCTAssertEqual(seen.values, [68])
    }

    func testTwoHandlerThenThrowingErrorHandlerRejects() {
        let child = Promise<Int>(error: TestError(1)).then(
            { (v: Int) throws -> String in "ok \(v)" },
            { (_: any Error) throws -> String in throw TestError(69) })
        XCTAssertEqual(error(child) as? TestError, TestError(69))
    }

    func testTwoHandlerThenThrowingSuccessHandlerRejects() {
        let child = Promise(value: 1).then(
            { (_: Int) throws -> String in throw TestError(70) },
            { (_: any Error) throws -> String in "handled" })
        XCTAssertEqual(error(child) as? TestError, TestError(70))
    }

    // MARK: whenComplete

    func testWhenCompleteDeliversTheValue() {
        let delivered = expectation(description: "whenComplete")
        let seen = Recorder<Int>()
        let p = Promise<Int>()
        p.whenComplete { result in
            if case .success(let v) = result { seen.append(v) }
            delivered.fulfill()
        }
        p.fulfill(71)
        wait(for: [delivered], timeout: testTimeoutSeconds)
        XCTAssertEqual(seen.values, [71])
    }

    func testWhenCompleteDeliversTheError() {
        let delivered = expectation(description: "whenComplete")
        let seen = Recorder<Int>()
        Promise<Int>(error: TestError(72)).whenComplete { result in
            if case .failure(let e) = result { seen.append((e as? TestError)?.id ?? -1) }
            delivered.fulfill()
        }
        wait(for: [delivered], timeout: testTimeoutSeconds)
        XCTAssertEqual(seen.values, [72])
    }

    // The first whenComplete on a root is kept in the promise itself, the others in boxes
    // of their own: the two kinds must behave the same.

    func testFirstAndLaterObserversOfARootRunInRegistrationOrder() {
        let queue = DispatchQueue(label: "PromiseTests.first-observer")
        for context: any ExecutionContext in [ImmediateExecutionContext.immediate, queue] {
            let order = Recorder<Int>()
            let p = Promise<Int>()
            for index in 0..<5 {
                p.whenComplete(on: context) { result in
                    if case .success(let v) = result { order.append(index * 100 + v) }
                }
            }
            p.fulfill(7)
            queue.sync {}
            XCTAssertEqual(order.values, [7, 107, 207, 307, 407], "on \(type(of: context))")
        }
    }

    func testFirstObserverOfARootRunsOnItsContextNeverInline() {
        let queue = DispatchQueue(label: "PromiseTests.first-observer-context")
        let key = DispatchSpecificKey<Int>()
        queue.setSpecific(key: key, value: 1)
        let onQueue = Recorder<Bool>()
        let p = Promise(value: 3)  // settled: a context still runs it later, not in the call
        // On the queue (so not inline in the registering call, on this thread).
        p.whenComplete(on: queue) { _ in onQueue.append(DispatchQueue.getSpecific(key: key) == 1) }
        queue.sync {}
        XCTAssertEqual(onQueue.values, [true])
    }

    func testImmediateFirstObserversSettlingTheNextRootRunInConstantStackDepth() {
        // Each root's first observer fulfils the next root: 100k of them deep would
        // overflow the stack if the slot's observer ran inside the settle that fired it.
        let count = 100_000
        let roots = (0..<count).map { _ in Promise<Int>() }
        for index in 0..<(count - 1) {
            let next = roots[index + 1]
            roots[index].whenComplete(on: .immediate) { result in
                if case .success(let v) = result { next.fulfill(v + 1) }
            }
        }
        roots[0].fulfill(0)
        XCTAssertEqual(value(roots[count - 1]), count - 1)
    }

    // MARK: Exactly once

    /// Every form registered on one serial queue; the promise is settled, then the
    /// resolvers are tried again; after the queue drains each handler has run once.
    /// (No `cancel()` here: on a settled promise it is forwarded to the children whose
    /// handlers are still queued, which is another test's business.)
    func testHandlersRunExactlyOnce() {
        let queue = DispatchQueue(label: "PromiseTests.once")
        for rejectIt in [false, true] {
            let runs = Counter()
            let p = Promise<Int>()
            var children: [Promise<Int>] = []
            children.append(p.then(on: queue) { v -> Int in runs.increment(); return v })
            children.append(p.map(on: queue) { v -> Int in runs.increment(); return v })
            children.append(p.flatMap(on: queue) { v -> Promise<Int> in runs.increment(); return Promise(value: v) })
            children.append(p.then(on: queue, { v -> Int in runs.increment(); return v },
                                   { _ -> Int in runs.increment(); return 0 }))
            children.append(p.recover(on: queue) { _ -> Int in runs.increment(); return 0 })
            children.append(p.recover(on: queue) { _ -> Promise<Int> in runs.increment(); return Promise(value: 0) })
            children.append(p.mapError(on: queue) { e -> any Error in runs.increment(); return e })
            children.append(p.catch(on: queue) { _ in runs.increment() })
            children.append(p.always(on: queue) { runs.increment() })
            children.append(p.validate(on: queue) { _ in runs.increment(); return true })
            p.whenComplete(on: queue) { _ in runs.increment() }

            if rejectIt { p.reject(TestError(1)) } else { p.fulfill(1) }
            p.fulfill(2)
            p.reject(TestError(2))
            for child in children { settle(child) }
            queue.sync {}
            // Fulfilled: then, map, flatMap, two-handler, always, validate, whenComplete.
            // Rejected: two-handler, recover x2, mapError, catch, always, whenComplete.
            XCTAssertEqual(runs.value, 7, rejectIt ? "rejected" : "fulfilled")
        }
    }

    /// Registration races with fulfilment from another thread: every handler runs once
    /// with the value, none is lost.
    func testHandlersRegisteredWhileFulfillingRaceRunExactlyOnce() {
        let rounds = 100
        let perThread = 20
        let promises = (0..<rounds).map { _ in Promise<Int>() }
        let runs = Counter()
        let wrong = Counter()
        let children = Recorder<Promise<Int>>()
        let finished = raceOnThreads(threads: 3, rounds: rounds) { thread, round in
            let p = promises[round]
            if thread == 0 {
                p.fulfill(round)
            } else {
                for i in 0..<perThread {
                    let context: any ExecutionContext = i.isMultiple(of: 2) ? .immediate : .default
                    children.append(p.then(on: context) { v -> Int in
                        runs.increment()
                        if v != round { wrong.increment() }
                        return v
                    })
                }
            }
        }
        XCTAssertTrue(finished)
        for child in children.values { settle(child) }
        XCTAssertEqual(children.count, rounds * 2 * perThread)
        XCTAssertEqual(runs.value, rounds * 2 * perThread)
        XCTAssertEqual(wrong.value, 0)
    }

    // MARK: Children and their parent

    func testEveryContinuationReturnsAChildWhoseParentIsTheReceiver() {
        let p = Promise<Int>()
        let children: [AnyPromise] = [
            p.then { $0 },
            p.then { v in fetch(v) },
            p.then({ $0 }, { _ in 0 }),
            p.map { $0 },
            p.flatMap { Promise(value: $0) },
            p.recover { _ in 0 },
            p.recover { _ in Promise(value: 0) },
            p.mapError { $0 },
            p.catch { _ in },
            p.always {},
            p.validate { _ in true },
        ]
        for (i, child) in children.enumerated() {
            XCTAssertTrue(child.parent === p, "child \(i)")
            XCTAssertTrue(child !== p, "child \(i)")
        }
        XCTAssertEqual(Set(children.map { ObjectIdentifier($0) }).count, children.count)
        p.fulfill(1)
    }
}

/// The type the compiler gave `value` (`type(of:)` gives the dynamic one).
private func staticType<T>(of value: T) -> T.Type { T.self }
