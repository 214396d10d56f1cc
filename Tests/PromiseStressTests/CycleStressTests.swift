// Cycles closed by several threads at once: each of 2 or 3 threads makes one promise of a
// ring follow the next at the same moment. Whichever thread closes the ring last must see
// the others' links (each records its link, fences, then reads), so every promise of the
// ring ends rejected with PromiseError.cycle: none is left pending for ever. The same for
// rings that pass through combinators (a promise following a race over the next one),
// and for a promise following a combinator over itself while another thread rejects the
// combinator's other input (no cycle: that settles it) or cancels the combinator.
import Dispatch
import Foundation
import Promise
import XCTest

/// Waits for `promise`: true if it ended rejected with `PromiseError.cycle`; else fails
/// the round, saying what `what` ended with.
private func endsInCycle(_ promise: Promise<Int>, _ checker: RoundChecker, _ what: @autoclosure () -> String) -> Bool {
    let outcome = Result { try promise.wait(timeout: .seconds(20)) }
    guard case .failure(PromiseError.cycle) = outcome else {
        checker.fail("\(what()) ended \(outcome) (\(promise.state))")
        return false
    }
    return true
}

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
            for (index, promise) in ring.enumerated()
            where endsInCycle(promise, checker, "promise \(index) of a ring of \(size)") {
                seenBy += 1
            }
            _ = consume ring
            checker.check(weakFirst == nil, "the ring was not freed")
            return true
        }
    }

    /// The same with chains of followers between the threads' links, built inner-first:
    /// the cycle check records where runs of follow links end (as the chains are built, if
    /// they are observed then, else in the threads' walks), and the walks of the threads
    /// closing the ring skip along those ends, and record new ones, while the others lock
    /// in (a recorded end may then jump over a walk's own promise: the walk must still
    /// find the cycle).
    func testRingsOfObservedChainsClosedByThreadsAtOnceAlwaysReject() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var rings = [0, 0, 0, 0]  // by the number of chains
        var rejected = 0

        runStressRounds("rings of observed follow chains closed by threads at once", invariants: [
            "every promise of every chain ends rejected with PromiseError.cycle (none stays pending)",
            "every promise of the round is freed",
        ], details: {
            "rings of 2 chains: \(rings[2]), of 3: \(rings[3]); rejected with cycle: \(rejected) promises"
        }) { checker in
            let round = checker.round
            let size = 2 + round % 2
            let length = 3 + round % 6
            rings[size] += 1
            // chains[c][length] is each chain's innermost; chains[c][0] its outermost.
            let chains = (0..<size).map { _ in (0...length).map { _ in Promise<Int>() } }
            // Observed as they are built (ends recorded then), or not (the first ends are
            // recorded by the threads' walks, while the others lock in).
            let observedWhileBuilt = round % 4 < 2
            for chain in chains {
                if observedWhileBuilt { for promise in chain { promise.whenComplete(on: .immediate) { _ in } } }
                for index in stride(from: length - 1, through: 0, by: -1) { chain[index].resolve(with: chain[index + 1]) }
            }
            weak let weakFirst = chains[0][0]
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                guard seat < size else { return }
                for _ in 0..<random.below(64) { _ = random.next() }
                chains[seat][length].resolve(with: chains[(seat + 1) % size][0])
            }
            checker.check(finished, "round hung")
            for (c, chain) in chains.enumerated() {
                for (index, promise) in chain.enumerated()
                where endsInCycle(promise, checker, "promise \(index) of chain \(c) (\(size) chains of \(length + 1))") {
                    rejected += 1
                }
            }
            _ = consume chains
            checker.check(weakFirst == nil, "the chains were not freed")
            return true
        }
    }

    /// A chain growing at its far end on one thread while two others lock observed side
    /// followers in to its head: their walks skip along the ends recorded at the head and
    /// move those records on to the end they found, racing each other and the growth (a
    /// record is replaced under its word's lock while another walk tries the old end).
    /// Then the far end fulfils, or follows the head, closing a ring: every promise of the
    /// chain and every side follower adopts the value, or ends rejected with
    /// `PromiseError.cycle`.
    func testSideFollowersOfAChainGrowingAtItsFarEndSettleWithIt() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var rings = 0
        var fulfilled = 0

        runStressRounds("side followers locking in to the head of a chain growing at its far end", invariants: [
            "a fulfilled far end: every promise of the chain and every side follower has its value",
            "a far end following the head: every one of them ends rejected with PromiseError.cycle",
            "every promise of the round is freed",
        ], details: {
            "rounds closing a ring: \(rings); fulfilling: \(fulfilled)"
        }) { checker in
            let round = checker.round
            let closesARing = round % 2 == 1
            let growth = 8 + round % 24
            let head = Promise<Int>()
            let chain = [head] + (0..<growth).map { _ in Promise<Int>() }
            let sides = (0..<2).map { _ in (0..<8).map { _ in Promise<Int>() } }
            for seat in sides { for side in seat { side.whenComplete(on: .immediate) { _ in } } }
            weak let weakHead = head
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    for index in 0..<growth {
                        chain[index].resolve(with: chain[index + 1])
                        for _ in 0..<random.below(16) { _ = random.next() }
                    }
                    if closesARing { chain[growth].resolve(with: head) }
                } else {
                    for side in sides[seat - 1] {
                        for _ in 0..<random.below(32) { _ = random.next() }
                        side.resolve(with: head)
                    }
                }
            }
            checker.check(finished, "round hung")
            let everyone = chain + sides.joined()
            if closesARing {
                rings += 1
                for (index, promise) in everyone.enumerated() {
                    _ = endsInCycle(promise, checker, "promise \(index) of \(everyone.count), chain \(growth + 1) long")
                }
            } else {
                fulfilled += 1
                chain[growth].fulfill(round)
                for (index, promise) in everyone.enumerated() {
                    let outcome = Result { try promise.wait(timeout: .seconds(20)) }
                    guard case .success(round) = outcome else {
                        checker.fail("promise \(index) of \(everyone.count) ended \(outcome), not \(round)")
                        continue
                    }
                }
            }
            _ = consume everyone
            _ = consume chain
            _ = consume sides
            _ = consume head
            checker.check(weakHead == nil, "the chain's head was not freed")
            return true
        }
    }

    /// A ring closed through a pending child at the moment that child locks in: a chain
    /// `head -> middle -> child` (the child of a pending `parent`), with the cycle
    /// check's record at `head` going on through the child to `parent` (made before the
    /// threads start, or by their own walks), while one thread locks the child in to
    /// follow `x` and another locks `x` in to follow a side follower of `head`, and a
    /// third locks another side follower in. The child's lock-in ends skips recorded
    /// through it (the walk epoch), which a walk reads as it begins: whichever lock-in
    /// comes last sees the ring, and every promise of it ends rejected with
    /// `PromiseError.cycle`.
    func testARingClosedThroughAChildLockingInAlwaysRejects() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var recordedBefore = 0

        runStressRounds("a ring closed through a pending child as it locks in", invariants: [
            "the child, the chain, x and both side followers end rejected with PromiseError.cycle",
            "every promise of the round is freed",
        ], details: {
            "rounds with the record made before the threads start: \(recordedBefore)"
        }) { checker in
            let round = checker.round
            let parent = Promise<Int>()
            let child = parent.map(on: .immediate) { $0 }
            let head = Promise<Int>(), middle = Promise<Int>(), x = Promise<Int>()
            let side = Promise<Int>(), otherSide = Promise<Int>()
            for promise in [head, middle, x, side, otherSide] { promise.whenComplete(on: .immediate) { _ in } }
            middle.resolve(with: child)
            head.resolve(with: middle)
            if round % 2 == 0 {
                recordedBefore += 1
                side.resolve(with: head)  // records the end at head, through the child
            }
            weak let weakChild = child
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                for _ in 0..<random.below(64) { _ = random.next() }
                switch seat {
                case 0: child.resolve(with: x)
                case 1:
                    if round % 2 == 1 { side.resolve(with: head) }
                    x.resolve(with: side)
                default: otherSide.resolve(with: head)
                }
            }
            checker.check(finished, "round hung")
            for (name, promise) in [("child", child), ("head", head), ("middle", middle), ("x", x),
                                    ("side", side), ("other side", otherSide)] {
                _ = endsInCycle(promise, checker, name)
            }
            parent.cancel()
            _ = consume child
            checker.check(weakChild == nil, "the child was not freed")
            return true
        }
    }

    func testRingsThroughCombinatorsClosedAtOnceAlwaysSettle() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        var kinds = [0, 0, 0, 0]  // by round % 4
        var cycles = 0

        runStressRounds("follow rings through combinators closed by threads at once", invariants: [
            "a ring of two promises, each following a race over the other, ends rejected with PromiseError.cycle",
            "a promise following allSettled over itself ends rejected with PromiseError.cycle",
            "a promise following all over itself and another input takes that input's rejection, or the combinator's cancel; never pending",
            "a cancel of the combinator reaches its inputs still pending",
            "every promise of the round is freed",
        ], details: {
            "rings: \(kinds[0]); allSettled over itself: \(kinds[1]); all over itself against a reject: \(kinds[2]), against a cancel: \(kinds[3]); ended with cycle: \(cycles)"
        }) { checker in
            let round = checker.round
            let kind = round % 4
            kinds[kind] += 1
            let p = Promise<Int>(), q = Promise<Int>()
            weak let weakP = p
            weak let weakQ = q
            // Built before the threads start: a combinator's links to its inputs are there
            // before anyone can follow it.
            let overQ = Promise.race([q])
            let both = Promise.all([p, q])
            let overP: Promise<Int>
            switch kind {
            case 0: overP = Promise.race([p])
            case 1: overP = Promise.allSettled([p, q]).map(on: .immediate) { _ in 0 }
            default: overP = both.map(on: .immediate) { $0[0] + $0[1] }
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                for _ in 0..<random.below(64) { _ = random.next() }
                switch (kind, seat) {
                case (0, 0): p.resolve(with: overQ)
                case (0, _): q.resolve(with: overP)
                case (_, 0): p.resolve(with: overP)
                case (2, _): q.reject(StressError(id: round))
                case (3, _): both.cancel()  // reaches its pending inputs: p
                default: break
                }
            }
            checker.check(finished, "round hung")
            let outcomeP = Result { try p.wait(timeout: .seconds(20)) }
            func isCycle(_ outcome: Result<Int, any Error>) -> Bool {
                if case .failure(PromiseError.cycle) = outcome { return true }
                return false
            }
            if isCycle(outcomeP) { cycles += 1 }
            switch kind {
            case 0:
                let outcomeQ = Result { try q.wait(timeout: .seconds(20)) }
                checker.check(isCycle(outcomeP) && isCycle(outcomeQ), "a ring through races ended \(outcomeP), \(outcomeQ)")
            case 1:
                checker.check(isCycle(outcomeP), "a promise following allSettled([itself, q]) ended \(outcomeP)")
            case 2:
                // `all` may still be settled by q's rejection: no cycle, p takes q's error.
                var rejectedByQ = false
                if case .failure(let error) = outcomeP, error as? StressError == StressError(id: round) { rejectedByQ = true }
                checker.check(rejectedByQ, "a promise following all([itself, q]) while q rejects ended \(outcomeP)")
            default:
                var cancelled = false
                if case .failure(let error) = outcomeP, error is CancellationError { cancelled = true }
                checker.check(isCycle(outcomeP) || cancelled, "against a cancel of the combinator, ended \(outcomeP)")
                // Unless the cycle rejected p, and through it the combinator, first.
                checker.check(both.isCancelled ? q.isCancelled : isCycle(outcomeP),
                              "the combinator's cancel did not reach its other input: \(both), \(q)")
            }
            q.cancel()
            _ = consume p
            _ = consume q
            _ = consume overP
            _ = consume overQ
            _ = consume both
            checker.check(weakP == nil && weakQ == nil, "the promises of the round were not freed")
            return true
        }
    }

    /// `any([p, q])` that `p` follows while another thread rejects `q`: whichever thread
    /// finds the cycle (`p`'s lock-in, or `q`'s recheck through the cycle watch), it
    /// rejects `p`, and the `any` collects `p`'s cycle error with `q`'s, never a bare
    /// `cycle` of its own.
    func testAnAnyThatItsInputFollowsCollectsTheCycleWhoeverFindsIt() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        var rounds = 0

        runStressRounds("an any that its input follows, its other input rejected at once", invariants: [
            "the follower ends rejected with PromiseError.cycle",
            "the any ends rejected with allRejected([cycle, the other input's error])",
            "every promise of the round is freed",
        ], details: { "rounds: \(rounds)" }) { checker in
            let round = checker.round
            rounds += 1
            let p = Promise<Int>(), q = Promise<Int>()
            weak let weakP = p
            weak let weakQ = q
            let any = Promise.any([p, q])
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                for _ in 0..<random.below(64) { _ = random.next() }
                if seat == 0 { p.resolve(with: any) } else { q.reject(StressError(id: round)) }
            }
            checker.check(finished, "round hung")
            let outcomeP = Result { try p.wait(timeout: .seconds(20)) }
            var followerCycled = false
            if case .failure(PromiseError.cycle) = outcomeP { followerCycled = true }
            checker.check(followerCycled, "the follower ended \(outcomeP)")
            let outcome = Result { try any.wait(timeout: .seconds(20)) }
            var collected = false
            if case .failure(PromiseError.allRejected(let errors)) = outcome, errors.count == 2,
               case PromiseError.cycle? = errors[0] as? PromiseError, errors[1] as? StressError == StressError(id: round) {
                collected = true
            }
            checker.check(collected, "the any ended \(outcome)")
            _ = consume p
            _ = consume q
            _ = consume any
            checker.check(weakP == nil && weakQ == nil, "the promises of the round were not freed")
            return true
        }
    }

    /// A run's step that waits on the promise following the run, while that promise locks
    /// in on another thread: the step is made on the default queue (a child of the
    /// promise, for `retry` and for `all(_:maxConcurrent:)`), or locks in itself once a
    /// gate opens (a child of the gate returning the promise). Whichever comes last sees the
    /// other, so the promise always ends rejected with `cycle`, never pending.
    func testRunStepsWaitingOnTheirFollowerAlwaysReject() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        var kinds = [0, 0, 0]

        runStressRounds("a run's step waiting on the promise that locks in to follow the run", invariants: [
            "the promise ends rejected with PromiseError.cycle, however the step's start and the lock-in interleave",
            "every promise of the round is freed",
        ], details: { "retry: \(kinds[0]); all(_:maxConcurrent:): \(kinds[1]); a step locking in behind a gate: \(kinds[2])" }) { checker in
            let round = checker.round
            let kind = round % 3
            kinds[kind] += 1
            let promise = Promise<Int>()
            weak let weakPromise = promise
            let gate = Promise<Void>()
            let output: Promise<Int>
            switch kind {
            case 0:
                output = Promise.retry(attempts: 2, on: .default) { promise.map(on: .immediate) { $0 } }
            case 1:
                output = Promise<Int>.all([0], maxConcurrent: 1, on: .default) { _ in
                    promise.map(on: .immediate) { $0 }
                }.map(on: .immediate) { $0[0] }
            default:
                output = Promise.retry(attempts: 2, on: .immediate) { gate.then(on: .immediate) { promise } }
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                for _ in 0..<random.below(64) { _ = random.next() }
                if seat == 0 { promise.resolve(with: output) } else { gate.fulfill(()) }
            }
            checker.check(finished, "round hung")
            let outcome = Result { try promise.wait(timeout: .seconds(20)) }
            if case .failure(PromiseError.cycle) = outcome {} else {
                checker.fail("the promise following the run ended \(outcome)")
            }
            _ = consume promise
            _ = consume output
            let deadline = Date(timeIntervalSinceNow: 10)
            while weakPromise != nil && Date() < deadline { usleep(100) }
            checker.check(weakPromise == nil, "the promise of the round was not freed")
            return true
        }
    }
}
