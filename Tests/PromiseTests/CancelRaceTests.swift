// Cancels and drops racing work in progress, from an adversarial pass:
// - a long-running combinator's output cancelled while its current step settles on another
//   thread (`sequence`, `retry`): at most one step starts after the cancel returned, and it
//   is cancelled; the output ends cancelled, or settled by its last step if that one won;
//   once the output is dropped, nothing the run captured is kept;
// - a long chain mixing `.immediate`, queues and `.default`, its root fulfilled while its
//   root or a middle step is cancelled: every step settles, nothing below a cancelled step
//   is fulfilled, and everything is freed;
// - every reference to such a chain dropped while its root is fulfilled (or dropped
//   pending) on another thread: the leaf's observer answers once, with the value or
//   `brokenPromise`, and every step and value is freed;
// - two cancels of a settled promise at once: every descendant, queued before or
//   registered after, takes the reason of the one that won;
// - a cancel of a promise whose settling thread is still handing out its children (running
//   an `.immediate` handler, inside a context's `execute`): a child that waits in that
//   firing batch, on any context, takes the cancel, and a resolver (fulfil, reject,
//   resolve) called after the cancel returned loses to it.
import Dispatch
import Foundation
@testable import Promise
import XCTest

final class CancelRaceTests: XCTestCase {
    private struct Reason: Error, Equatable { let round: Int }

    /// The steps of one run: each step the body makes is handed to the test, which settles
    /// it; steps made after the cancel returned are recorded.
    private final class Steps: @unchecked Sendable {
        private let started = DispatchSemaphore(value: 0)
        private let current = Handoff<Promise<Payload>>(nil)
        let cancelReturned = Flag()
        let late = Recorder<Promise<Payload>>()

        /// The body's part: a fresh pending step.
        func make() -> Promise<Payload> {
            let step = Promise<Payload>()
            if cancelReturned.isSet { late.append(step) }
            current.put(step)
            started.signal()
            return step
        }

        /// The test's part: the next step the body made, or nil if none came.
        func next() -> Promise<Payload>? {
            started.wait(timeout: .now() + 10) == .success ? current.take() : nil
        }
    }

    /// Settles steps 0..<k of the run with `settle`, then races step k's `settle` against
    /// the output's cancel. `lastStepWins(output)` says whether an output that is not
    /// cancelled is right (only if k is the last step). Returns what went wrong, or "".
    private func raceCancel<Output>(
        round: Int, k: Int, queue: DispatchQueue,
        output makeOutput: (Steps) -> Promise<Output>,
        settle: @escaping @Sendable (Promise<Payload>, Int) -> Void,
        lastStepWins: (Promise<Output>) -> Bool
    ) -> String {
        let steps = Steps()
        let output = Handoff(makeOutput(steps))
        for index in 0...k {
            guard let step = steps.next() else { return "step \(index) never started" }
            if index < k {
                settle(step, index)
                continue
            }
            // Two threads of their own, released together by a barrier (a pool might run
            // two work items one after the other).
            let raced = raceOnThreads(threads: 2, rounds: 1) { thread, _ in
                if thread == 0 {
                    settle(step, index)
                } else {
                    output.peek?.cancel(reason: Reason(round: round))
                    steps.cancelReturned.set()
                }
            }
            guard raced else { return "the racing threads hung" }
        }
        queue.sync {}
        var message = ""
        if steps.late.count > 1 { message += "\(steps.late.count) steps started after the cancel returned; " }
        for step in steps.late.values where !eventually(timeout: 5, { step.isCancelled }) {
            message += "a step started after the cancel is \(step.state); "
        }
        if let result = output.take() {
            if !result.isCancelled && !lastStepWins(result) { message += "the output is \(result.state)" }
            outcomes.append(steps.late.count == 1 ? "a step started after the cancel" : "\(result.state)")
        }
        return message
    }

    /// How each round ended, printed per test: both orders of a race are expected.
    private let outcomes = Recorder<String>()

    override func tearDown() {
        let counts = Dictionary(outcomes.values.map { ($0, 1) }, uniquingKeysWith: +)
        if !counts.isEmpty { print("\(name): rounds by outcome \(counts.sorted { $0.key < $1.key })") }
        super.tearDown()
    }

