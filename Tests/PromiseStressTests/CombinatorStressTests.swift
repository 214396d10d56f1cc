// Combinators whose inputs settle on many threads: three settlers fulfil, reject and
// cancel the inputs of `all`, `allSettled`, `any`, `race` and `and` (some rounds with a
// second, competing resolver per input), while a fourth thread builds the same
// aggregates again mid-race and, in some rounds, cancels one of them (which must cancel
// the inputs still pending). Every round checks each aggregate against the inputs' final
// outcomes, and, for aggregates built before the race, against which input provably
// settled first (its settling call returned before any other's began).
import Dispatch
import Foundation
import Promise
import XCTest

final class CombinatorStressTests: XCTestCase {
    private struct Aggregates {
        let all: Promise<[Int]>
        let allSettled: Promise<[Result<Int, any Error>]>
        let any: Promise<Int>
        let race: Promise<Int>
        let and: Promise<(Int, Int, Int)>

        init(_ inputs: [Promise<Int>]) {
            all = Promise.all(inputs)
            allSettled = Promise.allSettled(inputs)
            any = Promise.any(inputs)
            race = Promise.race(inputs)
            and = inputs[0].and(inputs[1], inputs[2])
        }

        var isPending: Bool {
            all.isPending || allSettled.isPending || any.isPending || race.isPending || and.isPending
        }
    }

    /// One settling call on one input, with ticks taken just before and after it.
    private struct Attempt {
        let input: Int
        let outcome: Settled
        let returned: Bool?
        let start: Int
        let end: Int
    }

