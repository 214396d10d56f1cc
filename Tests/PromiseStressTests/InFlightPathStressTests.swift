// The path of a descendant in flight, under fire: a root, a chain of one to four
// `.immediate` steps that nobody holds once the round starts, and a leaf that goes in
// flight when the chain settles (a handler on a held queue, or a child following a
// promise nobody settles). Three threads at once: one fulfils the root, one cancels it,
// one drops the last outside reference to a step of the chain. Whatever the interleaving:
//   - the leaf ends cancelled with the canceller's reason (its handler cannot have run
//     before the cancel, and the settled steps between it and the root stay alive while
//     it is in flight, so the cancel reaches it through them);
//   - a follower's followed promise is cancelled with it (the work it owns);
//   - once the leaf is no longer in flight and dropped, every promise of the round is freed.
// And a root cancelled while its queued child's handler returns the promise the child is to
// follow: that promise is the child's work, and the cancel reaches it however the two
// threads interleave (a cancel that took the child's claim in the instant before its link
// was recorded once missed it).
import Dispatch
import Foundation
import Promise
import XCTest

final class InFlightPathStressTests: XCTestCase {
    private struct Reason: Error, Equatable { let round: Int }

    func testACancelReachesTheLeafThroughStepsNobodyHoldsWhileTheChainSettles() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var followers = 0, queued = 0

        runStressRounds("cancel racing the settle of a chain whose steps nobody holds", invariants: [
            "the leaf in flight below the unheld steps ends cancelled with the canceller's reason",
            "a following leaf's followed promise is cancelled with it",
            "every promise of the round is freed once the leaf is dropped",
        ], details: {
            "\(queued) queued leaves, \(followers) following leaves"
        }) { checker in
            let round = checker.round
            var random = StressRandom(round: round, seat: 99)
            let held = DispatchQueue(label: "InFlightPathStressTests.held")
            held.suspend()
            let weak = Locked<[() -> AnyPromise?]>([])
            func track(_ promise: AnyPromise) {
                weak.withLock { refs in
                    weak let reference = promise
                    refs.append { reference }
                }
            }
            final class Holder: @unchecked Sendable {
                var root: Promise<Int>?
                var step: Promise<Int>?
            }
            let holder = Holder()
            let work = Promise<Int>()
            let handlerRan = Locked(false)
            let follows = random.below(2) == 0
            var leaf: Promise<Int>? = {
                let root = Promise<Int>()
                track(root)
                holder.root = root
                var step = root.map(on: .immediate) { $0 + 1 }
                track(step)
                let steps = 1 + random.below(4)
                let dropped = random.below(steps)
                for index in 1..<steps {
                    if index == dropped { holder.step = step }  // seat 2 lets it go
                    step = step.map(on: .immediate) { $0 + 1 }
                    track(step)
                }
                let leaf = follows
                    ? step.flatMap(on: .immediate) { _ in handlerRan.withLock { $0 = true }; return work }
                    : step.then(on: held) { $0 }
                track(leaf)
                return leaf
            }()
            if follows { followers += 1 } else { queued += 1 }

            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                spin(random.below(300))
                switch seat {
                case 0: holder.root.unsafelyUnwrapped.fulfill(0)
                case 1: holder.root.unsafelyUnwrapped.cancel(reason: Reason(round: round))
                default: holder.step = nil
                }
            }
            checker.check(finished, "round hung")
            holder.root = nil
            let final = leaf.map { Final($0, { $0 }) }
            checker.check(leaf?.isCancelled == true, "the leaf ended \(String(describing: final))")
            if let leaf, case .failure(let error) = Result(catching: { try leaf.wait(timeout: .seconds(20)) }) {
                checker.check(error as? Reason == Reason(round: round), "the leaf was cancelled with \(error)")
            }
            // The handler never ran if the cancel came while the root was pending; if it
            // did, the leaf followed `work`, which the cancel must then reach.
            if follows, handlerRan.withLock({ $0 }) {
                checker.check(work.isCancelled, "the followed promise ended \(work.state)")
            }
            held.resume()
            held.sync {}
            leaf = nil
            let deadline = Date(timeIntervalSinceNow: 5)
            func alive() -> Int { weak.withLock { $0.filter { $0() != nil }.count } }
            while alive() != 0 && Date() < deadline { usleep(100) }
            checker.check(alive() == 0, "\(alive()) promise(s) of the round still alive")
            return true
        }
    }

    func testARootsCancelReachesThePromiseAQueuedHandlerReturned() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        let queue = DispatchQueue(label: "InFlightPathStressTests.returning")
        var handlerRuns = 0

        runStressRounds("a root's cancel racing its fulfil while a queued handler returns the work to follow", invariants: [
            "the child ends cancelled with the canceller's reason",
            "if its handler ran, the promise it returned ends cancelled with that reason too",
        ], details: { "the handler ran in \(handlerRuns) rounds" }) { checker in
            let round = checker.round
            let root = Promise<Int>()
            let work = Promise<Int>()
            let handlerRan = Locked(false)
            let context: any ExecutionContext = round.isMultiple(of: 2) ? queue : .default
            let child = root.then(on: context) { _ -> Promise<Int> in
                handlerRan.withLock { $0 = true }
                return work
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    root.fulfill(0)
                } else {
                    // Short waits meet the fulfil; long ones, the handler and its lock-in.
                    spin(random.below(round.isMultiple(of: 3) ? 400 : 200_000))
                    root.cancel(reason: Reason(round: round))
                }
            }
            checker.check(finished, "round hung")
            let childError = Result { try child.wait(timeout: .seconds(20)) }
            checker.check(child.isCancelled, "the child ended \(child.state)")
            if case .failure(let error) = childError {
                checker.check(error as? Reason == Reason(round: round), "the child was cancelled with \(error)")
            }
            if handlerRan.withLock({ $0 }) {
                handlerRuns += 1
                let workError = Result { try work.wait(timeout: .seconds(20)) }
                checker.check(work.isCancelled, "the returned promise ended \(work.state)")
                if case .failure(let error) = workError {
                    checker.check(error as? Reason == Reason(round: round), "the returned promise was cancelled with \(error)")
                }
            }
            return finished
        }
        queue.sync {}
    }
}