    /// 300 rounds of `raceCancel` over runs of `stepCount` steps, cancelled at each step in
    /// turn, on a serial queue and on `.immediate`; then nothing the runs captured is kept.
    private func raceCancelAtEveryStep<Output>(
        steps stepCount: Int,
        output makeOutput: @escaping (Steps, any ExecutionContext, Payload) -> Promise<Output>,
        settle: @escaping @Sendable (Promise<Payload>, Int, LifeTracker) -> Void,
        lastStepWins: @escaping (Promise<Output>) -> Bool
    ) {
        let tracker = LifeTracker()
        for round in 0..<300 {
            let queue = DispatchQueue(label: "CancelRaceTests.run")
            let context: any ExecutionContext = round.isMultiple(of: 2) ? queue : .immediate
            let k = round % stepCount
            let captured = Payload(bytes: [9], tracker: tracker)
            let message = raceCancel(
                round: round, k: k, queue: queue,
                output: { makeOutput($0, context, captured) },
                settle: { settle($0, $1, tracker) },
                lastStepWins: { k == stepCount - 1 && lastStepWins($0) })
            XCTAssertEqual(message, "", "round \(round), cancel at step \(k)")
            if !message.isEmpty { break }
        }
        XCTAssertTrue(eventually { tracker.alive == 0 }, "values kept by dropped runs: \(tracker.alive)")
    }

    func testCancelOfASequenceRacingItsCurrentStep() {
        let stepCount = 12
        raceCancelAtEveryStep(
            steps: stepCount,
            output: { steps, context, captured in
                Promise.sequence(on: context, Array(0..<stepCount)) { _ in
                    _ = captured.bytes
                    return steps.make()
                }
            },
            settle: { step, index, tracker in step.fulfill(Payload(bytes: [UInt8(index)], tracker: tracker)) },
            lastStepWins: { $0.isFulfilled })
    }

    func testCancelOfARetryRacingItsCurrentAttempt() {
        let attempts = 10
        raceCancelAtEveryStep(
            steps: attempts,
            output: { steps, context, captured in
                Promise.retry(attempts: attempts, on: context) { () -> Promise<Payload> in
                    _ = captured.bytes
                    return steps.make()
                }
            },
            settle: { step, _, _ in step.reject(Reason(round: -1)) },
            lastStepWins: { $0.isRejected })
    }

    // MARK: Mixed-context chains

    private static let mixedContexts: [any ExecutionContext] = [
        .immediate, DispatchQueue(label: "CancelRaceTests.serial"), .immediate, .default, .immediate,
        .concurrent(DispatchQueue(label: "CancelRaceTests.concurrent", attributes: .concurrent)),
    ]

    /// Weak references to every promise a round made, to see that all of them are freed.
    private final class Made: @unchecked Sendable {
        private let weaks = Recorder<WeakPromise>()
        func add(_ promise: AnyPromise) {
            let weak = WeakPromise()
            weak.promise = promise
            weaks.append(weak)
        }
        var alive: Int { weaks.values.filter { $0.promise != nil }.count }
    }