    func testCombinatorsWhoseInputsSettleOnManyThreads() {
        let settlers = 3
        let inputCount = 6
        let crew = Crew(size: settlers + 1)
        defer { crew.stop() }
        var allFulfilledRounds = 0, firstChecks = 0, aggregateCancels = 0, inputsCancelledByAggregate = 0
        var competingRounds = 0

        runStressRounds("combinators with inputs settling on many threads", invariants: [
            "every aggregate settles (none lost)", "all: values in input order, or a failed input's error",
            "allSettled: every outcome in input order", "any: a fulfilled input's value, or allRejected in order",
            "race: an input's outcome", "and: the tuple, or a failed input's error",
            "the input that provably settled first decides race/any/all/and", "one winner per input",
            "cancelling an aggregate cancels exactly the inputs still pending",
        ], details: {
            "rounds with every input fulfilled \(allFulfilledRounds), with competing resolvers \(competingRounds); "
                + "first-settler checks applied \(firstChecks); aggregates cancelled mid-race \(aggregateCancels), "
                + "inputs they cancelled \(inputsCancelledByAggregate)"
        }) { checker in
            let round = checker.round
            var planner = StressRandom(round: round, seat: 99)
            // The plan: what each input's own settler does (0 fulfil, 1 reject, 2 cancel).
            let plan = (0..<inputCount).map { _ -> Int in
                guard round % 4 != 0 else { return 0 }
                let roll = planner.below(20)
                return roll < 12 ? 0 : roll < 17 ? 1 : 2
            }
            let competing = round % 4 == 3
            let cancelAll = round % 5 == 1
            if competing { competingRounds += 1 }
            let inputs = (0..<inputCount).map { _ in Promise<Int>() }
            let before = Aggregates(inputs)
            let boxes = (0..<settlers).map { _ in SeatBox<Attempt>() }
            let lateBox = SeatBox<Aggregates>()

            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == settlers {
                    spin(random.below(2_000))
                    lateBox.items.append(Aggregates(inputs))
                    if cancelAll {
                        spin(random.below(2_000))
                        before.all.cancel(reason: StressError(id: 999))
                    }
                    return
                }
                let box = boxes[seat]
                let mine = (0..<inputCount).filter { $0 % settlers == seat }
                let order = random.below(2) == 0 ? mine : mine.reversed()
                for i in order {
                    spin(random.below(1_500))
                    let start = Probe.tick()
                    let outcome: Settled
                    var returned: Bool?
                    switch plan[i] {
                    case 0:
                        outcome = .fulfilled(10 * i + 1)
                        returned = inputs[i].fulfill(10 * i + 1)
                    case 1:
                        outcome = .rejected(.stress(300 + i))
                        returned = inputs[i].reject(StressError(id: 300 + i))
                    default:
                        outcome = .cancelled(.stress(400 + i))
                        inputs[i].cancel(reason: StressError(id: 400 + i))
                    }
                    box.items.append(Attempt(input: i, outcome: outcome, returned: returned, start: start, end: Probe.tick()))
                    if competing {
                        // A second resolver for the next input (which another seat owns).
                        let j = (i + 1) % inputCount
                        let start = Probe.tick()
                        let won = inputs[j].fulfill(5_000 + j)
                        box.items.append(Attempt(input: j, outcome: .fulfilled(5_000 + j), returned: won,
                                                 start: start, end: Probe.tick()))
                    }
                }
            }
            guard finished else {
                checker.fail("the crew did not finish within \(StressConfiguration.roundTimeout)s (deadlock?)")
                return false
            }
            guard let after = lateBox.items.first else {
                checker.fail("the late builder built nothing")
                return false
            }
            guard pumpMainRunLoop(until: { !before.isPending && !after.isPending }) else {
                checker.fail("an aggregate never settled (lost): before \(before.isPending), during \(after.isPending)")
                return false
            }

            // Inputs: one winner each, and the calls that report it tell the truth.
            let attempts = boxes.flatMap(\.items)
            let finals = inputs.map { Settled($0) }
            var winner: [Attempt?] = []
            for i in 0..<inputCount {
                let tries = attempts.filter { $0.input == i }
                let winners = tries.filter { $0.outcome == finals[i] }
                if finals[i] == .cancelled(.stress(999)) {
                    checker.check(cancelAll, "input \(i) cancelled by an aggregate that nobody cancelled")
                    checker.check(winners.isEmpty, "input \(i): cancelled by the aggregate and won by a resolver")
                    inputsCancelledByAggregate += 1
                } else {
                    checker.check(winners.count == 1, "input \(i) ended \(finals[i]): \(winners.count) of \(tries.map(\.outcome)) match")
                }
                for attempt in tries {
                    guard let returned = attempt.returned else { continue }
                    checker.check(returned == (attempt.outcome == finals[i]),
                                  "input \(i): a resolver returned \(returned), but the input ended \(finals[i])")
                }
                winner.append(winners.first)
            }
            if checker.failures > 0 { return true }
            if finals.allSatisfy({ if case .fulfilled = $0 { return true } else { return false } }) { allFulfilledRounds += 1 }

            let values: [Int?] = finals.map { if case .fulfilled(let v) = $0 { return v } else { return nil } }
            let tags: [ErrorTag?] = finals.map {
                switch $0 {
                case .rejected(let tag), .cancelled(let tag): return tag
                default: return nil
                }
            }
            let seen: [Seen] = finals.map { $0.seen }

            /// The input among `candidates` that settled strictly before all the others
            /// began settling, if there is one.
            func provablyFirst(_ candidates: [Int]) -> Int? {
                guard !cancelAll, candidates.count > 1 else { return nil }
                let timed = candidates.compactMap { i in winner[i].map { (i, $0) } }
                guard timed.count == candidates.count,
                      let first = timed.min(by: { $0.1.end < $1.1.end }) else { return nil }
                let clear = timed.allSatisfy { $0.0 == first.0 || first.1.end < $0.1.start }
                return clear ? first.0 : nil
            }

            for (label, aggregates) in [("built before", before), ("built during", after)] {
                let ordered = label == "built before"
                let failed = (0..<inputCount).filter { tags[$0] != nil }
                let fulfilled = (0..<inputCount).filter { values[$0] != nil }

                // all
                let all = Final(aggregates.all) { $0 }
                if ordered && cancelAll && all == .cancelled(.stress(999)) {
                    aggregateCancels += 1
                } else if failed.isEmpty {
                    checker.check(all == .fulfilled(values.compactMap { $0 }), "all (\(label)) ended \(all), inputs \(finals)")
                } else if case .rejected(let tag) = all {
                    checker.check(failed.contains { tags[$0] == tag }, "all (\(label)) rejected with \(tag), inputs \(finals)")
                    if ordered, let first = provablyFirst(failed) {
                        firstChecks += 1
                        checker.check(tags[first] == tag, "all (\(label)) rejected with \(tag), but input \(first) failed first: \(finals)")
                    }
                } else {
                    checker.fail("all (\(label)) ended \(all), inputs \(finals)")
                }

                // allSettled
                let allSettled = Final(aggregates.allSettled) { $0.map(Seen.init) }
                checker.check(allSettled == .fulfilled(seen), "allSettled (\(label)) ended \(allSettled), inputs \(finals)")

                // any
                let any = Final(aggregates.any) { $0 }
                if fulfilled.isEmpty {
                    checker.check(any == .rejected(.allRejected(tags.compactMap { $0 })), "any (\(label)) ended \(any), inputs \(finals)")
                } else if case .fulfilled(let v) = any {
                    checker.check(values.contains(v), "any (\(label)) fulfilled with \(v), inputs \(finals)")
                    if ordered, let first = provablyFirst(fulfilled) {
                        firstChecks += 1
                        checker.check(values[first] == v, "any (\(label)) took \(v), but input \(first) fulfilled first: \(finals)")
                    }
                } else {
                    checker.fail("any (\(label)) ended \(any), inputs \(finals)")
                }

                // race
                let race = Final(aggregates.race) { $0 }
                switch race {
                case .fulfilled(let v): checker.check(values.contains(v), "race (\(label)) fulfilled with \(v), inputs \(finals)")
                case .rejected(let tag): checker.check(tags.contains(tag), "race (\(label)) rejected with \(tag), inputs \(finals)")
                default: checker.fail("race (\(label)) ended \(race), inputs \(finals)")
                }
                if ordered, let first = provablyFirst(Array(0..<inputCount)) {
                    firstChecks += 1
                    let expected: Final<Int> = values[first].map { .fulfilled($0) } ?? .rejected(tags[first]!)
                    checker.check(race == expected, "race (\(label)) ended \(race), but input \(first) settled first: \(finals)")
                }

                // and
                let and = Final(aggregates.and) { [$0.0, $0.1, $0.2] }
                let andFailed = failed.filter { $0 < 3 }
                if andFailed.isEmpty {
                    checker.check(and == .fulfilled(values[0..<3].compactMap { $0 }), "and (\(label)) ended \(and), inputs \(finals)")
                } else if case .rejected(let tag) = and {
                    checker.check(andFailed.contains { tags[$0] == tag }, "and (\(label)) rejected with \(tag), inputs \(finals)")
                    if ordered, let first = provablyFirst(andFailed) {
                        firstChecks += 1
                        checker.check(tags[first] == tag, "and (\(label)) rejected with \(tag), but input \(first) failed first: \(finals)")
                    }
                } else {
                    checker.fail("and (\(label)) ended \(and), inputs \(finals)")
                }
            }
            return true
        }
    }

    /// One thread fulfils an input while another cancels an aggregate over it. The cancel
    /// reaches the input only if it is still pending: an input that fulfilled first keeps
    /// its value for every consumer, the one queued before and one registered after;
    /// an input the cancel reached first is cancelled, and so is its consumer.
    func testCancellingAnAggregateNeverSpoilsAnInputThatFulfilledFirst() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        var fulfilledFirst = 0, cancelledFirst = 0
        runStressRounds("an aggregate cancelled while an input fulfils", invariants: [
            "an input that fulfilled keeps its value for its consumers, queued and later",
            "an input the cancel reached first is cancelled, with its consumer",
        ], details: { "input fulfilled first \(fulfilledFirst), cancel first \(cancelledFirst)" }) { checker in
            let round = checker.round
            let a = Promise<Int>(), b = Promise<Int>()
            let queued = a.then(on: .immediate) { $0 + 1 }
            let output: AnyPromise
            switch round % 5 {
            case 0: output = Promise.all([a, b])
            case 1: output = Promise.allSettled([a, b])
            case 2: output = Promise.any([b, a])
            case 3: output = Promise.race([b, a])
            default: output = b.and(a)
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                spin(random.below(1_000))
                if seat == 0 { _ = a.fulfill(round) } else { output.cancel(reason: StressError(id: 7)) }
            }
            guard finished else {
                checker.fail("the crew did not finish within \(StressConfiguration.roundTimeout)s (deadlock?)")
                return false
            }
            if a.isFulfilled {
                fulfilledFirst += 1
                checker.check(Settled(queued) == .fulfilled(round + 1), "the queued consumer of a fulfilled input ended \(Settled(queued))")
                let later = a.then(on: .immediate) { $0 + 1 }
                checker.check(Settled(later) == .fulfilled(round + 1), "a later consumer of a fulfilled input ended \(Settled(later))")
            } else {
                cancelledFirst += 1
                checker.check(Settled(a) == .cancelled(.stress(7)), "the input ended \(Settled(a))")
                checker.check(Settled(queued) == .cancelled(.stress(7)), "its consumer ended \(Settled(queued))")
            }
            return true
        }
    }
}

private extension Settled {
    var seen: Seen {
        switch self {
        case .fulfilled(let v): return .value(v)
        case .rejected(let tag), .cancelled(let tag): return .error(tag)
        case .pending: return .nothing
        }
    }
}
