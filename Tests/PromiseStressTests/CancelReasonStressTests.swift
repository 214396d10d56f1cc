// Two cancels of one promise at the same instant, each with its own reason: exactly one
// wins, and every descendant still pending takes the reason the promise passes down,
// wherever the cancel finds it (on the promise's list, or through its registry: queued
// children below a settled promise, or below a child settled early while the promise
// was pending). Before, the loser walked the registry with its own reason while the
// winner's was not out yet (a claim not yet published, or a forwarding not yet
// published): some descendants took one reason, the rest the other.
import Dispatch
import Foundation
import Promise
import XCTest

final class CancelReasonStressTests: XCTestCase {
    func testTwoCancelsAtOnceGiveEveryDescendantOneReason() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        let queue = DispatchQueue(label: "cancel reasons")
        var shapes = [0, 0]

        runStressRounds("two cancels of one promise at once", invariants: [
            "every descendant ends cancelled, all with one reason, one of the two cancels'",
            "a continuation registered afterwards takes that reason too",
            "a pending promise ends cancelled with it",
        ], details: { "pending promises: \(shapes[0]), settled ones: \(shapes[1])" }) { checker in
            let round = checker.round
            let pending = round.isMultiple(of: 2)
            shapes[pending ? 0 : 1] += 1
            let gate = DispatchSemaphore(value: 0)
            queue.async { gate.wait() }
            let promise = pending ? Promise<Int>() : Promise(value: 0)
            var descendants = (0..<2).map { _ in promise.then(on: queue) { $0 } }
            if pending {
                // Settled early by its holder: it leaves the list for the registry, and
                // its queued children are reached through it.
                let early = promise.then(on: .immediate) { $0 }
                early.fulfill(1)
                descendants += (0..<2).map { _ in early.then(on: queue) { $0 } }
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                spin(random.below(64))
                promise.cancel(reason: StressError(id: seat + 1))
            }
            checker.check(finished, "round hung")
            gate.signal()
            let later = promise.then(on: .immediate) { $0 }
            let reasons = (descendants + [later]).map { child -> Int in
                do {
                    _ = try child.wait(timeout: .seconds(20))
                    return 0
                } catch {
                    return error.stressID
                }
            }
            checker.check(Set(reasons).count == 1 && (reasons[0] == 1 || reasons[0] == 2),
                          "descendants took different reasons: \(reasons)")
            if pending {
                let own = Result { try promise.wait(timeout: .seconds(1)) }
                if case .failure(let error) = own {
                    checker.check(error.stressID == reasons[0], "the promise's own reason \(error.stressID), its descendants' \(reasons)")
                } else {
                    checker.fail("a pending promise cancelled twice is not cancelled")
                }
            }
            return finished
        }
        queue.sync {}
    }
}
