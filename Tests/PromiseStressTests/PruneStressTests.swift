// Observers that gave up leave a pending promise while it is raced: two threads run
// `race([work, shutdown])` over one long-lived `shutdown` (each race that `work` wins
// gives its slot on `shutdown` up, and every few give-ups a prune takes them off the
// stack), while a third thread settles `shutdown` at a varying point. The observers that
// still wait on `shutdown` fire once each, in registration order, on the settling thread
// (a settle that meets a prune waits for the nodes to come back and fires them itself);
// every race settles with an input's outcome; no race is kept once everything settled (a
// slot dropped twice, or never, would crash under ASan or leak here).
import Dispatch
import Foundation
import Promise
import XCTest

private struct WeakRace: @unchecked Sendable {
    weak var race: Promise<Int>?
}

final class PruneStressTests: XCTestCase {
    func testPrunesRaceTheSettleOfALongLivedInput() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let racesPerSeat = 24, waiting = 6
        var settledMidRaces = 0

        runStressRounds("prunes: races over a long-lived input while it settles", invariants: [
            "the observers still waiting fire once each, in registration order, on the settling thread",
            "every race settles with one of its inputs' outcomes",
            "no race is kept once its inputs settled",
        ], details: { "rounds where shutdown won some races \(settledMidRaces)" }) { checker in
            let round = checker.round
            let shutdown = Promise<Int>()
            let fired = Locked<[(index: Int, seat: Int?)]>([])
            for index in 0..<waiting {
                shutdown.whenComplete(on: .immediate) { _ in fired.withLock { $0.append((index, Seat.current)) } }
            }
            let races = Locked<[(work: Int, race: Promise<Int>)]>([])
            let weakRaces = Locked<[WeakRace]>([])
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 2 {
                    spin(random.below(3_000))
                    shutdown.fulfill(-1)
                    return
                }
                var mine: [(work: Int, race: Promise<Int>)] = []
                for index in 0..<racesPerSeat {
                    let work = Promise<Int>()
                    let race = Promise.race([work, shutdown])
                    let value = seat * 1_000 + index
                    work.fulfill(value)
                    mine.append((value, race))
                }
                races.withLock { $0.append(contentsOf: mine) }
                weakRaces.withLock { $0.append(contentsOf: mine.map { WeakRace(race: $0.race) }) }
            }
            checker.check(finished, "round hung")
            let order = fired.withLock { $0 }
            checker.check(order.map(\.index) == Array(0..<waiting),
                          "waiting observers fired as \(order.map(\.index)), want each once in order")
            checker.check(order.allSatisfy { $0.seat == 2 }, "a waiting observer fired off the settling thread")
            do {
                let all = races.withLock { $0 }
                if all.contains(where: { (try? $0.race.wait(timeout: .seconds(10))) == -1 }) { settledMidRaces += 1 }
                for (work, race) in all {
                    let result = try? race.wait(timeout: .seconds(10))
                    checker.check(result == work || result == -1, "a race settled with \(String(describing: result))")
                }
            }
            races.withLock { $0.removeAll() }
            checker.check(weakRaces.withLock { $0.allSatisfy { $0.race == nil } }, "a settled race is still kept")
            return true
        }
    }
}
