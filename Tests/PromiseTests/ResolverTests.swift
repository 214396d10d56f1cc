// The resolver side: fulfill / reject / resolve / resolve(with:), the initialisers
// (except the async one), and the race between resolvers.
import Dispatch
import Foundation
import Promise
import XCTest

/// An outcome as text, so observers' records compare with `==`.
@Sendable private func describe(_ result: Result<Int, any Error>) -> String {
    switch result {
    case .success(let v): return "value \(v)"
    case .failure(let e): return "error \(e)"
    }
}

final class ResolverTests: XCTestCase {

    // MARK: Settling once

    func testNewPromiseIsPending() {
        let p = Promise<Int>()
        XCTAssertEqual(p.state, .pending)
        XCTAssertTrue(p.isPending)
    }

    func testFulfillSettlesOnceAndLaterCallsReturnFalse() {
        let p = Promise<Int>()
        XCTAssertTrue(p.fulfill(1))
        XCTAssertFalse(p.fulfill(2))
        XCTAssertFalse(p.reject(TestError(1)))
        XCTAssertFalse(p.resolve(.success(3)))
        XCTAssertFalse(p.resolve(.failure(TestError(2))))
        p.cancel(reason: TestError(3))
        XCTAssertEqual(p.state, .fulfilled)
        XCTAssertEqual(value(p), 1)
    }

    func testRejectSettlesOnceAndLaterCallsReturnFalse() {
        let p = Promise<Int>()
        XCTAssertTrue(p.reject(TestError(1)))
        XCTAssertFalse(p.reject(TestError(2)))
        XCTAssertFalse(p.fulfill(2))
        XCTAssertFalse(p.resolve(.success(3)))
        p.cancel()
        XCTAssertEqual(p.state, .rejected)
        XCTAssertEqual(error(p) as? TestError, TestError(1))
    }

    func testResolveWithSuccessFulfils() {
        let p = Promise<String>()
        XCTAssertTrue(p.resolve(.success("a")))
        XCTAssertFalse(p.resolve(.success("b")))
        XCTAssertEqual(p.state, .fulfilled)
        XCTAssertEqual(value(p), "a")
    }

    func testResolveWithFailureRejects() {
        let p = Promise<String>()
        XCTAssertTrue(p.resolve(.failure(TestError(7))))
        XCTAssertFalse(p.fulfill("late"))
        XCTAssertEqual(p.state, .rejected)
        XCTAssertEqual(error(p) as? TestError, TestError(7))
    }

    /// A `Result` with a specific error type settles a promise as one with `any Error`
    /// does, through `resolve(_:)` and `init(result:)`.
    func testResultsWithATypedErrorSettle() {
        enum NetworkError: Error, Equatable { case offline }
        let typed = Promise<Int>()
        XCTAssertTrue(typed.resolve(Result<Int, NetworkError>.failure(.offline)))
        XCTAssertFalse(typed.resolve(Result<Int, NetworkError>.success(1)))
        XCTAssertEqual(error(typed) as? NetworkError, .offline)
        XCTAssertEqual(value(Promise(result: Result<String, NetworkError>.success("a"))), "a")
        XCTAssertEqual(error(Promise(result: Result<String, NetworkError>.failure(.offline))) as? NetworkError, .offline)
        let untyped = Promise<Int>()
        XCTAssertTrue(untyped.resolve(.success(2)), "an untyped `.success` still resolves")
        XCTAssertEqual(value(untyped), 2)
    }

    /// `fulfill()` on a `Promise<Void>`, as `fulfill(())`.
    func testFulfillWithoutArgumentOnAVoidPromise() {
        let done = Promise<Void>()
        XCTAssertTrue(done.fulfill())
        XCTAssertFalse(done.fulfill(), "settled once")
        XCTAssertFalse(done.fulfill(()))
        XCTAssertTrue(done.isFulfilled)
        let unapplied = Promise<Void>().fulfill  // still `fulfill(_:)`, as before `fulfill()`
        XCTAssertTrue(unapplied(()))
    }

