// Registration at the exact moment of the state flip: one settler and three registrars
// leave a barrier together; the settle lands before, among and after the registrations
// (its delay sweeps across rounds), so some observers are fired by the settler, some
// join the batch it is firing, and some fire inline in the registering call. Every round
// checks that each observer fires exactly once with the outcome, on the right thread,
// and that handlers on one serial queue run in each registrar's registration order.
import Dispatch
import Foundation
import Promise
import Synchronization
import XCTest

/// Counts the burst observers of one round.
private final class BurstCounter: Sendable {
    let fired = Atomic<Int>(0)
    let wrong = Atomic<Int>(0)

    func count(_ right: Bool) {
        if right {
            fired.add(1, ordering: .relaxed)
        } else {
            wrong.add(1, ordering: .relaxed)
        }
    }
}

final class SettleFlipStressTests: XCTestCase {
    private struct Registration {
        let seat: Int
        let index: Int
        let form: Form
        let context: ContextKind
        let probe: Probe
        let child: Promise<Int>?
    }

    /// The mix each registrar cycles through: `.immediate` forms (fired by the settler or
    /// inline), serial-queue forms that run on every outcome (for the order check), and
    /// a few others.
    private static let mix: [(Form, ContextKind)] = [
        (.whenComplete, .immediate), (.whenComplete, .serial), (.thenMap, .immediate),
        (.thenBoth, .serial), (.recover, .immediate), (.always, .serial), (.onCancel, .immediate),
        (.thenBoth, .immediate), (.whenComplete, .serial), (.map, .standard), (.always, .immediate),
        (.catchError, .serial),
    ]