    func testCancelOfAMixedChainRacingItsRootsFulfil() {
        for round in 0..<300 {
            let made = Made()
            var message = ""
            do {
                let root = Promise<Int>()
                made.add(root)
                var steps: [Promise<Int>] = []
                var last = root
                for index in 0..<60 {
                    last = last.then(on: Self.mixedContexts[(index + round) % Self.mixedContexts.count]) { $0 + 1 }
                    steps.append(last)
                    made.add(last)
                }
                let target: AnyPromise = round.isMultiple(of: 2) ? root : steps[20]
                let raced = raceOnThreads(threads: 2, rounds: 1) { thread, _ in
                    if thread == 0 {
                        root.fulfill(0)
                    } else {
                        busyWork(microseconds: round % 10 * 20)  // lands the cancel further down, round by round
                        target.cancel(reason: Reason(round: round))
                    }
                }
                if !raced { message += "the racing threads hung; " }
                var sawCancel = false
                var firstCancelled = steps.count
                for (index, step) in steps.enumerated() {
                    do {
                        let value = try step.wait(timeout: .seconds(10))
                        if sawCancel { message += "step \(index) fulfilled below a cancelled step; " }
                        if value != index + 1 { message += "step \(index) has \(value); " }
                    } catch PromiseError.timedOut {
                        message += "step \(index) never settled; "
                        break
                    } catch {
                        if error as? Reason != Reason(round: round) { message += "step \(index) failed with \(error); " }
                        if !sawCancel { firstCancelled = index }
                        sawCancel = true
                    }
                }
                // A cancel flows down, never up: steps above a cancelled middle step settle
                // by themselves.
                if target !== root && firstCancelled < 20 { message += "step \(firstCancelled), above the cancelled step 20, was cancelled; " }
                // Where the cancel caught up with the settle, in tens of steps.
                outcomes.append("first cancelled step \(firstCancelled / 10 * 10)s")
            }
            XCTAssertEqual(message, "", "round \(round)")
            let freed = eventually(timeout: 5) { made.alive == 0 }
            XCTAssertTrue(freed, "round \(round): \(made.alive) promises still alive")
            if !message.isEmpty || !freed { break }
        }
    }

    func testDroppingEveryReferenceToAMixedChainWhileItsRootSettles() {
        let tracker = LifeTracker()
        for round in 0..<400 {
            let made = Made()
            let answers = Recorder<String>()
            let answered = Countdown(1)
            let dropRootPending = round % 3 == 0
            let rootHandoff: Handoff<Promise<Int>>
            do {
                let root = Promise<Int>()
                made.add(root)
                var last = root.then(on: .immediate) { Payload(bytes: [UInt8(truncatingIfNeeded: $0)], tracker: tracker) }
                made.add(last)
                for index in 0..<40 {
                    last = last.then(on: Self.mixedContexts[(index + round) % Self.mixedContexts.count]) {
                        Payload(bytes: $0.bytes + [1], tracker: tracker)
                    }
                    made.add(last)
                }
                last.whenComplete(on: round.isMultiple(of: 2) ? .immediate : .default) { result in
                    switch result {
                    case .success(let value): answers.append("a value of \(value.bytes.count) bytes")
                    case .failure(PromiseError.brokenPromise): answers.append("brokenPromise")
                    case .failure(let error): answers.append("\(error)")
                    }
                    answered.countDown()
                }
                rootHandoff = Handoff(root)
            }
            // Every reference this thread held is gone; the other thread has the last one.
            DispatchQueue.global().async {
                if dropRootPending { _ = rootHandoff.take() } else { rootHandoff.take()?.fulfill(0) }
            }
            XCTAssertTrue(answered.wait(), "round \(round): the leaf's observer never answered")
            XCTAssertEqual(answers.values, [dropRootPending ? "brokenPromise" : "a value of 41 bytes"], "round \(round)")
            XCTAssertEqual(answered.overshoot, 0, "round \(round): the observer answered twice")
            let freed = eventually(timeout: 5) { made.alive == 0 }
            XCTAssertTrue(freed, "round \(round): \(made.alive) promises still alive")
            // Once everything is gone, no late second answer can still come.
            XCTAssertEqual(answers.count, 1, "round \(round): the observer answered \(answers.count) times")
            XCTAssertEqual(answered.overshoot, 0, "round \(round): the observer answered twice")
            if !freed { break }
        }
        XCTAssertTrue(eventually { tracker.alive == 0 }, "values still alive: \(tracker.alive)")
    }

