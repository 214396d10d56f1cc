// Bounded fan-out under fire: two threads settle the works of
// `Promise.all(_:maxConcurrent:on:_:)` in opposite orders (each settle may start the next
// work, on the settling thread), while a third rejects one work or cancels the result.
// Every round checks that no more than `maxConcurrent` works were ever in flight, that the
// result is the values in input order when nothing failed, and that it fails only with
// the rejection or the cancel that the third thread made.
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
}
