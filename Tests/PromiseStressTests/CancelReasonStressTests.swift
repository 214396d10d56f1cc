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

    /// A handler's child `child`, linked up (a side branch settled early while it was
    /// pending), whose handler returns as its root's cancel (reason 1) comes down, while
    /// its holder cancels it directly (reason 2). The child's claim may turn into the root's
    /// cancel; a cancel that meets it claimed but not published must leave the registry
    /// walk to the publisher. Whichever way it goes, every descendant takes the reason the
    /// child ends with: those on its list (which its publish fires) and those reached
    /// through its registry (queued below the side branch). The rounds hit the window
    /// between the claim and the publish only now and then; the spin model's claim-window
    /// run (`make verify`) covers it exhaustively, with the old walk as a broken variant.
    func testCancelsRacingAHandlersClaimGiveEveryDescendantTheReasonItEndsWith() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let queue = DispatchQueue(label: "claim window")
        var endings = [0, 0, 0]

        runStressRounds("cancels racing a handler's claim", invariants: [
            "the child ends with its value, the root's reason or the direct cancel's",
            "every descendant, on its list or through its registry, ends with that reason, or its value",
        ], details: { "child fulfilled: \(endings[0]), cancelled by the root: \(endings[1]), directly: \(endings[2])" }) { checker in
            let round = checker.round
            let gate = DispatchSemaphore(value: 0)
            queue.async { gate.wait() }
            let inHandler = StressFlag(), released = StressFlag()
            var random = StressRandom(round: round, seat: 3)
            let handlerDelay = random.below(200)
            let root = Promise<Int>()
            let child = root.then(on: .immediate) { value -> Int in
                inHandler.set()
                while !released.isSet {}
                spin(handlerDelay)
                return value
            }
            let listed = (0..<2).map { _ in child.then(on: queue) { $0 } }
            let early = child.then(on: .immediate) { $0 }
            early.fulfill(1)  // leaves the child's list for its registry: the child is linked up
            let throughRegistry = (0..<2).map { _ in early.then(on: queue) { $0 } }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                switch seat {
                case 0:
                    root.fulfill(0)  // runs the child's handler here
                case 1:
                    inHandler.waitUntilSet()
                    released.set()
                    spin(random.below(200))
                    root.cancel(reason: StressError(id: 1))
                default:
                    inHandler.waitUntilSet()
                    while !released.isSet {}
                    spin(random.below(200))
                    child.cancel(reason: StressError(id: 2))
                }
            }
            checker.check(finished, "round hung")
            gate.signal()
            let outcome = { (promise: Promise<Int>) -> Int in
                do {
                    _ = try promise.wait(timeout: .seconds(20))
                    return 0
                } catch {
                    return error.stressID
                }
            }
            let own = outcome(child)
            endings[max(0, min(own, 2))] += 1
            checker.check(own >= 0 && own <= 2, "the child ended with \(own)")
            let reasons = (listed + throughRegistry).map(outcome)
            // A fulfilled child's descendants may run (0) or take a cancel forwarded
            // through it (the one reason it passes down): never two reasons.
            let expected = own == 0 ? Set(reasons).subtracting([0]).count <= 1 : reasons.allSatisfy { $0 == own }
            checker.check(expected, "the child ended with \(own), its descendants (list, list, registry, registry) with \(reasons)")
            return finished
        }
        queue.sync {}
    }
}