    /// Two cancels of a settled promise race: the one that loses the forwarding used to
    /// walk the registry with its own reason before the winner's was out, so some queued
    /// children took one reason and later continuations the other.
    func testRacingCancelsOfASettledPromiseGiveEveryDescendantOneReason() {
        let queue = DispatchQueue(label: "busy")
        var split: [[Int?]] = []
        // The window is a few instructions wide: a few rounds in 5,000 hit it before the fix.
        let deadline = DispatchTime.now() + .seconds(10)
        for _ in 0..<20_000 where DispatchTime.now() < deadline {
            let gate = DispatchSemaphore(value: 0)
            queue.async { gate.wait() }
            let root = Promise(value: 0)
            let queued = (0..<6).map { _ in root.then(on: queue) { $0 } }
            let start = DispatchSemaphore(value: 0)
            let group = DispatchGroup()
            for id in 1...2 {
                DispatchQueue.global().async(group: group) { start.wait(); root.cancel(reason: Reason(round: id)) }
            }
            start.signal(); start.signal()
            group.wait()
            gate.signal()
            let later = root.then(on: .immediate) { $0 }
            let reasons = (queued + [later]).map { promise -> Int? in
                do { _ = try promise.wait(timeout: .seconds(10)); return nil } catch { return (error as? Reason)?.round }
            }
            if Set(reasons).count != 1 || reasons[0] == nil { split.append(reasons) }
            if split.count >= 3 { break }
        }
        queue.sync {}
        XCTAssertEqual(split.count, 0, "descendants took different reasons, e.g. \(split)")
    }


    /// The same with the resolver far below the waiting child: a chain of `.immediate`
    /// steps under it, still pending, whose leaf is settled by hand, or whose `timeout`
    /// fires (a manual clock, advanced after the cancel). The look above passes every
    /// pending step, however many.
    func testAResolverFarBelowAChildInTheFiringBatchLosesToTheCancel() {
        for depth in [1, 16, 17, 40] {
            for resolver in 0..<3 {
                let p = Promise<Int>()
                let inSlow = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
                let slow = p.then(on: .immediate) { value -> Int in inSlow.signal(); release.wait(); return value }
                var leaf = p.then(on: .immediate) { $0 }
                for _ in 0..<depth { leaf = leaf.then(on: .immediate) { $0 } }
                let clock = ManualClock()
                let timedOut = leaf.timeout(.seconds(1), clock: clock)
                let settler = Thread { p.fulfill(1) }
                settler.start()
                XCTAssertEqual(inSlow.wait(timeout: .now() + testTimeoutSeconds), .success)
                p.cancel(reason: TestError(6))
                var outcome = leaf
                switch resolver {
                case 0: XCTAssertFalse(leaf.fulfill(42), "depth \(depth): a fulfil won over the cancel")
                case 1: leaf.resolve(with: Promise(value: 42))
                default:
                    clock.advance(by: .seconds(2))  // the timer rejects, after the cancel
                    outcome = timedOut
                    XCTAssertTrue(eventually { !timedOut.isPending }, "depth \(depth): the timer never fired")
                }
                let settledMeanwhile = !outcome.isPending
                release.signal()
                XCTAssertTrue(settledMeanwhile || resolver == 0, "depth \(depth), resolver \(resolver): still pending")
                XCTAssertEqual(error(outcome) as? TestError, TestError(6), "depth \(depth), resolver \(resolver): \(outcome.state)")
                _ = try? slow.wait(timeout: testTimeout)
            }
        }
    }

    /// Thread A fulfils `p`, whose first `.immediate` child blocks inside its handler, so
    /// the second waits in A's firing batch: on no list and in no registry. B cancels `p`
    /// meanwhile, then settles that child by hand: the cancel came first, so the
    /// resolver loses (it returns false) and the child, and below it a child queued on a
    /// context, end cancelled with the cancel's reason; the child's handler never runs.
    func testAResolverLosesToACancelThatReachedTheParentWhileItsChildWaitedInTheFiringBatch() {
        for resolver in 0..<5 {
            let p = Promise<Int>()
            let inSlow = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
            let slow = p.then(on: .immediate) { value -> Int in inSlow.signal(); release.wait(); return value }
            let ran = Flag()
            let child = p.then(on: .immediate) { value -> Int in ran.set(); return value + 1 }
            let below = child.then(on: DispatchQueue(label: "CancelRaceTests.below")) { $0 }
            let settler = Thread { p.fulfill(1) }
            settler.start()
            XCTAssertEqual(inSlow.wait(timeout: .now() + testTimeoutSeconds), .success)
            p.cancel(reason: TestError(6))
            let won: Bool
            switch resolver {
            case 0: won = child.fulfill(42)
            case 1: won = child.reject(TestError(1))
            case 2: won = child.resolve(.success(42))
            case 3: child.resolve(with: Promise(value: 42)); won = child.isFulfilled
            default: child.resolve(with: Promise(error: TestError(2))); won = child.isRejected
            }
            release.signal()
            XCTAssertFalse(won, "resolver \(resolver) won over the cancel that came first")
            XCTAssertEqual(error(child) as? TestError, TestError(6), "resolver \(resolver): child \(child.state)")
            XCTAssertTrue(child.isCancelled, "resolver \(resolver): child \(child.state)")
            XCTAssertEqual(error(below) as? TestError, TestError(6), "resolver \(resolver): below \(below.state)")
            XCTAssertEqual(try? slow.wait(timeout: testTimeout), nil, "the running handler's child takes the cancel too")
            XCTAssertFalse(ran.isSet, "resolver \(resolver): the waiting child's handler ran")
        }
    }

