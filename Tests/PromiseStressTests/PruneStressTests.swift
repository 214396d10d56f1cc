// Observers that gave up leave a pending promise while it is raced: two threads run
// `race([work, shutdown])` over one long-lived `shutdown` (each race that `work` wins
// gives its slot on `shutdown` up, and every few give-ups a prune takes them off the
// stack), while a third thread settles `shutdown` at a varying point. The observers that
// still wait on `shutdown` fire once each, in registration order, on the settling thread
// (a settle that meets a prune waits for the nodes to come back and fires them itself);
// every race settles with an input's outcome; no race is kept once everything settled (a
// slot dropped twice, or never, would crash under ASan or leak here).
//
// The same for children and followers cancelled one by one: two threads make children of
// a long-lived parent (with and without an error side, on `.immediate`, `.default` and a
// queue) and promises that follow another long-lived promise, cancelling each at once
// (each cancel is a give-up, and prunes run), while a third thread fulfils or cancels
// the parent at a varying point. A handler runs at most once, and a child ends fulfilled
// only after its handler ran; an error side runs once when the parent ends cancelled,
// never when it is fulfilled; nothing is kept once everything settled. And for children
// the test settles early itself, which leave the pending parent after linking up: a
// cancel of the root still reaches the descendants below them.
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

    func testCancelledChildrenLeaveAParentWhileItSettles() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let queue = DispatchQueue(label: "PruneStressTests.children")
        let childrenPerSeat = 24
        var parentCancelledRounds = 0
        var straddlingRounds = 0  // children made both before and after the parent settled

        runStressRounds("prunes: cancelled children leave a parent while it settles", invariants: [
            "every child settles; one the test did not cancel takes its handler's outcome",
            "a handler runs at most once, and a child ends fulfilled only after its handler ran",
            "an error side runs once when the parent ends cancelled, never when it is fulfilled",
            "no child, follower or captured value is kept once everything settled",
        ], details: {
            "rounds where the parent was cancelled \(parentCancelledRounds), with children made both before and after its settle \(straddlingRounds)"
        }) { checker in
            let round = checker.round
            let parent = Promise<Int>()
            let followed = Promise<Int>()
            let captures = Locked(0)  // captured values alive
            let children = Locked<[MadeChild]>([])
            let weaks = Locked<[WeakPromiseRef]>([])
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 2 {
                    spin(random.below(3_000))
                    if round.isMultiple(of: 3) { parent.cancel() } else { parent.fulfill(1) }
                    return
                }
                var mine: [MadeChild] = []
                var made: [WeakPromiseRef] = []
                for index in 0..<childrenPerSeat {
                    let ran = Locked(0)
                    let captured = CountedCapture(captures)
                    let context: any ExecutionContext = [.immediate, .default, queue][index % 3]
                    let errorSide = index % 4 == 3
                    let madeBeforeSettle = parent.isPending
                    let child = errorSide
                        ? parent.recover(on: context) { _ in ran.withLock { $0 += 1 }; return captured.value }
                        : parent.then(on: context) { value in ran.withLock { $0 += 1 }; return value + captured.value }
                    let cancelled = random.below(2) == 0
                    if cancelled { child.cancel() }
                    mine.append(MadeChild(promise: child, ran: ran, errorSide: errorSide,
                                          cancelledByTest: cancelled, madeBeforeSettle: madeBeforeSettle))
                    let follower = index.isMultiple(of: 2) ? Promise<Int>() : parent.then(on: .immediate) { $0 }
                    follower.resolve(with: followed)
                    follower.cancel()
                    made.append(WeakPromiseRef(child))
                    made.append(WeakPromiseRef(follower))
                }
                children.withLock { $0.append(contentsOf: mine) }
                weaks.withLock { $0.append(contentsOf: made) }
            }
            checker.check(finished, "round hung")
            let parentCancelled = parent.isCancelled
            if parentCancelled { parentCancelledRounds += 1 }
            do {  // the children held here go at the end of the block, before the last checks
                let made = children.withLock { $0 }
                if made.contains(where: \.madeBeforeSettle) && made.contains(where: { !$0.madeBeforeSettle }) {
                    straddlingRounds += 1
                }
                queue.sync {}
                for child in made {
                    _ = try? child.promise.wait(timeout: .seconds(10))
                    // A child taken off its parent by mistake would stay pending for ever.
                    checker.check(!child.promise.isPending, "a child is still pending after its parent settled")
                    if child.errorSide && parentCancelled {
                        // The clean-up may still be on its way to `.default` after the child settled.
                        checker.check(becomesTrue { child.ran.withLock { $0 } == 1 }, "an error side never ran on the parent's cancel")
                    }
                    let runs = child.ran.withLock { $0 }
                    checker.check(runs <= 1, "a handler ran \(runs) times")
                    if child.errorSide && !parentCancelled { checker.check(runs == 0, "an error side ran on a fulfilled parent") }
                    if !child.errorSide && child.promise.isFulfilled { checker.check(runs == 1, "a child was fulfilled without its handler") }
                    if !child.cancelledByTest && !parentCancelled {
                        checker.check(child.promise.isFulfilled, "a child nobody cancelled ended \(child.promise.state)")
                        if !child.errorSide { checker.check(runs == 1, "the handler of a child nobody cancelled ran \(runs) times") }
                    }
                }
            }
            children.withLock { $0.removeAll() }
            followed.fulfill(2)
            queue.sync {}
            // Work sent to `.default` may still be letting go of its child.
            checker.check(becomesTrue { weaks.withLock { $0.allSatisfy { $0.promise == nil } } },
                          "a cancelled child or follower is still kept")
            checker.check(becomesTrue { captures.withLock { $0 } == 0 }, "a captured value is still kept")
            return true
        }
    }
}

