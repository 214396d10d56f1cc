// Cycles closed by several threads at once: each of 2 or 3 threads makes one promise of a
// ring follow the next at the same moment. Whichever thread closes the ring last must see
// the others' links (each records its link, fences, then reads), so every promise of the
// ring ends rejected with PromiseError.cycle: none is left pending for ever.
import Dispatch
import Foundation
import Promise
import XCTest

final class CycleStressTests: XCTestCase {
    func testRingsClosedByThreadsAtOnceAlwaysReject() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var rings = [0, 0, 0, 0]  // by size
        var seenBy = 0

        runStressRounds("follow rings closed by threads at once", invariants: [
            "every promise of a ring ends rejected with PromiseError.cycle (none stays pending)",
            "every promise of the round is freed",
        ], details: {
            "rings of 2: \(rings[2]), of 3: \(rings[3]); rejected with cycle: \(seenBy) promises"
        }) { checker in
            let round = checker.round
            let size = 2 + round % 2
            rings[size] += 1
            let ring = (0..<size).map { _ in Promise<Int>() }
            weak let weakFirst = ring[0]
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                guard seat < size else { return }
                for _ in 0..<random.below(64) { _ = random.next() }
                ring[seat].resolve(with: ring[(seat + 1) % size])
            }
            checker.check(finished, "round hung")
            for (index, promise) in ring.enumerated() {
                let outcome = Result { try promise.wait(timeout: .seconds(20)) }
                guard case .failure(PromiseError.cycle) = outcome else {
                    checker.fail("promise \(index) of a ring of \(size) ended \(outcome) (\(promise.state))")
                    continue
                }
                seenBy += 1
            }
            _ = consume ring
            checker.check(weakFirst == nil, "the ring was not freed")
            return true
        }
    }
}
