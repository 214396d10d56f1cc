// Cancelling a single promise, its direct effect on its children, and onCancel.
// (Forwarding a cancel from an already settled promise to pending descendants, and
// combinators, are tested elsewhere.)
import Dispatch
import Foundation
import Promise
import XCTest

final class CancellationTests: XCTestCase {

    // MARK: The cancelled promise itself

    func testCancelSettlesPendingPromiseAsCancelledWithCancellationError() {
        let p = Promise<Int>()
        p.cancel()
        XCTAssertEqual(p.state, .cancelled)
        XCTAssertTrue(p.isCancelled)
        XCTAssertFalse(p.isPending)
        XCTAssertFalse(p.isRejected)
        XCTAssertFalse(p.isFulfilled)
        XCTAssertTrue(error(p) is CancellationError)
    }

    func testCancelWithReasonUsesThatReason() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(1))
        assertCancelled(p, reason: 1)
    }

    func testSecondCancelKeepsTheFirstReason() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(1))
        p.cancel(reason: TestError(2))
        p.cancel()
        assertCancelled(p, reason: 1)
    }

    func testCancelDoesNothingToSettledPromise() {
        let fulfilled = Promise(value: 1)
        fulfilled.cancel()
        XCTAssertEqual(fulfilled.state, .fulfilled)
        XCTAssertEqual(value(fulfilled), 1)

        let rejected = Promise<Int>(error: TestError(2))
        rejected.cancel(reason: TestError(3))
        XCTAssertEqual(rejected.state, .rejected)
        XCTAssertEqual(error(rejected) as? TestError, TestError(2))
    }

    func testCancelledPromiseIgnoresLaterResolutions() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(4))
        XCTAssertFalse(p.fulfill(1))
        XCTAssertFalse(p.reject(TestError(5)))
        XCTAssertFalse(p.resolve(.success(2)))
        assertCancelled(p, reason: 4)
    }

    func testCancelRacingFulfilSettlesExactlyOneWay() {
        let rounds = 300
        let promises = (0..<rounds).map { _ in Promise<Int>() }
        let fulfilWins = (0..<rounds).map { _ in Flag() }
        let cancels = Counter()
        let finished = raceOnThreads(threads: 3, rounds: rounds) { thread, round in
            let p = promises[round]
            if thread == 0 {
                if p.fulfill(round) { fulfilWins[round].set() }
            } else {
                p.onCancel { cancels.increment() }
                p.cancel(reason: TestError(thread))
            }
        }
        XCTAssertTrue(finished)
        var cancelledRounds = 0
        for round in 0..<rounds {
            let p = promises[round]
            if fulfilWins[round].isSet {
                XCTAssertEqual(p.state, .fulfilled, "round \(round)")
                XCTAssertEqual(value(p), round)
            } else {
                XCTAssertEqual(p.state, .cancelled, "round \(round)")
                let reason = error(p) as? TestError
                XCTAssertTrue(reason == TestError(1) || reason == TestError(2), "round \(round): \(String(describing: reason))")
                cancelledRounds += 1
            }
        }
        // Each cancelled round has two onCancel handlers (threads 1 and 2), each run once.
        XCTAssertTrue(eventually { cancels.value == 2 * cancelledRounds },
                      "onCancel runs \(cancels.value), cancelled rounds \(cancelledRounds)")
    }

    // MARK: onCancel

    func testOnCancelRunsOnceWhenCancelled() {
        let p = Promise<Int>()
        let runs = Counter()
        let ran = expectation(description: "onCancel")
        p.onCancel {
            runs.increment()
            ran.fulfill()
        }
        XCTAssertEqual(runs.value, 0)
        p.cancel()
        p.cancel()
        wait(for: [ran], timeout: testTimeoutSeconds)
        XCTAssertEqual(runs.value, 1)
    }

    func testOnCancelRunsAtOnceOnAlreadyCancelledPromise() {
        let p = Promise<Int>()
        p.cancel()
        let ran = Flag()
        p.onCancel { ran.set() }
        XCTAssertTrue(ran.isSet, "onCancel on a cancelled promise did not run at once")
    }

    func testOnCancelNeverRunsWhenFulfilledOrRejected() {
        let runs = Counter()
        let fulfilled = Promise<Int>()
        let rejected = Promise<Int>()
        fulfilled.onCancel { runs.increment() }
        rejected.onCancel { runs.increment() }
        fulfilled.fulfill(1)
        rejected.reject(TestError(1))
        fulfilled.cancel()
        rejected.cancel()
        Promise(value: 1).onCancel { runs.increment() }
        // A later observer on each promise runs after the onCancel boxes (registration
        // order), so once it ran, an onCancel that was going to run would have run.
        settle(fulfilled.always(on: .immediate) {})
        settle(rejected.always(on: .immediate) {})
        XCTAssertEqual(runs.value, 0)
        XCTAssertFalse(fulfilled.isCancelled)
        XCTAssertFalse(rejected.isCancelled)
    }

    func testEveryOnCancelHandlerRunsOnce() {
        let p = Promise<Int>()
        let runs = Recorder<Int>()
        let done = Countdown(50)
        for i in 0..<50 {
            p.onCancel { runs.append(i); done.countDown() }
        }
        DispatchQueue.concurrentPerform(iterations: 4) { _ in p.cancel() }
        XCTAssertTrue(done.wait())
        XCTAssertEqual(runs.values.sorted(), Array(0..<50))
    }

    func testOnCancelRunsWhenFollowedPromiseIsCancelled() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        let ran = expectation(description: "onCancel")
        p.onCancel { ran.fulfill() }
        p.resolve(with: other)
        other.cancel()
        wait(for: [ran], timeout: testTimeoutSeconds)
        XCTAssertTrue(p.isCancelled)
    }

    // MARK: Children of a cancelled pending promise

    func testCancelReachesPendingChildrenWithTheSameReason() {
        let p = Promise<Int>()
        let children: [Promise<Int>] = [
            p.then { $0 }, p.map { $0 }, p.flatMap { Promise(value: $0) },
            p.then({ $0 }, { _ in 0 }), p.recover { _ in 0 }, p.recover { _ in Promise(value: 0) },
            p.mapError { $0 }, p.catch { _ in }, p.always {}, p.validate { _ in true },
        ]
        let grandchild = children[0].then { $0 + 1 }
        p.cancel(reason: TestError(10))
        for child in children { assertCancelled(child, reason: 10) }
        assertCancelled(grandchild, reason: 10)
    }

    func testChildrenAreCancelledBeforeCancelReturns() {
        let p = Promise<Int>()
        let child = p.then(on: .default) { $0 }
        let grandchild = child.recover(on: DispatchQueue(label: "PromiseTests.gc")) { _ in 0 }
        p.cancel(reason: TestError(11))
        XCTAssertTrue(child.isCancelled)
        XCTAssertTrue(grandchild.isCancelled)
    }

    func testSuccessHandlersNeverRunAfterCancel() {
        let successRuns = Counter()
        let p = Promise<Int>()
        let children: [Promise<Int>] = [
            p.then { v -> Int in successRuns.increment(); return v },
            p.map { v -> Int in successRuns.increment(); return v },
            p.flatMap { v -> Promise<Int> in successRuns.increment(); return Promise(value: v) },
            p.validate { _ in successRuns.increment(); return true },
            p.then(on: .immediate) { v -> Int in successRuns.increment(); return v },
            p.then({ v -> Int in successRuns.increment(); return v }, { _ in 0 }),
        ]
        p.cancel(reason: TestError(12))
        for child in children { assertCancelled(child, reason: 12) }
        // The later resolutions are ignored and give the handlers no second chance.
        XCTAssertFalse(p.fulfill(1))
        for child in children { settle(child.always {}) }
        XCTAssertEqual(successRuns.value, 0)
    }

    func testErrorHandlersStillRunWithTheCancellationReason() {
        let p = Promise<Int>()
        let seen = Recorder<String>()
        let done = Countdown(7)
        let note: @Sendable (String, any Error) -> Void = { name, e in
            seen.append("\(name) \((e as? TestError)?.id ?? -1)")
            done.countDown()
        }
        let children: [Promise<Int>] = [
            p.recover { e -> Int in note("recover", e); return 1 },
            p.recover { e -> Promise<Int> in note("recover->Promise", e); return Promise(value: 1) },
            p.mapError { e -> any Error in note("mapError", e); return WrappedError(underlying: e) },
            p.catch { e in note("catch", e) },
            p.then({ v in v }, { e -> Int in note("then2", e); return 1 }),
            p.recover(on: .immediate) { e -> Int in note("recover immediate", e); return 1 },
        ]
        p.whenComplete { result in
            if case .failure(let e) = result { note("whenComplete", e) } else { done.countDown() }
        }
        p.cancel(reason: TestError(13))
        XCTAssertTrue(done.wait(), "ran: \(seen.values)")
        XCTAssertEqual(done.overshoot, 0, "a handler ran twice: \(seen.values)")
        XCTAssertEqual(Set(seen.values), [
            "recover 13", "recover->Promise 13", "mapError 13", "catch 13", "then2 13",
            "recover immediate 13", "whenComplete 13",
        ])
        // Recovery cannot turn the cancellation into success.
        for child in children { assertCancelled(child, reason: 13) }
    }

    func testAlwaysRunsOnCancellationAndChildStaysCancelled() {
        let p = Promise<Int>()
        let ran = expectation(description: "always")
        let child = p.always { ran.fulfill() }
        p.cancel(reason: TestError(14))
        wait(for: [ran], timeout: testTimeoutSeconds)
        assertCancelled(child, reason: 14)
    }

    func testRecoveryAfterCancelCannotFulfilTheChildEvenLater() {
        let p = Promise<Int>()
        let handlerDone = expectation(description: "recover ran")
        let child = p.recover { _ -> Int in
            defer { handlerDone.fulfill() }
            return 1
        }
        let grandchild = child.then { $0 + 1 }
        p.cancel(reason: TestError(15))
        wait(for: [handlerDone], timeout: testTimeoutSeconds)
        assertCancelled(child, reason: 15)
        assertCancelled(grandchild, reason: 15)
    }

    func testContinuationOnCancelledPromiseYieldsCancelledChild() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(16))
        let successRuns = Counter()
        let mapped = p.then { v -> Int in successRuns.increment(); return v }
        let recovered = p.recover { _ in 5 }
        let flat = p.flatMap { v -> Promise<Int> in successRuns.increment(); return Promise(value: v) }
        XCTAssertTrue(mapped.isCancelled, "child of a cancelled promise was not cancelled at once")
        assertCancelled(mapped, reason: 16)
        assertCancelled(recovered, reason: 16)
        assertCancelled(flat, reason: 16)
        XCTAssertEqual(successRuns.value, 0)
    }

    func testErrorHandlerRegisteredOnCancelledPromiseRunsWithTheReason() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(17))
        let seen = Recorder<Int>()
        let child = p.catch { e in seen.append((e as? TestError)?.id ?? -1) }
        assertCancelled(child, reason: 17)
        XCTAssertTrue(eventually { seen.count == 1 })
        XCTAssertEqual(seen.values, [17])
    }

    func testWhenCompleteOnCancelledPromiseDeliversTheReason() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(18))
        let done = expectation(description: "whenComplete")
        let seen = Recorder<Int>()
        p.whenComplete { result in
            if case .failure(let e) = result { seen.append((e as? TestError)?.id ?? -1) }
            done.fulfill()
        }
        wait(for: [done], timeout: testTimeoutSeconds)
        XCTAssertEqual(seen.values, [18])
    }

    // MARK: Never up, never sideways

    func testCancellingChildLeavesParentAndSiblingsUntouched() {
        let p = Promise<Int>()
        let cancelledHandlerRuns = Counter()
        let child = p.then { v -> Int in cancelledHandlerRuns.increment(); return v }
        let sibling = p.then { $0 + 1 }
        let nephew = sibling.then { $0 + 1 }
        child.cancel(reason: TestError(19))
        assertCancelled(child, reason: 19)
        XCTAssertTrue(p.isPending)
        XCTAssertTrue(sibling.isPending)
        XCTAssertTrue(nephew.isPending)
        p.fulfill(1)
        XCTAssertEqual(value(sibling), 2)
        XCTAssertEqual(value(nephew), 3)
        XCTAssertEqual(value(p), 1)
        settle(p.then(on: .default) { $0 })  // the default queue has moved past the handler
        XCTAssertEqual(cancelledHandlerRuns.value, 0, "the cancelled child's handler ran")
        assertCancelled(child, reason: 19)
    }

    func testCancellingChildWhoseHandlerIsQueuedPreventsItsSuccessHandler() {
        let queue = DispatchQueue(label: "PromiseTests.blocked")
        let gate = DispatchSemaphore(value: 0)
        queue.async { gate.wait() }  // hold the queue so the handler stays queued
        let runs = Counter()
        let p = Promise<Int>()
        let child = p.then(on: queue) { v -> Int in runs.increment(); return v }
        p.fulfill(1)
        child.cancel(reason: TestError(20))
        gate.signal()
        queue.sync {}
        XCTAssertEqual(runs.value, 0)
        assertCancelled(child, reason: 20)
        XCTAssertEqual(p.state, .fulfilled)
    }

    func testRootCancelCancelsWholePendingTree() {
        let root = Promise<Int>()
        let a = root.then { $0 }
        let b = a.map { "\($0)" }
        let c = a.then { $0 * 2 }
        let d = root.recover { _ in 0 }
        let e = b.validate { !$0.isEmpty }
        e.root.cancel(reason: TestError(21))
        assertCancelled(root, reason: 21)
        assertCancelled(a, reason: 21)
        assertCancelled(b, reason: 21)
        assertCancelled(c, reason: 21)
        assertCancelled(d, reason: 21)
        assertCancelled(e, reason: 21)
    }

    // MARK: Races

    /// The parent is fulfilled and cancelled by racing threads while a third registers
    /// handlers: success handlers run (at most once) only if the parent ended fulfilled,
    /// error sides run (once, with the reason) only if it ended cancelled, and every
    /// child of a cancelled parent ends cancelled.
    func testRacingCancelAndFulfilRunSuccessHandlersOnlyIfFulfilled() {
        let rounds = 200
        let parents = (0..<rounds).map { _ in Promise<Int>() }
        let successRuns = (0..<rounds).map { _ in Counter() }
        let errorRuns = (0..<rounds).map { _ in Recorder<Int>() }
        let children = (0..<rounds).map { _ in Recorder<Promise<Int>>() }
        let finished = raceOnThreads(threads: 3, rounds: rounds) { thread, round in
            let p = parents[round]
            switch thread {
            case 0: p.fulfill(round)
            case 1: p.cancel(reason: TestError(round))
            default:
                let context: any ExecutionContext = round.isMultiple(of: 2) ? .immediate : .default
                children[round].append(p.then(on: context) { v -> Int in successRuns[round].increment(); return v })
                children[round].append(p.recover(on: context) { e -> Int in
                    errorRuns[round].append((e as? TestError)?.id ?? -1)
                    return -1
                })
            }
        }
        XCTAssertTrue(finished)
        for round in 0..<rounds {
            let kids = children[round].values
            for kid in kids { settle(kid) }
            switch parents[round].state {
            case .fulfilled:
                // The cancel came second: it is forwarded to children still pending, so
                // each child ends with the value or cancelled, and the handlers agree.
                for kid in kids where !kid.isFulfilled { assertCancelled(kid, reason: round) }
                for kid in kids where kid.isFulfilled { XCTAssertEqual(value(kid), round, "round \(round)") }
                XCTAssertLessThanOrEqual(successRuns[round].value, 1, "round \(round)")
                if kids.first?.isFulfilled == true {
                    XCTAssertEqual(successRuns[round].value, 1, "round \(round)")
                }
                XCTAssertEqual(errorRuns[round].values, [], "round \(round): error side ran on a fulfilled parent")
            case .cancelled:
                for kid in kids { assertCancelled(kid, reason: round) }
                XCTAssertEqual(successRuns[round].value, 0, "round \(round): success handler ran after cancel")
                // The error side may still be on its way (it runs on its context).
                XCTAssertTrue(eventually { errorRuns[round].count == 1 }, "round \(round)")
                XCTAssertEqual(errorRuns[round].values, [round], "round \(round)")
            default:
                XCTFail("round \(round): parent is \(parents[round].state)")
            }
        }
    }

    /// A child is cancelled while its handler is about to run (or running) on another
    /// thread: it ends either fulfilled by the handler or cancelled with the reason, and
    /// a cancelled child's own child is cancelled too.
    func testCancelRacingARunningHandlerSettlesTheChildOneWay() {
        let rounds = 200
        let parents = (0..<rounds).map { _ in Promise<Int>() }
        let queue = DispatchQueue(label: "PromiseTests.raceHandler")
        let children = parents.map { p in p.then(on: queue) { $0 + 1 } }
        let grandchildren = children.map { c in c.then(on: .immediate) { $0 * 2 } }
        let finished = raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            if thread == 0 {
                parents[round].fulfill(round)
            } else {
                children[round].cancel(reason: TestError(round))
            }
        }
        XCTAssertTrue(finished)
        queue.sync {}
        for round in 0..<rounds {
            let child = children[round]
            settle(child)
            settle(grandchildren[round])
            switch child.state {
            case .fulfilled:
                XCTAssertEqual(value(child), round + 1)
                // A cancel that lost to the handler is forwarded to pending children.
                if grandchildren[round].isCancelled {
                    assertCancelled(grandchildren[round], reason: round)
                } else {
                    XCTAssertEqual(value(grandchildren[round]), 2 * (round + 1))
                }
            case .cancelled:
                assertCancelled(child, reason: round)
                assertCancelled(grandchildren[round], reason: round)
            default:
                XCTFail("round \(round): child is \(child.state)")
            }
            XCTAssertEqual(parents[round].state, .fulfilled, "cancel flowed up")
        }
    }

    /// A follower (resolve(with:)) is cancelled while the promise it follows settles:
    /// it ends cancelled or with the followed outcome, and a cancelled follower's child
    /// is cancelled too.
    func testCancelRacingTheFollowedPromiseSettlesTheFollowerOneWay() {
        let rounds = 200
        let followers = (0..<rounds).map { _ in Promise<Int>() }
        let sources = (0..<rounds).map { _ in Promise<Int>() }
        for round in 0..<rounds { followers[round].resolve(with: sources[round]) }
        let observed = followers.map { f in f.then(on: .immediate) { $0 } }
        let finished = raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            if thread == 0 {
                sources[round].fulfill(round)
            } else {
                followers[round].cancel(reason: TestError(round))
            }
        }
        XCTAssertTrue(finished)
        for round in 0..<rounds {
            let follower = followers[round]
            settle(follower)
            switch follower.state {
            case .fulfilled:
                XCTAssertEqual(value(follower), round)
                // A cancel that lost to the fulfilment is forwarded to pending children.
                if observed[round].isCancelled {
                    assertCancelled(observed[round], reason: round)
                } else {
                    XCTAssertEqual(value(observed[round]), round)
                }
            case .cancelled:
                assertCancelled(follower, reason: round)
                assertCancelled(observed[round], reason: round)
            default:
                XCTFail("round \(round): follower is \(follower.state)")
            }
        }
    }

    // MARK: Work a promise owns

    /// A child that follows the promise its handler returned owns that work: cancelling
    /// the child reaches it (the Cancellation rule: "It reaches the work a promise owns").
    func testCancellingFollowingChildCancelsTheReturnedPromise() {
        let inner = Promise<Int>()
        let queue = DispatchQueue(label: "PromiseTests.following")
        let handlerRuns = Counter()
        let child = Promise(value: 1).flatMap(on: queue) { _ -> Promise<Int> in
            handlerRuns.increment()
            return inner
        }
        // Drain the queue: the handler has returned `inner` and the child follows it.
        queue.sync {}
        XCTAssertEqual(handlerRuns.value, 1)
        XCTAssertTrue(child.isPending)
        child.cancel(reason: TestError(22))
        assertCancelled(child, reason: 22)
        XCTAssertTrue(inner.isCancelled, "the promise the child followed was not cancelled")
        XCTAssertFalse(inner.fulfill(5))
        assertCancelled(child, reason: 22)
    }

    func testCancelledFollowingChildIgnoresTheReturnedPromiseSettlingLater() {
        let inner = Promise<Int>()
        let child = Promise(value: 1).then(on: .immediate) { _ in inner }  // follows at once
        XCTAssertTrue(child.isPending)
        child.cancel(reason: TestError(23))
        inner.fulfill(5)  // may or may not be refused, depending on forwarding
        assertCancelled(child, reason: 23)
    }

    /// A cancel inside an `.immediate` handler is queued behind the handler, as all the
    /// work a handler triggers (the stack stays flat): the children are cancelled once it
    /// returns, before the outermost settling call does. Until then they read as pending,
    /// but the cancel came first: the handler's own `fulfill` of one of them loses to it
    /// (the Cancellation article says so).
    func testACancelInsideAnImmediateHandlerReachesTheChildrenOnceItReturns() throws {
        let request = Promise<Int>()
        let reply = request.then(on: .immediate) { $0 }
        let other = request.then(on: .immediate) { $0 }
        let seen = Recorder<PromiseState>()
        let won = Recorder<Bool>()
        let trigger = Promise<Int>()
        trigger.whenComplete(on: .immediate) { _ in
            request.cancel()
            seen.append(other.state)
            seen.append(request.state)
            won.append(reply.fulfill(7))
        }
        trigger.fulfill(0)
        XCTAssertEqual(seen.values, [.pending, .cancelled], "queued behind the handler; the promise itself at once")
        XCTAssertTrue(other.isCancelled, "reached once the handler returned")
        XCTAssertEqual(won.values, [false], "a fulfil after the cancel won")
        XCTAssertTrue(reply.isCancelled, "reply ended \(reply.state)")
    }

    /// What a cancel claims it settles at once, inside a handler too: a settled promise's
    /// descendant in flight (its handler queued) is cancelled before `cancel` returns.
    func testACancelOfASettledPromiseInsideAnImmediateHandlerReachesItsQueuedChildAtOnce() {
        let queue = heldQueue()
        let request = Promise(value: 1)
        let reply = request.then(on: queue) { $0 }
        let seen = Recorder<Bool>()
        let trigger = Promise<Int>()
        trigger.whenComplete(on: .immediate) { _ in
            request.cancel()
            seen.append(reply.isCancelled)
            seen.append(reply.fulfill(7))
        }
        trigger.fulfill(0)
        queue.resume()
        queue.sync {}
        XCTAssertEqual(seen.values, [true, false])
    }

    // MARK: Owned work that settled first

    /// Calls `hook` when a handler is sent to it (synchronously, on the thread handing
    /// the handler out), then runs the work on a global queue.
    private struct HookContext: ExecutionContext {
        let hook: @Sendable () -> Void
        func execute(_ work: @escaping @Sendable () -> Void) {
            hook()
            DispatchQueue.global().async(execute: work)
        }
    }

    /// A combinator's output cancelled reaches its inputs still pending; one that
    /// fulfilled before the cancel reached it (here, from the `onCancel` of the input
    /// cancelled first) keeps its value and its consumers, before and after: the cancel
    /// does not flow sideways into it.
    func testCancellingACombinatorLeavesAnInputThatFulfilledFirstUsable() {
        for kind in ["all", "allSettled", "any", "race", "and"] {
            let a = Promise<Int>(), b = Promise<Int>()
            let queued = a.then(on: DispatchQueue(label: "CancellationTests.consumer")) { $0 + 1 }
            b.onCancel { _ = a.fulfill(1) }
            let output: AnyPromise
            switch kind {
            case "all": output = Promise.all([a, b])
            case "allSettled": output = Promise.allSettled([a, b])
            case "any": output = Promise.any([a, b])
            case "race": output = Promise.race([a, b])
            default: output = a.and(b)
            }
            output.cancel()
            XCTAssertTrue(output.isCancelled, kind)
            XCTAssertTrue(b.isCancelled, kind)
            XCTAssertTrue(a.isFulfilled, kind)
            XCTAssertEqual(a.then(on: .immediate) { $0 + 1 }.state, .fulfilled, "\(kind): a later consumer of the input")
            XCTAssertEqual(try? queued.wait(timeout: testTimeout), 2, "\(kind): a queued consumer of the input: \(queued.state)")
        }
    }

    /// A child cancelled in the instant after the promise its handler returned fulfilled
    /// (here, while that promise hands out its observers) takes the cancel; the promise it
    /// followed keeps its value and its other consumers.
    func testCancellingAFollowerLeavesTheFulfilledPromiseItFollowedUsable() {
        let child = Handoff<Promise<Int>>(nil)
        let shared = Promise<Int>()
        _ = shared.then(on: HookContext { child.peek?.cancel() }) { $0 }
        child.put(Promise(value: 0).flatMap(on: .immediate) { _ in shared })
        XCTAssertTrue(shared.fulfill(1))
        XCTAssertTrue(child.peek?.isCancelled ?? false, "\(child.peek?.state as Any)")
        XCTAssertEqual(shared.then(on: .immediate) { $0 + 1 }.state, .fulfilled)
    }

    /// The same for a run's step in flight: `sequence`, `all(_:maxConcurrent:)` and
    /// `retry` cancelled as the step fulfils leave the step as it is.
    func testCancellingARunLeavesAStepThatFulfilledFirstUsable() {
        for form in 0..<3 {
            let output = Handoff<AnyPromise>(nil)
            let shared = Promise<Int>()
            _ = shared.then(on: HookContext { output.peek?.cancel() }) { $0 }
            switch form {
            case 0: output.put(Promise.sequence(on: .immediate, [1]) { _ in shared })
            case 1: output.put(Promise.all([1], maxConcurrent: 1, on: .immediate) { _ in shared })
            default: output.put(Promise.retry(attempts: 2, on: .immediate) { shared })
            }
            XCTAssertTrue(shared.fulfill(1))
            XCTAssertTrue(output.peek?.isCancelled ?? false, "form \(form): \(output.peek?.state as Any)")
            XCTAssertEqual(shared.then(on: .immediate) { $0 + 1 }.state, .fulfilled, "form \(form)")
        }
    }

    /// A run whose step rejects rejects its output with that error and stops; it used to
    /// cancel the rejected step itself on the way, so every later consumer of that step
    /// saw a cancellation instead of its error.
    func testARunStoppedByAStepsErrorLeavesThatStepRejected() {
        for form in 0..<2 {
            let shared = Promise<Int>()
            let output = form == 0
                ? Promise.sequence(on: .immediate, [1]) { _ in shared }
                : Promise.all([1], maxConcurrent: 1, on: .immediate) { _ in shared }
            shared.reject(TestError(3))
            XCTAssertEqual(error(output) as? TestError, TestError(3), "form \(form)")
            XCTAssertTrue(shared.isRejected, "form \(form): \(shared.state)")
            let later = shared.recover(on: .immediate) { _ in 7 }
            XCTAssertEqual(later.state, .fulfilled, "form \(form): a later consumer of the step")
        }
    }

    /// An error handler of a cancelled promise that returns a promise already fulfilled
    /// (a cached answer) leaves it usable: only a returned promise still pending is work
    /// the cancel reaches.
    func testARecoverOfACancelledPromiseReturningAFulfilledPromiseLeavesItUsable() {
        let cached = Promise<Int>(value: 5)
        let parent = Promise<Int>()
        let child = parent.recover(on: .immediate) { _ in cached }
        parent.cancel()
        XCTAssertTrue(child.isCancelled)
        XCTAssertEqual(cached.then(on: .immediate) { $0 + 1 }.state, .fulfilled)
        let pending = Promise<Int>()
        let cancelledParent = Promise<Int>()
        _ = cancelledParent.recover(on: .immediate) { _ in pending }
        cancelledParent.cancel()
        XCTAssertTrue(pending.isCancelled, "a returned promise still pending is cancelled: \(pending.state)")
    }
}