    func testCancelledPromiseIgnoresLaterResolvers() {
        let p = Promise<Int>()
        p.cancel(reason: TestError(5))
        XCTAssertFalse(p.fulfill(1))
        XCTAssertFalse(p.reject(TestError(6)))
        XCTAssertFalse(p.resolve(.success(2)))
        assertCancelled(p, reason: 5)
    }

    func testLaterResolversFromOtherThreadsAllReturnFalse() {
        let p = Promise<Int>()
        XCTAssertTrue(p.fulfill(42))
        let successes = Counter()
        DispatchQueue.concurrentPerform(iterations: 16) { i in
            if p.fulfill(i) { successes.increment() }
            if p.reject(TestError(i)) { successes.increment() }
            if p.resolve(.success(-i)) { successes.increment() }
            p.cancel(reason: TestError(i))
        }
        XCTAssertEqual(successes.value, 0)
        XCTAssertEqual(p.state, .fulfilled)
        XCTAssertEqual(value(p), 42)
    }

    // MARK: Racing resolvers

    /// Each round, four threads leave a barrier together and each tries a different
    /// resolver on the same promise: exactly one wins (a canceller wins if the promise
    /// ends cancelled, and then no other call returned true), and every observer,
    /// registered by the same threads during the race, sees that one outcome.
    func testRacingResolversExactlyOneWins() {
        let threads = 4
        let rounds = 300
        let promises = (0..<rounds).map { _ in Promise<Int>() }
        let wins = (0..<rounds).map { _ in Recorder<Int>() }
        let observed = (0..<rounds).map { _ in Recorder<String>() }
        let observersDone = Countdown()

        let finished = raceOnThreads(threads: threads, rounds: rounds) { thread, round in
            let p = promises[round]
            observersDone.add()
            p.whenComplete(on: .immediate) { result in
                observed[round].append(describe(result))
                observersDone.countDown()
            }
            switch thread {
            case 0: if p.fulfill(thread) { wins[round].append(thread) }
            case 1: if p.reject(TestError(thread)) { wins[round].append(thread) }
            case 2: if p.resolve(.success(thread)) { wins[round].append(thread) }
            default: p.cancel(reason: TestError(thread))
            }
            observersDone.add()
            p.whenComplete(on: .default) { result in
                observed[round].append(describe(result))
                observersDone.countDown()
            }
        }
        XCTAssertTrue(finished, "racing threads did not finish")
        XCTAssertTrue(observersDone.wait(), "observers did not all run")
        XCTAssertEqual(observersDone.overshoot, 0, "an observer ran twice")

        var outcomesSeen = Set<PromiseState>()
        for round in 0..<rounds {
            let p = promises[round]
            let winners = wins[round].values
            outcomesSeen.insert(p.state)
            let expected: String
            switch p.state {
            case .cancelled:
                XCTAssertEqual(winners, [], "round \(round): a resolver won against cancel")
                expected = "error TestError(3)"
            case .fulfilled:
                XCTAssertEqual(winners.count, 1, "round \(round): winners \(winners)")
                XCTAssertTrue(winners == [0] || winners == [2], "round \(round): winners \(winners)")
                expected = "value \(winners.first ?? -1)"
            case .rejected:
                XCTAssertEqual(winners, [1], "round \(round)")
                expected = "error TestError(1)"
            case .pending:
                XCTFail("round \(round): still pending after every resolver ran")
                continue
            }
            let seen = observed[round].values
            XCTAssertEqual(seen.count, 2 * threads, "round \(round): observers that ran")
            XCTAssertEqual(Set(seen), [expected], "round \(round): observers disagree")
        }
        // Not an assertion of scheduling, only a record of how varied the races were.
        print("testRacingResolversExactlyOneWins: outcomes seen \(outcomesSeen)")
    }

    /// Many threads fulfil the same promise with different values; exactly one call
    /// returns true and the promise holds that thread's value.
    func testRacingFulfillersExactlyOneWinsWithItsValue() {
        let threads = 4
        let rounds = 300
        let promises = (0..<rounds).map { _ in Promise<Int>() }
        let wins = (0..<rounds).map { _ in Recorder<Int>() }
        let finished = raceOnThreads(threads: threads, rounds: rounds) { thread, round in
            if promises[round].fulfill(thread) { wins[round].append(thread) }
        }
        XCTAssertTrue(finished)
        for round in 0..<rounds {
            let winners = wins[round].values
            XCTAssertEqual(winners.count, 1, "round \(round): winners \(winners)")
            XCTAssertEqual(value(promises[round]), winners.first, "round \(round)")
        }
    }

