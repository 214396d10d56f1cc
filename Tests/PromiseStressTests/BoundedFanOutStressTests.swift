// Bounded fan-out under fire: two threads settle the works of
// `Promise.all(_:maxConcurrent:on:_:)` in opposite orders (each settle may start the next
// work, on the settling thread), while a third rejects one work or cancels the result.
// Every round checks that no more than `maxConcurrent` works were ever in flight, that the
// result is the values in input order when nothing failed, and that it fails only with
// the rejection or the cancel that the third thread made. And runs (`all(_:maxConcurrent:)`,
// `sequence`, `retry`) settled from outside while their steps settle on another thread:
// their observers leave a long-lived step, which stays bounded over every round.
import Dispatch
import Foundation
import Promise
import XCTest

final class BoundedFanOutStressTests: XCTestCase {
    private struct Boom: Error {}

    /// The most works found pending among those started, each time one starts. (Not a
    /// count kept by observers of the works: an observer registered while another thread
    /// settles the work may run after the run's own, which then starts the next work.)
    private final class Started: @unchecked Sendable {
        private let lock = NSLock()
        private var started: [Promise<Int>] = []
        private(set) var peak = 0

        func add(_ work: Promise<Int>) {
            lock.withLock {
                started.append(work)
                peak = max(peak, started.count { $0.isPending })
            }
        }

        var all: [Promise<Int>] { lock.withLock { started } }
    }

    func testSettlesFromManyThreadsKeepTheBoundAndTheOrder() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let count = 12, limit = 3

        runStressRounds("bounded fan-out: settles, a rejection and a cancel from three threads", invariants: [
            "never more than maxConcurrent works in flight",
            "fulfilled only with every value, in input order",
            "rejected or cancelled only by the third thread's rejection or cancel, with its error",
        ]) { checker in
            let round = checker.round
            let works = (0..<count).map { _ in Promise<Int>() }
            let started = Started()
            let output = Promise<Int>.all(Array(0..<count), maxConcurrent: limit, on: .immediate) { index in
                started.add(works[index])
                return works[index]
            }
            let failedBy = SeatBox<Int>()  // 0: a work rejected, 1: the result cancelled
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                switch seat {
                case 0: for index in 0..<count { works[index].fulfill(index * 10) }
                case 1: for index in (0..<count).reversed() { works[index].fulfill(index * 10) }
                default:
                    spin(random.below(400))
                    switch random.below(3) {
                    case 0: if works[random.below(count)].reject(Boom()) { failedBy.items.append(0) }
                    case 1: output.cancel(); failedBy.items.append(1)
                    default: break  // a round where nothing fails
                    }
                }
            }
            checker.check(finished, "round hung")
            checker.check(started.peak <= limit, "\(started.peak) started works were pending at once")
            let settledOutput = Result { try output.wait(timeout: .seconds(20)) }
            switch settledOutput {
            case .success(let values):
                checker.check(values == (0..<count).map { $0 * 10 }, "fulfilled with \(values)")
            case .failure(let error):
                // A rejection that lost to the fulfils, or a cancel after the result settled,
                // leave it fulfilled; a failure needs one of them, and has its error.
                let expected = failedBy.items.first == 0 ? error is Boom : error is CancellationError
                checker.check(!failedBy.items.isEmpty && expected, "failed with \(error) after \(failedBy.items)")
            }
            return true
        }
    }

    /// Captured by a run's work: alive while anything keeps the run.
    private final class RunToken: Sendable {
        let live: Locked<Int>
        init(_ live: Locked<Int>) {
            self.live = live
            live.withLock { $0 += 1 }
        }
        deinit { live.withLock { $0 -= 1 } }
    }

    func testRunsSettledFromOutsideWhileTheirStepsSettleLeaveALongLivedStep() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        let longLived = Promise<Int>()
        let liveRuns = Locked(0)
        var kinds = [0, 0, 0]
        var peakRuns = 0

        runStressRounds("runs settled from outside while their steps settle", invariants: [
            "the output ends rejected with the outside error (nothing else can settle it)",
            "the long-lived step keeps a bounded number of runs (those its next prune takes), whatever the round",
        ], details: {
            "fan-outs: \(kinds[0]), sequences: \(kinds[1]), retries: \(kinds[2]); most runs kept alive at once: \(peakRuns)"
        }) { checker in
            let round = checker.round
            let kind = round % 3
            kinds[kind] += 1
            let first = Promise<Int>()
            let settleOutside: @Sendable () -> Void
            let outcome: () -> Result<Int, any Error>
            do {
                // The first step settles on the other thread; the next waits on the
                // long-lived promise, which never settles.
                let token = RunToken(liveRuns)
                switch kind {
                case 0, 1:
                    let work: @Sendable (Int) -> Promise<Int> = { index in withExtendedLifetime(token) { index == 0 ? first : longLived } }
                    let output = kind == 0
                        ? Promise<Int>.all([0, 1, 2], maxConcurrent: 2, on: .immediate, work)
                        : Promise<Int>.sequence(on: .immediate, [0, 1, 2], work)
                    settleOutside = { output.reject(Boom()) }
                    outcome = { Result { try output.wait(timeout: .seconds(20)).count } }
                default:
                    let attempts = Locked(0)
                    let output = Promise<Int>.retry(attempts: 3, on: .immediate) {
                        withExtendedLifetime(token) { attempts.withLock { $0 += 1; return $0 } == 1 ? first : longLived }
                    }
                    settleOutside = { output.reject(Boom()) }
                    outcome = { Result { try output.wait(timeout: .seconds(20)) } }
                }
                let finished = crew.play { seat in
                    var random = StressRandom(round: round, seat: seat)
                    crew.barrier.arriveAndWait()
                    spin(random.below(200))
                    if seat == 0 { settleOutside() } else if kind == 2 { first.reject(Boom()) } else { first.fulfill(1) }
                }
                checker.check(finished, "round hung")
                switch outcome() {
                case .failure(let error as Boom): _ = error
                case let other: checker.fail("the output ended \(other)")
                }
            }
            // A run that gave up stays on the long-lived step until its next prune, which
            // comes after as many give-ups as the last prune kept nodes, and at least 8.
            let runs = liveRuns.withLock { $0 }
            peakRuns = max(peakRuns, runs)
            checker.check(runs <= 3 * 8, "\(runs) runs kept alive by the long-lived step")
            return true
        }
        longLived.cancel()
    }
}