    /// A context whose `execute` blocks the settling thread until released, then runs the
    /// work: the children after the one it got wait in that thread's firing batch.
    private final class BlockingContext: ExecutionContext, @unchecked Sendable {
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        func execute(_ work: @escaping @Sendable () -> Void) {
            entered.signal()
            release.wait()
            work()
        }
    }

    /// The same wait for a child whose handler runs on a context: the settling thread,
    /// held inside the context of the child before it, has not sent it yet, so a cancel
    /// of `p` from another thread returns before reaching it (it reads pending); the
    /// settling thread, reaching it, cancels it instead of sending its handler. A
    /// resolver in between loses.
    func testAChildOnAContextWaitingInTheFiringBatchTakesTheCancelInsteadOfItsHandler() {
        for resolver in 0..<2 {
            let p = Promise<Int>()
            let blocking = BlockingContext()
            let first = p.then(on: blocking) { $0 }
            let ran = Flag()
            let child = p.then(on: DispatchQueue(label: "CancelRaceTests.queued")) { value -> Int in ran.set(); return value }
            let settler = Thread { p.fulfill(1) }
            settler.start()
            XCTAssertEqual(blocking.entered.wait(timeout: .now() + testTimeoutSeconds), .success)
            p.cancel(reason: TestError(7))
            XCTAssertTrue(child.isPending, "the child waits in the firing batch, where no cancel walks")
            let won = resolver == 0 ? child.fulfill(42) : child.reject(TestError(1))
            blocking.release.signal()
            XCTAssertFalse(won, "resolver \(resolver) won over the cancel that came first")
            XCTAssertEqual(error(child) as? TestError, TestError(7), "resolver \(resolver): child \(child.state)")
            XCTAssertTrue(child.isCancelled)
            XCTAssertFalse(ran.isSet, "the child's handler ran after its cancel")
            XCTAssertEqual(error(first) as? TestError, TestError(7), "the child being sent takes the cancel too")
        }
    }

    #if DEBUG  // the hook exists in debug builds only
    /// An ancestor's cancel that takes a child's claim over in the instant between the
    /// child's lock-in to follow the promise its handler returned and the recording of
    /// that link (the debug build's `FollowWindowHook` puts it there) finds no link to
    /// forward through; the child then finds its claim taken when it looks up its
    /// ancestors. The promise the handler returned is the child's own work all the same:
    /// it ends cancelled, with the ancestor's reason, and the child too. (In a plain race
    /// the window is a few instructions wide: 25 of 700,000 rounds missed the work.)
    func testAnAncestorsCancelInTheFollowWindowStillReachesTheReturnedPromise() {
        defer { FollowWindowHook.install(nil) }
        for context in [DispatchQueue(label: "follow window") as any ExecutionContext, .immediate] {
            let root = Promise<Int>()
            let work = Promise<Int>()
            let child = Handoff<AnyPromise>(nil)
            let hookRan = Flag()
            FollowWindowHook.install { follower in
                guard follower === child.peek, !hookRan.isSet else { return }
                hookRan.set()
                root.cancel(reason: TestError(5))
            }
            let following = root.then(on: context) { _ in work }
            child.put(following)
            root.fulfill(1)
            assertCancelled(following, reason: 5)
            XCTAssertTrue(hookRan.isSet, "the cancel never ran in the window")
            assertCancelled(work, reason: 5)
            FollowWindowHook.install(nil)
        }
    }
    #endif
}