extension PruneStressTests {
    /// Children settled early by the test (fulfilled, rejected, or through a promise they
    /// follow) leave a pending parent, linking themselves up first, while a third thread
    /// fulfils or cancels the parent's root at a varying point; below some of them, a
    /// descendant waits on a queue held suspended until the round's end. Whoever wins
    /// each race, a cancel of the root reaches every descendant (through the registries,
    /// since a child that left is on no list), and nothing is kept.
    func testChildrenSettledEarlyLeaveAParentWhileItsRootSettles() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let contextQueue = DispatchQueue(label: "PruneStressTests.settled-early")
        let childrenPerSeat = 24
        var cancelledRounds = 0
        var earlyRounds = 0  // rounds where the test settled a child while the parent was pending

        runStressRounds("prunes: children settled early leave a parent while its root settles", invariants: [
            "every child settles; the handler of one the test settled before its parent never runs",
            "a handler runs at most once",
            "when the root was cancelled, every descendant is cancelled before its queue runs, and its handler never runs",
            "when the root was fulfilled, every descendant ends fulfilled",
            "no child, descendant or captured value is kept once everything settled",
        ], details: {
            "rounds with the root cancelled \(cancelledRounds), with a child settled by the test while its parent was pending \(earlyRounds)"
        }) { checker in
            let round = checker.round
            let root = Promise<Int>()
            // A derived parent (settles keep it: `publishKeepingParent`), a root one
            // (`leaveParentIfPending`), or a root that follows `root` with `resolve(with:)`
            // (it adopts the root's cancel, and passes it on: `passOnClaimedCancel`).
            let parent: Promise<Int>
            switch round % 3 {
            case 0: parent = root.then(on: .immediate) { $0 }
            case 1: parent = root
            default:
                parent = Promise<Int>()
                parent.resolve(with: root)
            }
            let cancelRound = (round / 3).isMultiple(of: 3)
            let descendantRuns = Locked(0)
            let descendantQueue = DispatchQueue(label: "PruneStressTests.descendants")
            descendantQueue.suspend()
            let captures = Locked(0)
            let made = Locked<[EarlyChild]>([])
            let weaks = Locked<[WeakPromiseRef]>([])
            let settledEarly = Locked(false)
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 2 {
                    spin(random.below(3_000))
                    if cancelRound { root.cancel() } else { root.fulfill(1) }
                    return
                }
                var mine: [EarlyChild] = []
                var kept: [WeakPromiseRef] = []
                for index in 0..<childrenPerSeat {
                    let ran = Locked(0)
                    let captured = CountedCapture(captures)
                    let context: any ExecutionContext = [.immediate, .default, contextQueue][index % 3]
                    let child = parent.then(on: context) { value in ran.withLock { $0 += 1 }; return value + captured.value }
                    let settledByTest: Bool
                    switch random.below(3) {
                    case 0: settledByTest = child.fulfill(-index)
                    case 1: settledByTest = child.reject(StressError(id: index))
                    default:
                        let followed = Promise<Int>()
                        child.resolve(with: followed)
                        followed.fulfill(-index)
                        settledByTest = (try? child.wait(timeout: .zero)) == -index
                    }
                    // Settled while the parent was still pending after it: its handler can
                    // never run (the parent's fire finds it claimed).
                    let early = settledByTest && parent.isPending
                    if early { settledEarly.withLock { $0 = true } }
                    let descendant: Promise<Int>? = random.below(2) == 0
                        ? child.then(on: descendantQueue) { value in descendantRuns.withLock { $0 += 1 }; return value }
                        : nil
                    mine.append(EarlyChild(promise: child, ran: ran, settledBeforeParent: early, descendant: descendant))
                    kept.append(WeakPromiseRef(child))
                    if let descendant { kept.append(WeakPromiseRef(descendant)) }
                }
                made.withLock { $0.append(contentsOf: mine) }
                weaks.withLock { $0.append(contentsOf: kept) }
            }
            checker.check(finished, "round hung")
            let rootCancelled = root.isCancelled
            if rootCancelled { cancelledRounds += 1 }
            if settledEarly.withLock({ $0 }) { earlyRounds += 1 }
            if rootCancelled {
                // A cancel does not wait for the context: before the queue runs anything,
                // every descendant is cancelled (a missed one would take its handler's
                // outcome, or its own look-up's cancel, only once the queue runs).
                for child in made.withLock({ $0 }) {
                    guard let descendant = child.descendant else { continue }
                    checker.check(descendant.isCancelled, "a descendant missed the root's cancel: \(descendant.state)")
                }
            }
            descendantQueue.resume()
            do {  // the promises held here go at the end of the block, before the last checks
                let children = made.withLock { $0 }
                contextQueue.sync {}
                for child in children {
                    _ = try? child.promise.wait(timeout: .seconds(10))
                    checker.check(!child.promise.isPending, "a child is still pending after its parent settled")
                    let runs = child.ran.withLock { $0 }
                    checker.check(runs <= 1, "a handler ran \(runs) times")
                    if child.settledBeforeParent {
                        checker.check(runs == 0, "the handler of a child settled before its parent ran")
                    }
                    guard let descendant = child.descendant else { continue }
                    _ = try? descendant.wait(timeout: .seconds(10))
                    if !rootCancelled && child.promise.isFulfilled {
                        checker.check(descendant.isFulfilled, "a descendant of a fulfilled child ended \(descendant.state)")
                    }
                }
            }
            made.withLock { $0.removeAll() }
            contextQueue.sync {}
            descendantQueue.sync {}
            if rootCancelled {
                checker.check(descendantQueue.sync { descendantRuns.withLock { $0 } } == 0, "a descendant's handler ran after the root's cancel")
            }
            checker.check(becomesTrue { weaks.withLock { $0.allSatisfy { $0.promise == nil } } },
                          "a child or descendant is still kept")
            checker.check(becomesTrue { captures.withLock { $0 } == 0 }, "a captured value is still kept")
            return true
        }
    }
}

/// A child settled early by the test, its handler's run count, and its descendant.
private struct EarlyChild {
    let promise: Promise<Int>
    let ran: Locked<Int>
    let settledBeforeParent: Bool
    let descendant: Promise<Int>?
}

/// A child the test made, and what it needs to check it.
private struct MadeChild {
    let promise: Promise<Int>
    let ran: Locked<Int>
    let errorSide: Bool
    let cancelledByTest: Bool
    let madeBeforeSettle: Bool
}

private final class WeakPromiseRef: @unchecked Sendable {
    weak var promise: AnyPromise?
    init(_ promise: AnyPromise) { self.promise = promise }
}

/// A value a handler captures, counted alive in `count`.
private final class CountedCapture: @unchecked Sendable {
    let value = 1
    private let count: Locked<Int>
    init(_ count: Locked<Int>) { self.count = count; count.withLock { $0 += 1 } }
    deinit { count.withLock { $0 -= 1 } }
}

/// Polls `condition` until it holds (true) or ten seconds passed (false).
private func becomesTrue(_ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + .seconds(10)
    while !condition() {
        if ContinuousClock.now > deadline { return false }
        usleep(50)
    }
    return true
}