    func testRegistrationCollidesWithTheStateFlip() {
        let registrars = 3
        let perRegistrar = 12
        let burst = 24
        let crew = Crew(size: 1 + registrars)
        defer { crew.stop() }
        let log = ViolationLog()
        var bySettler = 0, inline = 0, roundsAtTheFlip = 0, earlyObserversFired = 0

        runStressRounds("registration at the state flip", invariants: [
            "each observer exactly once (mixed forms and a burst of whenComplete per registrar)", "observers see the outcome", "children settle as specified",
            ".immediate runs on the settler (before settling returns) or inline in the registering call",
            "no Zalgo (other contexts never run on a racing thread)",
            "one serial queue runs each registrar's handlers in registration order (cancelled promises too)",
        ], details: {
            ".immediate observers fired by the settler \(bySettler), inline at registration \(inline); "
                + "rounds where the flip landed among the registrations \(roundsAtTheFlip); "
                + "early observers fired \(earlyObserversFired)"
        }) { checker in
            let round = checker.round
            let promise = Promise<Int>()
            // Observers that are there before the round: the settler has a batch to fire,
            // which keeps the word FIRING for a while, so late registrations queue behind it.
            let early = (0..<6).map { i -> (Probe, Promise<Int>?) in
                let probe = Probe(log: log)
                return (probe, register(i % 2 == 0 ? .thenBoth : .whenComplete, on: promise,
                                        context: i % 3 == 0 ? .standard : .serial, probe: probe))
            }
            let boxes = (0..<registrars).map { _ in SeatBox<Registration>() }
            let settleReturned = SeatBox<Bool>()
            let settledAt = SeatBox<Int>()
            let kind = round % 3
            let value = 2 * round + 1
            let outcome: Settled = kind == 0 ? .fulfilled(value)
                : kind == 1 ? .rejected(.stress(round)) : .cancelled(.stress(-round - 1))

            let expectedSeen = outcomeTable(.whenComplete, after: outcome).seen
            let burstCounter = BurstCounter()
            let finished = crew.play { seat in
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    spin((round &* 37) % 3_000)
                    switch kind {
                    case 0: settleReturned.items.append(promise.fulfill(value))
                    case 1: settleReturned.items.append(promise.reject(StressError(id: round)))
                    default:
                        promise.cancel(reason: StressError(id: -round - 1))
                        settleReturned.items.append(true)
                    }
                    settledAt.items.append(Probe.tick())
                    return
                }
                var random = StressRandom(round: round, seat: seat)
                let box = boxes[seat - 1]
                // First a burst of the cheapest registration, back to back on both cores:
                // registrars collide with each other (and with the settle) on one word.
                for _ in 0..<burst {
                    promise.whenComplete(on: .immediate) { result in
                        burstCounter.count(Seen(result) == expectedSeen)
                    }
                }
                for i in 0..<perRegistrar {
                    let (form, context) = SettleFlipStressTests.mix[(i + seat * 4 + round) % SettleFlipStressTests.mix.count]
                    let probe = Probe(log: log)
                    let child = register(form, on: promise, context: context, probe: probe)
                    if context == .immediate, probe.runs > 0 {
                        // It fired inline: it must have been on this thread, inside the call.
                        let record = probe.snapshot
                        if record.seat != seat && record.seat != 0 {
                            log.add("seat \(seat): \(form) on .immediate ran on seat \(record.seat ?? -1)")
                        }
                    }
                    box.items.append(Registration(seat: seat, index: i, form: form, context: context,
                                                  probe: probe, child: child))
                    spin(random.below(200))
                }
            }
            guard finished else {
                checker.fail("the crew did not finish within \(StressConfiguration.roundTimeout)s (deadlock?)")
                return false
            }
            checker.check(settleReturned.items == [true], "the only settler lost (returned \(settleReturned.items))")
            checker.check(Settled(promise) == outcome, "the promise ended \(Settled(promise)), expected \(outcome)")

            let registrations = boxes.flatMap(\.items)
            let burstTotal = registrars * burst
            let rested = pumpMainRunLoop {
                burstCounter.fired.load(ordering: .relaxed) + burstCounter.wrong.load(ordering: .relaxed) >= burstTotal &&
                registrations.allSatisfy { r in
                    !(r.child?.isPending ?? false) && r.probe.runs >= outcomeTable(r.form, after: outcome).runs
                } && early.allSatisfy { !($0.1?.isPending ?? false) && $0.0.runs >= 1 }
            }
            let burstFired = burstCounter.fired.load(ordering: .relaxed), burstWrong = burstCounter.wrong.load(ordering: .relaxed)
            guard rested else {
                checker.fail("observers never fired or children never settled (lost): burst observers fired "
                             + "\(burstFired + burstWrong) of \(burstTotal)")
                return false
            }
            checker.check(burstFired == burstTotal && burstWrong == 0,
                          "burst observers: \(burstFired) saw the outcome, \(burstWrong) did not, of \(burstTotal)")
            for (index, (probe, child)) in early.enumerated() {
                let form: Form = index % 2 == 0 ? .thenBoth : .whenComplete
                let expected = outcomeTable(form, after: outcome)
                let record = probe.snapshot
                checker.check(record.runs == 1 && record.seen == expected.seen,
                              "early \(form): ran \(record.runs) times, saw \(record.seen.map(String.init(describing:)) ?? "-"), expected \(expected)")
                if let child { checker.check(Settled(child) == expected.child, "early \(form): child ended \(Settled(child)), expected \(expected)") }
                probe.seal(maxRuns: 1, expected: expected.seen, label: "early \(form)")
                earlyObserversFired += record.runs
            }

            var roundBySettler = 0, roundInline = 0
            for r in registrations {
                let expected = outcomeTable(r.form, after: outcome)
                let record = r.probe.snapshot
                let what = "\(r.form) on \(r.context) #\(r.index) of seat \(r.seat), promise \(outcome)"
                checker.check(record.runs == expected.runs, "\(what): ran \(record.runs) times, expected \(expected)")
                if record.runs > 0 {
                    checker.check(record.seen == expected.seen,
                                  "\(what): saw \(record.seen.map(String.init(describing:)) ?? "-"), expected \(expected)")
                    if r.context == .immediate {
                        checker.check(record.seat == 0 || record.seat == r.seat,
                                      "\(what): ran on seat \(record.seat ?? -1), neither the settler nor the registrar")
                        if record.seat == 0 {
                            roundBySettler += 1
                            checker.check(record.sequence < settledAt.items[0],
                                          "\(what): ran on the settler after its settling call returned")
                        } else {
                            roundInline += 1
                        }
                    } else {
                        checker.check(record.seat == nil, "\(what): ran on racing seat \(record.seat ?? -1)")
                    }
                }
                if let child = r.child {
                    checker.check(Settled(child) == expected.child, "\(what): child ended \(Settled(child)), expected \(expected)")
                }
                r.probe.seal(maxRuns: expected.runs, expected: expected.seen, label: what)
            }
            // One serial queue: each registrar's handlers that ran there ran in the order
            // that registrar registered them.
            for seat in 1...registrars {
                let ran = registrations.filter { $0.seat == seat && $0.context == .serial && $0.probe.runs > 0 }
                func inOrder(_ subset: [Registration]) -> Bool {
                    let order = subset.map { $0.probe.snapshot.sequence }
                    return order == order.sorted()
                }
                let describe = {
                    ran.sorted { $0.probe.snapshot.sequence < $1.probe.snapshot.sequence }
                        .map { "#\($0.index) \($0.form)" }.joined(separator: ", ") + " (promise \(outcome))"
                }
                // A cancelled promise too: its children's error sides go to the queue as the
                // settler fires them, in order with the observers.
                checker.check(inOrder(ran),
                              "serial queue ran seat \(seat)'s handlers out of registration order: \(describe())")
            }
            bySettler += roundBySettler
            inline += roundInline
            if roundBySettler > 0 && roundInline > 0 { roundsAtTheFlip += 1 }
            checker.check(log.count == 0, "violations: \(log.first)")
            return true
        }
        drainContexts()
        XCTAssertEqual(log.count, 0, "handlers that ran after their round was checked: \(log.first)")
    }
}
