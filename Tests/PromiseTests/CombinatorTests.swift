import Dispatch
import Foundation
import XCTest
import Promise

private struct Failure: Error, Equatable { let code: Int }

/// Thread-safe log for tests.
private final class Log<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [T] = []
    func append(_ item: T) { lock.lock(); items.append(item); lock.unlock() }
    var all: [T] { lock.lock(); defer { lock.unlock() }; return items }
}

/// Runs `body` on a new thread and waits for it (Dispatch's `sync` would run it here).
private func onAnotherThread(_ body: @escaping @Sendable () -> Void) {
    let done = DispatchSemaphore(value: 0)
    Thread { body(); done.signal() }.start()
    done.wait()
}

private func elapsed(since start: DispatchTime) -> Duration {
    .nanoseconds(Int64(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds))
}

final class CombinatorTests: XCTestCase {
    // MARK: all

    func testAllFulfilsInInputOrderWhateverTheSettleOrder() throws {
        let inputs = (0..<5).map { _ in Promise<Int>() }
        let all = Promise.all(inputs)
        for index in [3, 1, 4, 0, 2] { inputs[index].fulfill(index * 10) }
        XCTAssertEqual(try all.wait(timeout: .seconds(10)), [0, 10, 20, 30, 40])
    }

    func testAllRejectsWithTheFirstError() {
        let inputs = (0..<3).map { _ in Promise<Int>() }
        let all = Promise.all(inputs)
        inputs[1].reject(Failure(code: 1))
        inputs[2].reject(Failure(code: 2))
        inputs[0].fulfill(0)
        XCTAssertThrowsError(try all.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 1)) }
    }

    func testAllOfNothingFulfilsAtOnceWithEmptyArray() {
        let all = Promise<Int>.all([])
        XCTAssertTrue(all.isFulfilled)
        XCTAssertEqual(try all.wait(), [])
    }

    func testCancellingAllCancelsItsPendingInputsOnly() {
        let settled = Promise(value: 1)
        let pending = Promise<Int>()
        let all = Promise.all([settled, pending])
        all.cancel(reason: Failure(code: 9))
        XCTAssertTrue(all.isCancelled)
        XCTAssertTrue(pending.isCancelled)
        XCTAssertThrowsError(try pending.wait()) { XCTAssertEqual($0 as? Failure, Failure(code: 9)) }
        XCTAssertTrue(settled.isFulfilled)
    }

    func testAllWithACancelledInputRejectsWithoutCancellingTheOthers() {
        let cancelled = Promise<Int>()
        let other = Promise<Int>()
        let all = Promise.all([cancelled, other])
        cancelled.cancel()
        XCTAssertThrowsError(try all.wait(timeout: .seconds(10))) { XCTAssertTrue($0 is CancellationError) }
        XCTAssertTrue(all.isRejected)
        XCTAssertTrue(other.isPending, "never sideways")
    }

    func testAllWithInputsSettledConcurrentlyFromManyThreads() throws {
        for _ in 0..<50 {
            let inputs = (0..<64).map { _ in Promise<Int>() }
            let all = Promise.all(inputs)
            DispatchQueue.concurrentPerform(iterations: inputs.count) { inputs[$0].fulfill($0) }
            XCTAssertEqual(try all.wait(timeout: .seconds(10)), Array(0..<64))
        }
    }

    func testAllOverAHundredThousandInputs() throws {
        let inputs = (0..<100_000).map { Promise(value: $0) }
        let all = Promise.all(inputs)
        XCTAssertEqual(try all.wait(timeout: .seconds(30)).count, 100_000)
        let pending = (0..<100_000).map { _ in Promise<Int>() }
        let later = Promise.all(pending)
        for (index, promise) in pending.enumerated() { promise.fulfill(index) }
        XCTAssertEqual(try later.wait(timeout: .seconds(30)).last, 99_999)
    }

    func testAggregatesKeepTheirOutputAliveWhenOnlyAChildIsHeld() throws {
        // Regression: the output must be held by the aggregate (its resolver), not only by
        // the user; a child holds a pending parent weakly.
        func later(_ value: Int) -> Promise<Int> {
            let promise = Promise<Int>()
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) { promise.fulfill(value) }
            return promise
        }
        XCTAssertEqual(try Promise.all([later(1), later(2)]).then { $0.reduce(0, +) }.wait(timeout: .seconds(10)), 3)
        XCTAssertEqual(try Promise.race([later(4), later(5)]).then { $0 > 0 }.wait(timeout: .seconds(10)), true)
        XCTAssertEqual(try Promise.any([later(6)]).then { $0 }.wait(timeout: .seconds(10)), 6)
        XCTAssertEqual(try Promise.allSettled([later(7)]).then { $0.count }.wait(timeout: .seconds(10)), 1)
        XCTAssertEqual(try later(8).and(later(9)).then { $0 + $1 }.wait(timeout: .seconds(10)), 17)
    }

    func testADroppedAggregateOfDroppedInputsIsFreed() {
        weak var weakOutput: Promise<[Int]>?
        weak var weakInput: Promise<Int>?
        do {
            let input = Promise<Int>()
            let output = Promise.all([input, Promise<Int>()])
            weakOutput = output
            weakInput = input
        }
        XCTAssertNil(weakInput)
        XCTAssertNil(weakOutput)
    }

    // MARK: and

    func testAndCombinesDifferentTypesIntoATuple() throws {
        let number = Promise<Int>()
        let text = Promise<String>()
        let flag = Promise<Bool>()
        let combined = number.and(text, flag)
        flag.fulfill(true)
        text.fulfill("two")
        number.fulfill(1)
        let (one, two, three) = try combined.wait(timeout: .seconds(10))
        XCTAssertEqual(one, 1)
        XCTAssertEqual(two, "two")
        XCTAssertEqual(three, true)
    }

    func testAndRejectsWithTheFirstError() {
        let number = Promise<Int>()
        let text = Promise<String>()
        let combined = number.and(text)
        text.reject(Failure(code: 3))
        XCTAssertThrowsError(try combined.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 3)) }
    }

    // MARK: allSettled

    func testAllSettledReportsEveryOutcomeInOrderAndNeverRejects() throws {
        let inputs = (0..<3).map { _ in Promise<Int>() }
        let settled = Promise.allSettled(inputs)
        inputs[2].cancel()
        inputs[0].fulfill(0)
        inputs[1].reject(Failure(code: 1))
        let results = try settled.wait(timeout: .seconds(10))
        XCTAssertEqual(results.count, 3)
        XCTAssertEqual(try results[0].get(), 0)
        XCTAssertThrowsError(try results[1].get()) { XCTAssertEqual($0 as? Failure, Failure(code: 1)) }
        XCTAssertThrowsError(try results[2].get()) { XCTAssertTrue($0 is CancellationError) }
    }

    func testAllSettledOfNothingFulfilsAtOnce() {
        XCTAssertEqual(try Promise<Int>.allSettled([]).wait().count, 0)
    }

    // MARK: any

    func testAnyFulfilsWithTheFirstFulfilment() throws {
        let inputs = (0..<3).map { _ in Promise<Int>() }
        let any = Promise.any(inputs)
        inputs[0].reject(Failure(code: 0))
        inputs[2].fulfill(2)
        inputs[1].fulfill(1)
        XCTAssertEqual(try any.wait(timeout: .seconds(10)), 2)
    }

    func testAnyRejectsWithEveryErrorInInputOrderWhenAllReject() {
        let inputs = (0..<3).map { _ in Promise<Int>() }
        let any = Promise.any(inputs)
        inputs[2].reject(Failure(code: 2))
        inputs[0].reject(Failure(code: 0))
        inputs[1].reject(Failure(code: 1))
        XCTAssertThrowsError(try any.wait(timeout: .seconds(10))) { error in
            guard case PromiseError.allRejected(let errors) = error else { return XCTFail("got \(error)") }
            XCTAssertEqual(errors.map { ($0 as? Failure)?.code }, [0, 1, 2])
        }
    }

    func testAnyOfNothingRejectsAtOnce() {
        let any = Promise<Int>.any([])
        XCTAssertTrue(any.isRejected)
        XCTAssertThrowsError(try any.wait()) { error in
            guard case PromiseError.allRejected(let errors) = error else { return XCTFail("got \(error)") }
            XCTAssertTrue(errors.isEmpty)
        }
    }

    func testAnyWithInputsSettledConcurrently() throws {
        for _ in 0..<50 {
            let inputs = (0..<32).map { _ in Promise<Int>() }
            let any = Promise.any(inputs)
            DispatchQueue.concurrentPerform(iterations: inputs.count) { index in
                if index % 2 == 0 { inputs[index].reject(Failure(code: index)) } else { inputs[index].fulfill(index) }
            }
            let winner = try any.wait(timeout: .seconds(10))
            XCTAssertEqual(winner % 2, 1, "only a fulfilment can win")
        }
    }

    // MARK: race

    func testRaceSettlesLikeTheFirstToSettleEitherWay() throws {
        let slow = Promise<Int>()
        let fast = Promise<Int>()
        let race = Promise.race([slow, fast])
        fast.reject(Failure(code: 5))
        slow.fulfill(1)
        XCTAssertThrowsError(try race.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 5)) }
        let second = Promise.race([Promise<Int>(), Promise(value: 7)])
        XCTAssertEqual(try second.wait(timeout: .seconds(10)), 7)
    }

    func testRaceOfNothingRejectsAtOnceWithInvalidArgument() {
        let race = Promise<Int>.race([])
        XCTAssertTrue(race.isRejected, "a race nobody can win must not stay pending")
        var failure: (any Error)?
        XCTAssertThrowsError(try race.wait(timeout: .zero)) { failure = $0 }
        guard case PromiseError.invalidArgument(let explanation)? = failure as? PromiseError else {
            return XCTFail("race([]) should reject with invalidArgument, got \(race.state)")
        }
        XCTAssertTrue(explanation.contains("Promise.race"), explanation)
        XCTAssertEqual(String(describing: PromiseError.invalidArgument(explanation)),
                       "invalid argument: Promise.race needs at least one promise, and was given none: nothing could ever settle it")
    }

    func testRaceWithInputsSettledConcurrentlyHasExactlyOneWinner() throws {
        for _ in 0..<50 {
            let inputs = (0..<16).map { _ in Promise<Int>() }
            let race = Promise.race(inputs)
            DispatchQueue.concurrentPerform(iterations: inputs.count) { inputs[$0].fulfill($0) }
            let winner = try race.wait(timeout: .seconds(10))
            XCTAssertTrue((0..<16).contains(winner))
        }
    }

    func testCancellingARaceCancelsItsPendingInputs() {
        let inputs = (0..<3).map { _ in Promise<Int>() }
        let race = Promise.race(inputs)
        race.cancel()
        XCTAssertTrue(inputs.allSatisfy { $0.isCancelled })
    }

    // MARK: sequence

    func testSequenceRunsOneStepAfterAnotherInOrder() throws {
        let log = Log<String>()
        let result = Promise.sequence([1, 2, 3]) { value -> Promise<Int> in
            log.append("start \(value)")
            return Promise<Int>(on: .default) {
                log.append("end \(value)")
                return value * 2
            }
        }
        XCTAssertEqual(try result.wait(timeout: .seconds(10)), [2, 4, 6])
        XCTAssertEqual(log.all, ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"])
    }

    func testSequenceStopsAtTheFirstRejection() {
        let log = Log<Int>()
        let result = Promise.sequence([1, 2, 3]) { value -> Promise<Int> in
            log.append(value)
            return value == 2 ? Promise(error: Failure(code: 2)) : Promise(value: value)
        }
        XCTAssertThrowsError(try result.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 2)) }
        XCTAssertEqual(log.all, [1, 2], "no step after the rejection")
    }

    /// The context may follow the inputs, as for `all(_:maxConcurrent:on:_:)`: the work
    /// runs on it.
    func testSequenceTakesItsContextAfterTheInputs() throws {
        let queue = DispatchQueue(label: "PromiseTests.sequence")
        let key = DispatchSpecificKey<Int>()
        queue.setSpecific(key: key, value: 1)
        let onQueue = Log<Bool>()
        let result = Promise.sequence([1, 2], on: queue) { value -> Promise<Int> in
            onQueue.append(DispatchQueue.getSpecific(key: key) == 1)
            return Promise(value: value * 3)
        }
        XCTAssertEqual(try result.wait(timeout: .seconds(10)), [3, 6])
        XCTAssertEqual(onQueue.all, [true, true])
    }

    func testSequenceOfNothingFulfilsWithEmptyArray() throws {
        XCTAssertEqual(try Promise<Int>.sequence([Int]()) { Promise(value: $0) }.wait(timeout: .seconds(10)), [])
    }

    func testCancellingASequenceCancelsTheStepInFlightAndStartsNoOther() throws {
        let log = Log<Int>()
        let firstStep = Promise<Int>()
        let started = Promise<Void>()
        let result = Promise.sequence([1, 2]) { value -> Promise<Int> in
            log.append(value)
            started.fulfill(())
            return firstStep
        }
        try started.wait(timeout: .seconds(10))
        result.cancel()
        // The step may still be on its way to being followed when cancel returns; the
        // cancel reaches it all the same (onCancel runs at once on a cancelled result).
        XCTAssertThrowsError(try firstStep.wait(timeout: .seconds(10))) { XCTAssertTrue($0 is CancellationError) }
        XCTAssertEqual(log.all, [1])
    }

    func testSequenceKeepsOnlyTheStepInFlight() throws {
        let finishedStep = WeakPromise()
        let secondStep = Promise<Int>()
        let secondStarted = Promise<Void>()
        let result = Promise.sequence([1, 2]) { value -> Promise<Int> in
            guard value == 2 else {
                let step = Promise(value: value)
                finishedStep.promise = step
                return step
            }
            secondStarted.fulfill(())
            return secondStep
        }
        try secondStarted.wait(timeout: .seconds(10))
        XCTAssertTrue(eventually { finishedStep.promise == nil }, "a finished step was kept until the sequence ends")
        result.cancel()
        XCTAssertThrowsError(try secondStep.wait(timeout: .seconds(10))) { XCTAssertTrue($0 is CancellationError) }
    }

    // MARK: retry

    func testRetryCallsAtMostAttemptsTimesAndRejectsWithTheLastError() {
        let log = Log<Int>()
        let result = Promise<Int>.retry(attempts: 3, delay: .milliseconds(1)) {
            log.append(0)
            return Promise(error: Failure(code: log.all.count))
        }
        XCTAssertThrowsError(try result.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 3)) }
        XCTAssertEqual(log.all.count, 3)
    }

    func testRetryKeepsOnlyTheAttemptInFlight() throws {
        let failedAttempt = WeakPromise()
        let secondAttempt = Promise<Int>()
        let secondStarted = Promise<Void>()
        let calls = Log<Int>()
        let result = Promise<Int>.retry(attempts: 3) {
            calls.append(0)
            guard calls.all.count == 2 else {
                let attempt = Promise<Int>(error: Failure(code: 1))
                failedAttempt.promise = attempt
                return attempt
            }
            secondStarted.fulfill(())
            return secondAttempt
        }
        try secondStarted.wait(timeout: .seconds(10))
        XCTAssertTrue(eventually { failedAttempt.promise == nil }, "a failed attempt was kept until the retry ends")
        result.cancel()
        XCTAssertThrowsError(try secondAttempt.wait(timeout: .seconds(10))) { XCTAssertTrue($0 is CancellationError) }
        XCTAssertEqual(calls.all.count, 2, "a cancelled attempt is not retried")
    }

    func testRetryWithFewerThanOneAttemptRejectsWithAnExplanationInsteadOfTrapping() {
        for attempts in [0, -3] {
            let calls = Log<Int>()
            let result = Promise<Int>.retry(attempts: attempts) {
                calls.append(0)
                return Promise(value: 1)
            }
            XCTAssertThrowsError(try result.wait(timeout: .seconds(10))) { error in
                guard case PromiseError.invalidArgument = error else { return XCTFail("got \(error)") }
                XCTAssertTrue(error.localizedDescription.contains("\(attempts)"),
                              "the message does not name the bad count: \(error.localizedDescription)")
            }
            XCTAssertEqual(calls.all.count, 0)
        }
    }

    func testRetryStopsAtTheFirstSuccess() throws {
        let log = Log<Int>()
        let result = Promise<String>.retry(attempts: 5) {
            log.append(0)
            return log.all.count < 2 ? Promise(error: Failure(code: 0)) : Promise(value: "ok")
        }
        XCTAssertEqual(try result.wait(timeout: .seconds(10)), "ok")
        XCTAssertEqual(log.all.count, 2)
    }

    func testRetryWaitsTheDelayBetweenAttempts() throws {
        let start = DispatchTime.now()
        let result = Promise<Int>.retry(attempts: 3, delay: .milliseconds(20)) { Promise(error: Failure(code: 0)) }
        XCTAssertThrowsError(try result.wait(timeout: .seconds(10)))
        XCTAssertGreaterThanOrEqual(elapsed(since: start), .milliseconds(40))
    }

    // MARK: timers

    func testAfterFulfilsNoSoonerThanTheInterval() throws {
        let start = DispatchTime.now()
        try Promise.after(.milliseconds(30)).wait(timeout: .seconds(10))
        XCTAssertGreaterThanOrEqual(elapsed(since: start), .milliseconds(30))
    }

    func testCancelledAfterNeverFulfils() throws {
        let timer = Promise.after(.milliseconds(20))
        timer.cancel()
        try Promise.after(.milliseconds(60)).wait(timeout: .seconds(10))
        XCTAssertTrue(timer.isCancelled)
    }

    func testDelayPostponesTheValueButNotARejection() throws {
        let start = DispatchTime.now()
        XCTAssertEqual(try Promise(value: 4).delay(.milliseconds(30)).wait(timeout: .seconds(10)), 4)
        XCTAssertGreaterThanOrEqual(elapsed(since: start), .milliseconds(30))
        let rejected = Promise<Int>(error: Failure(code: 1)).delay(.seconds(60))
        XCTAssertThrowsError(try rejected.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 1)) }
    }

    /// From Google Promises' suite: the output of `delay` is not locked to an internal
    /// timer promise; an outside reject before the time is up wins.
    func testDelayOutputCanBeRejectedFromOutsideBeforeItsTimer() {
        let delayed = Promise(value: 42).delay(.seconds(60))
        XCTAssertTrue(delayed.isPending)
        XCTAssertTrue(delayed.reject(Failure(code: 9)), "the delayed promise ignored an outside reject")
        XCTAssertThrowsError(try delayed.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 9)) }
        XCTAssertFalse(delayed.fulfill(1), "a settled delayed promise took a second outcome")
    }

    func testDelayOutputIsAChildThatACancelOfTheSettledSourceReaches() {
        let source = Promise(value: 1)
        let delayed = source.delay(.seconds(60))
        XCTAssertTrue(delayed.parent === source)
        source.cancel(reason: Failure(code: 3))
        XCTAssertTrue(delayed.isCancelled)
        XCTAssertEqual(source.state, .fulfilled)
    }

    func testTimeoutRejectsTheChildAndLeavesTheSourceUntouched() {
        let source = Promise<Int>()
        let limited = source.timeout(.milliseconds(20))
        XCTAssertThrowsError(try limited.wait(timeout: .seconds(10))) {
            guard case PromiseError.timedOut = $0 else { return XCTFail("got \($0)") }
        }
        XCTAssertTrue(source.isPending)
        XCTAssertTrue(limited.parent === source)
    }

    func testTimeoutPassesAnEarlyOutcomeThrough() throws {
        let source = Promise<Int>()
        let limited = source.timeout(.seconds(60))
        source.fulfill(8)
        XCTAssertEqual(try limited.wait(timeout: .seconds(10)), 8)
    }

    // MARK: wrap

    func testWrapResultShape() throws {
        func legacy(completion: @escaping (Result<Int, any Error>) -> Void) { completion(.success(3)) }
        let wrapped = Promise.wrap { done in legacy(completion: done) }
        XCTAssertEqual(try wrapped.wait(), 3)
    }

    func testWrapOptionalPairShape() throws {
        func legacy(completion: @escaping (String?, (any Error)?) -> Void) { completion("x", nil) }
        func broken(completion: @escaping (String?, (any Error)?) -> Void) { completion(nil, nil) }
        func failing(completion: @escaping (String?, (any Error)?) -> Void) { completion("ignored", Failure(code: 4)) }
        XCTAssertEqual(try Promise.wrap { done in legacy(completion: done) }.wait(), "x")
        XCTAssertThrowsError(try Promise.wrap { done in broken(completion: done) }.wait()) {
            guard case PromiseWrapError.neitherValueNorError = $0 else { return XCTFail("got \($0)") }
        }
        XCTAssertThrowsError(try Promise.wrap { done in failing(completion: done) }.wait()) {
            XCTAssertEqual($0 as? Failure, Failure(code: 4))
        }
    }

    func testWrapValueShapeIgnoresLaterCalls() throws {
        func legacy(completion: @escaping (Int) -> Void) { completion(1); completion(2) }
        XCTAssertEqual(try Promise.wrap { done in legacy(completion: done) }.wait(), 1)
    }

    /// A completion handler of a `Result` with a specific error type.
    func testWrapTypedResultShape() throws {
        enum NetworkError: Error, Equatable { case offline }
        func fetch(completion: @escaping @Sendable (Result<Int, NetworkError>) -> Void) { completion(.success(5)) }
        func offline(completion: @escaping @Sendable (Result<Int, NetworkError>) -> Void) { completion(.failure(.offline)) }
        XCTAssertEqual(try Promise.wrap { done in fetch(completion: done) }.wait(), 5)
        XCTAssertThrowsError(try Promise.wrap { done in offline(completion: done) }.wait()) {
            XCTAssertEqual($0 as? NetworkError, .offline)
        }
    }

    /// A completion handler that gets nothing, or only an optional error, makes a
    /// `Promise<Void>` (the type inferred from the handler's shape); the other shapes keep
    /// their forms on a `Promise<Void>` too.
    func testWrapVoidShapes() throws {
        let calls = Counter()
        func flush(completion: @escaping @Sendable () -> Void) { calls.increment(); completion(); completion() }
        func add(completion: @escaping @Sendable ((any Error)?) -> Void) { completion(nil); completion(Failure(code: 1)) }
        func refuse(completion: @escaping @Sendable ((any Error)?) -> Void) { completion(Failure(code: 2)); completion(nil) }
        func report(completion: @escaping @Sendable (Result<Void, any Error>) -> Void) { completion(.failure(Failure(code: 3))) }
        let flushed = Promise.wrap { done in flush(completion: done) }
        let added = Promise.wrap { done in add(completion: done) }
        let refused = Promise.wrap { done in refuse(completion: done) }
        let reported = Promise.wrap { done in report(completion: done) }
        XCTAssertTrue(type(of: flushed) == Promise<Void>.self && type(of: added) == Promise<Void>.self)
        XCTAssertNoThrow(try flushed.wait())
        XCTAssertEqual(calls.value, 1, "the body runs once")
        XCTAssertNoThrow(try added.wait(), "nil fulfils; the later error is ignored")
        XCTAssertThrowsError(try refused.wait()) { XCTAssertEqual($0 as? Failure, Failure(code: 2)) }
        XCTAssertThrowsError(try reported.wait()) { XCTAssertEqual($0 as? Failure, Failure(code: 3)) }
        struct Unavailable: Error {}
        let thrown = Promise.wrap { (_: @escaping @Sendable () -> Void) in throw Unavailable() }
        XCTAssertThrowsError(try thrown.wait()) { XCTAssertTrue($0 is Unavailable) }
        XCTAssertNoThrow(try Promise<Void>.wrap { done in done() }.wait())
        XCTAssertNoThrow(try Promise<Void>.wrap { done in done(nil) }.wait())
    }

    /// A pending input that `earlier` races, settled by their other input, let go of: each
    /// counted a give-up on it, and every so many a prune. The races are returned to keep.
    private func inputLetGo(byRaces earlier: Int) -> (input: Promise<Int>, races: [Promise<Int>]) {
        let shared = Promise<Int>()
        let races = (0..<earlier).map { _ in
            let other = Promise<Int>()
            defer { other.fulfill(1) }  // settles that race: its slot on `shared` gives up
            return Promise.race([shared, other])
        }
        return (shared, races)
    }

    /// A cancel of an output reaches its pending inputs however many other aggregates let
    /// go of them before.
    func testACancelReachesAPendingInputWhateverItsGiveUpCount() {
        for earlier in 0..<20 {
            let (shared, races) = inputLetGo(byRaces: earlier)
            let last = Promise<Int>()
            Promise.race([shared, last]).cancel(reason: TestError(9))
            XCTAssertTrue(last.isCancelled)
            XCTAssertTrue(shared.isCancelled, "missed after \(earlier) races let go of it")
            withExtendedLifetime(races) {}
        }
    }

    /// The same when another input settles while the cancel is under way (another
    /// thread's `fulfill`, made deterministic by an `.immediate` observer of the output,
    /// which runs inside the cancel's publish), between the cancel's settle of the output
    /// and its look-up of the pending inputs: that settle retires the aggregator, whose
    /// give-up on the pending input may prune it; its slot must still lead the cancel to it.
    func testACancelReachesAPendingInputWhenAnotherInputSettlesDuringTheCancel() {
        func check<Output>(_ name: String, _ makeOutput: ([Promise<Int>]) -> Promise<Output>) {
            for earlier in 0..<20 {
                let (shared, races) = inputLetGo(byRaces: earlier)
                let first = Promise<Int>()
                let output = makeOutput([first, shared])
                output.whenComplete(on: .immediate) { _ in _ = first.fulfill(5) }
                output.cancel(reason: TestError(9))
                XCTAssertTrue(output.isCancelled, name)
                XCTAssertTrue(first.isFulfilled, "\(name): settled before the cancel reached it: left alone")
                XCTAssertTrue(shared.isCancelled, "\(name): missed after \(earlier) races let go of it")
                withExtendedLifetime(races) {}
            }
        }
        check("race") { Promise.race($0) }
        check("allSettled") { Promise.allSettled($0) }
    }

    /// Two cancels of one output at once: every input still pending takes the reason the
    /// output took, never the other canceller's.
    func testConcurrentCancelsGiveTheInputsTheOutputsReason() {
        let rounds = 500
        let rows = (0..<rounds).map { _ -> ([Promise<Int>], Promise<[Int]>) in
            let inputs = (0..<16).map { _ in Promise<Int>() }
            return (inputs, Promise.all(inputs))
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            rows[round].1.cancel(reason: TestError(thread + 1))
        })
        var mismatches = 0
        for (inputs, output) in rows {
            let reason = error(output) as? TestError
            XCTAssertNotNil(reason)
            mismatches += inputs.filter { error($0) as? TestError != reason }.count
        }
        XCTAssertEqual(mismatches, 0, "inputs took the losing canceller's reason")
    }

    // MARK: An input settled inside a handler

    // A combinator's slot runs inside its input's settling call, also when that call is
    // made from an `.immediate` handler (inside another firing): the output has settled
    // before the call returns. (A version that ran every slot from the trampoline settled
    // the output only once the outermost handler returned: the checks below failed.)

    func testAnInputSettledInsideAHandlerDecidesBeforeLaterOnesOnOtherThreads() throws {
        let a = Promise<Int>(), b = Promise<Int>(), c = Promise<Int>(), d = Promise<Int>()
        let race = Promise.race([a, b])
        let all = Promise.all([c, d])
        let trigger = Promise<Void>()
        trigger.whenComplete(on: .immediate) { _ in
            a.fulfill(1)
            c.reject(Failure(code: 1))
            onAnotherThread {
                b.fulfill(2)
                d.reject(Failure(code: 2))
            }
        }
        trigger.fulfill(())
        XCTAssertEqual(try race.wait(timeout: .seconds(10)), 1)
        XCTAssertThrowsError(try all.wait(timeout: .seconds(10))) { XCTAssertEqual($0 as? Failure, Failure(code: 1)) }
    }

    func testAnOutputIsSettledAsItsInputsSettlingCallReturnsInsideAHandler() {
        let a = Promise<Int>(), b = Promise<Int>()
        let race = Promise.race([a, b])
        let seen = Log<String>()
        let trigger = Promise<Void>()
        trigger.whenComplete(on: .immediate) { _ in
            a.fulfill(1)
            seen.append("race \(race.state)")
            race.cancel()  // too late: a decided it
            let made = Promise.all([Promise(value: 1), Promise(value: 2)])
            seen.append("all \(made.state)")
        }
        trigger.fulfill(())
        XCTAssertEqual(seen.all, ["race fulfilled", "all fulfilled"])
        XCTAssertEqual(try race.wait(timeout: .seconds(10)), 1)
        XCTAssertTrue(b.isPending, "a cancel of the settled race reached its losing input")
    }

    /// On one serial queue, a combinator's observer registered before an observer of its
    /// input runs first: the output settled inside the input's firing, before the input's
    /// later observers were sent.
    func testAnOutputsObserverRunsBeforeLaterObserversOfItsInput() {
        assertAnOutputsObserverRunsFirst { input in Promise.race([input]) }
    }

    /// On one serial queue, an observer of `combine(input)` registered before one of
    /// `input` runs first once `input` is fulfilled.
    private func assertAnOutputsObserverRunsFirst(
        _ combine: (Promise<Int>) -> Promise<Int>, file: StaticString = #filePath, line: UInt = #line
    ) {
        let input = Promise<Int>()
        let output = combine(input)
        let queue = DispatchQueue(label: "order")
        let log = Log<String>()
        output.whenComplete(on: queue) { _ in log.append("output") }
        input.whenComplete(on: queue) { _ in log.append("input") }
        input.fulfill(1)
        queue.sync {}
        XCTAssertEqual(log.all, ["output", "input"], file: file, line: line)
    }

    /// An input of a race that another input decided, dropped pending from a handler of
    /// the deciding input: the race has let go of it, so nobody waits on it, and it is no
    /// broken promise.
    func testAnInputDroppedAfterItsRaceWasDecidedIsNoBrokenPromise() throws {
        try assertNoBrokenPromiseWhenADecidingInputDropsALoser { decider, loser in Promise.race([decider, loser]) }
    }

    /// `decider`, with an `.immediate` handler that drops the only holder of a pending
    /// `loser`, is fulfilled with 1: `combine(decider, loser)` (which must settle as the
    /// decider does) fulfils with 1, and no broken promise is reported.
    private func assertNoBrokenPromiseWhenADecidingInputDropsALoser(
        _ combine: (Promise<Int>, Promise<Int>) -> Promise<Int>, file: StaticString = #filePath, line: UInt = #line
    ) throws {
        let reports = Log<String>()
        PromiseDiagnostics.setHandler { event in
            if case .brokenPromise = event.kind { reports.append(event.promiseType) }
        }
        defer { PromiseDiagnostics.setHandler(nil) }
        final class Holder: @unchecked Sendable { var loser: Promise<Int>? = Promise<Int>() }
        let holder = Holder()
        let decider = Promise<Int>()
        decider.whenComplete(on: .immediate) { _ in holder.loser = nil }
        let combined = combine(decider, holder.loser.unsafelyUnwrapped)
        decider.fulfill(1)
        XCTAssertEqual(try combined.wait(timeout: .seconds(10)), 1, file: file, line: line)
        XCTAssertEqual(reports.all, [], file: file, line: line)
    }

    /// The same for a fold 140 levels deep (`acc = race([acc, b])`), past the 128 nested
    /// slot runs a thread makes before it queues the rest: the queued ones run before the
    /// outermost slot returns, so the top has settled as the first input's settling call
    /// returns, observers keep their order, and a loser dropped meanwhile is no broken
    /// promise. (Deferred to the trampoline, the top settled only after the handler, the
    /// race took the loser's brokenPromise, and the order flipped.)
    func testAFoldOfRacesDeeperThanTheInlineLimitSettlesAsItsInputsCallReturns() throws {
        let depth = 140
        func fold(_ first: Promise<Int>, others: [Promise<Int>]) -> Promise<Int> {
            others.reduce(first) { acc, next in Promise.race([acc, next]) }
        }
        // Inside a handler: settled on return.
        let a = Promise<Int>()
        let losers = (0..<depth).map { _ in Promise<Int>() }
        let top = fold(a, others: losers)
        let seen = Log<String>()
        let trigger = Promise<Void>()
        trigger.whenComplete(on: .immediate) { _ in
            a.fulfill(1)
            seen.append("top \(top.state)")
        }
        trigger.fulfill(())
        XCTAssertEqual(seen.all, ["top fulfilled"])
        XCTAssertEqual(try top.wait(timeout: .seconds(10)), 1)

        // Order on one serial queue: the top's observer, registered first, runs first.
        assertAnOutputsObserverRunsFirst { input in fold(input, others: losers) }

        // A loser dropped by a handler of the deciding input.
        try assertNoBrokenPromiseWhenADecidingInputDropsALoser { decider, loser in fold(decider, others: losers + [loser]) }
    }
}