    // MARK: resolve(with:)

    func testResolveWithFollowsFulfilment() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        p.resolve(with: other)
        XCTAssertTrue(p.isPending)
        other.fulfill(9)
        XCTAssertEqual(value(p), 9)
        XCTAssertEqual(p.state, .fulfilled)
    }

    func testResolveWithFollowsRejection() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        p.resolve(with: other)
        other.reject(TestError(4))
        XCTAssertEqual(error(p) as? TestError, TestError(4))
        XCTAssertEqual(p.state, .rejected)
    }

    func testResolveWithFollowsCancellation() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        p.resolve(with: other)
        other.cancel(reason: TestError(8))
        assertCancelled(p, reason: 8)
    }

    func testResolveWithAlreadySettledPromiseAdoptsItsOutcome() {
        let fulfilled = Promise<Int>()
        fulfilled.resolve(with: Promise(value: 3))
        XCTAssertEqual(value(fulfilled), 3)

        let rejected = Promise<Int>()
        rejected.resolve(with: Promise<Int>(error: TestError(3)))
        XCTAssertEqual(error(rejected) as? TestError, TestError(3))

        let cancelledSource = Promise<Int>()
        cancelledSource.cancel(reason: TestError(33))
        let cancelled = Promise<Int>()
        cancelled.resolve(with: cancelledSource)
        assertCancelled(cancelled, reason: 33)
    }

    func testResolveWithFollowsPromiseSettledLaterFromAnotherThread() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        p.resolve(with: other)
        DispatchQueue.global().async { other.fulfill(77) }
        XCTAssertEqual(value(p), 77)
    }

    func testResolveWithLocksInAndLaterResolversAreIgnored() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        p.resolve(with: other)
        XCTAssertFalse(p.fulfill(1))
        XCTAssertFalse(p.reject(TestError(1)))
        XCTAssertFalse(p.resolve(.success(2)))
        XCTAssertTrue(p.isPending)
        other.fulfill(3)
        XCTAssertEqual(value(p), 3)
    }

    func testSecondResolveWithIsIgnored() {
        let p = Promise<Int>()
        let first = Promise<Int>()
        let second = Promise<Int>()
        p.resolve(with: first)
        p.resolve(with: second)
        second.fulfill(2)
        XCTAssertTrue(p.isPending, "p followed the second promise")
        first.fulfill(1)
        XCTAssertEqual(value(p), 1)
    }

    func testResolveWithOnSettledPromiseIsIgnored() {
        let p = Promise(value: 1)
        let other = Promise<Int>()
        p.resolve(with: other)
        other.fulfill(2)
        XCTAssertEqual(value(p), 1)
    }

    func testResolveWithIsStillCancellable() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        p.resolve(with: other)
        p.cancel(reason: TestError(12))
        assertCancelled(p, reason: 12)
        other.fulfill(5)
        XCTAssertEqual(value(other), 5)
        assertCancelled(p, reason: 12)
    }

    func testResolveWithRunsHandlersOfTheFollower() {
        let p = Promise<Int>()
        let other = Promise<Int>()
        let child = p.then { $0 * 2 }
        p.resolve(with: other)
        other.fulfill(21)
        XCTAssertEqual(value(child), 42)
    }

    func testLongResolveWithChainSettles() {
        // Each promise follows the next; settling the last one settles them all.
        let count = 10_000
        let chain = (0..<count).map { _ in Promise<Int>() }
        for i in 0..<(count - 1) { chain[i].resolve(with: chain[i + 1]) }
        chain[count - 1].fulfill(5)
        XCTAssertEqual(value(chain[0]), 5)
        XCTAssertTrue(chain.allSatisfy { $0.isFulfilled })
    }

    // MARK: Initialisers

    func testSettledInitialisers() {
        let fulfilled = Promise(value: 1)
        XCTAssertEqual(fulfilled.state, .fulfilled)
        XCTAssertEqual(value(fulfilled), 1)
        XCTAssertFalse(fulfilled.fulfill(2))

        let rejected = Promise<Int>(error: TestError(2))
        XCTAssertEqual(rejected.state, .rejected)
        XCTAssertEqual(error(rejected) as? TestError, TestError(2))

        let fromSuccess = Promise(result: Result<Int, any Error>.success(3))
        XCTAssertEqual(fromSuccess.state, .fulfilled)
        XCTAssertEqual(value(fromSuccess), 3)

        let fromFailure = Promise(result: Result<Int, any Error>.failure(TestError(4)))
        XCTAssertEqual(fromFailure.state, .rejected)
        XCTAssertEqual(error(fromFailure) as? TestError, TestError(4))
    }

    func testClosureInitialiserRunsBodySynchronouslyOnce() {
        let runs = Counter()
        let p = Promise<Int> { fulfill, _ in
            runs.increment()
            fulfill(1)
        }
        XCTAssertEqual(runs.value, 1)
        XCTAssertEqual(p.state, .fulfilled)
        XCTAssertEqual(value(p), 1)
    }

    func testClosureInitialiserBodyRunsBeforeInitReturns() {
        let ran = Flag()
        let p = ThreadMarker.inside("init") {
            Promise<Int> { fulfill, _ in
                XCTAssertTrue(ThreadMarker.isInside("init"), "body ran outside the init call")
                ran.set()
                fulfill(1)
            }
        }
        XCTAssertTrue(ran.isSet)
        XCTAssertTrue(p.isFulfilled)
    }

    func testClosureInitialiserThrowRejects() {
        let p = Promise<Int> { _, _ in throw TestError(21) }
        XCTAssertEqual(p.state, .rejected)
        XCTAssertEqual(error(p) as? TestError, TestError(21))
    }

    func testClosureInitialiserRejectParameterRejects() {
        let p = Promise<Int> { _, reject in reject(TestError(22)) }
        XCTAssertEqual(error(p) as? TestError, TestError(22))
    }

    func testClosureInitialiserThrowAfterFulfilKeepsTheValue() {
        let p = Promise<Int> { fulfill, _ in
            fulfill(5)
            throw TestError(23)
        }
        XCTAssertEqual(value(p), 5)
    }

    func testClosureInitialiserResolversMayBeCalledLaterFromAnotherThread() {
        let p = Promise<Int> { fulfill, reject in
            DispatchQueue.global().async {
                fulfill(6)
                reject(TestError(24))  // ignored: already settled
            }
        }
        XCTAssertEqual(value(p), 6)
    }

    func testInitOnContextRunsWorkOnThatContext() {
        let queue = DispatchQueue(label: "PromiseTests.initOn")
        let key = DispatchSpecificKey<Int>()
        queue.setSpecific(key: key, value: 7)
        let p = Promise<Int>(on: queue) {
            guard DispatchQueue.getSpecific(key: key) == 7 else { throw TestError(99) }
            return 7
        }
        XCTAssertEqual(value(p), 7)
    }

    func testInitOnContextThrowRejects() {
        let p = Promise<Int>(on: .default) { throw TestError(25) }
        XCTAssertEqual(error(p) as? TestError, TestError(25))
    }

    func testInitOnCustomContextRunsThroughExecuteOnce() {
        let context = CountingContext()
        let runs = Counter()
        let p = Promise<String>(on: context) {
            runs.increment()
            return "done"
        }
        XCTAssertEqual(value(p), "done")
        context.queue.sync {}  // flush: nothing else was scheduled
        XCTAssertEqual(context.calls.value, 1)
        XCTAssertEqual(runs.value, 1)
    }

    func testInitOnContextDoesNotRunWorkInsideInit() {
        let insideInit = Flag()
        let queue = DispatchQueue(label: "PromiseTests.initOnZalgo")
        let p = ThreadMarker.inside("init") {
            Promise<Int>(on: queue) {
                if ThreadMarker.isInside("init") { insideInit.set() }
                return 1
            }
        }
        XCTAssertEqual(value(p), 1)
        XCTAssertFalse(insideInit.isSet)
    }
}
