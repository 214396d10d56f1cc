// The diagnostics hook under fire: two threads drop rejected promises nobody observed (and
// observed ones) while a third swaps the handler between two recorders and off. Each
// unobserved rejection is reported at most once, to one handler, and an observed one
// never; the handler swap never loses a handler that is running (a use after free would
// crash, or show under ASan and TSan).
import Dispatch
import Foundation
import Promise
import XCTest

final class DiagnosticsStressTests: XCTestCase {
    private struct Numbered: Error { let number: Int }

    override func tearDown() {
        PromiseDiagnostics.setHandler(nil)
        super.tearDown()
    }

    func testReportsRaceHandlerSwapsAndAreNeverRepeated() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let first = SeatBox<Int>(), second = SeatBox<Int>()
        let lock = NSLock()
        func recorder(_ box: SeatBox<Int>) -> @Sendable (PromiseDiagnostic) -> Void {
            { event in
                guard case .unhandledRejection(let error) = event.kind, let numbered = error as? Numbered else { return }
                lock.withLock { box.items.append(numbered.number) }
            }
        }
        let handlers = [recorder(first), recorder(second)]
        let perSeat = 8

        runStressRounds("diagnostics: rejections dropped while the handler is swapped", invariants: [
            "an unobserved rejection is reported at most once",
            "an observed rejection is never reported",
        ]) { checker in
            let round = checker.round
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 2 {
                    for swap in 0..<3 {
                        spin(random.below(200))
                        PromiseDiagnostics.setHandler(swap == 2 ? nil : handlers[swap])
                    }
                    return
                }
                for index in 0..<perSeat {
                    let number = (round * 2 + seat) * perSeat + index
                    let promise = Promise<Int>()
                    promise.reject(Numbered(number: index.isMultiple(of: 2) ? number : -number - 1))
                    if !index.isMultiple(of: 2) { _ = try? promise.wait(timeout: .zero) }  // observed
                }
            }
            checker.check(finished, "round hung")
            let reported = lock.withLock { first.items + second.items }
            checker.check(!reported.contains { $0 < 0 }, "an observed rejection was reported")
            checker.check(Set(reported).count == reported.count, "a rejection was reported twice")
            return true
        }
    }
}
