// Cancelling a long-running combinator's output while its current step settles on another
// thread (`sequence`, `retry`): at most one step starts after the cancel returned, and it
// is cancelled; the output ends cancelled, or settled by its last step if that one won;
// once the output is dropped, nothing the run captured is kept.
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

    /// How each round ended, printed per test: both orders of the race are expected.
    private let outcomes = Recorder<String>()

    override func tearDown() {
        let counts = Dictionary(outcomes.values.map { ($0, 1) }, uniquingKeysWith: +)
        print("\(name): rounds by outcome \(counts.sorted { $0.key < $1.key })")
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
}
