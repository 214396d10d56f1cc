// Broken promises under fire: a pending root that every owner drops, while three threads
// hold it, register every kind of dependent on it (children on `.immediate` and on a
// queue, `recover`, `whenComplete`, `onCancel`, an aggregate, a Task awaiting a child,
// a thread blocked in `wait()` on a child) and let go, each at its own moment. Whichever
// thread drops the last reference runs the root's teardown. Every dependent must get
// `PromiseError.brokenPromise` exactly once (a `recover` turns it into its value), no
// `onCancel` may run, and everything must be freed.
import Dispatch
import Foundation
import Promise
import XCTest

/// What one round's dependents saw, by kind.
private struct Outcomes {
    var children: [Final<Int>] = []
    var completions: [Seen] = []
    var awaited: [Seen] = []
    var waited: [Seen] = []
    var cancelHandlersRun = 0
}

final class BrokenPromiseStressTests: XCTestCase {
    func testDependentsRegisteredFromManyThreadsAllBreakWhenTheLastOwnerLetsGo() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let queue = DispatchQueue(label: "BrokenPromiseStressTests.queue")
        var dependents = 0

        runStressRounds("dependents racing the death of a pending root", invariants: [
            "every child, completion, awaiter and wait() of a dropped pending root gets brokenPromise, once",
            "a recover turns it into its value; onCancel handlers never run",
            "the root, its children and the aggregate are freed",
        ], details: {
            "\(dependents) dependents broken"
        }) { checker in
            let round = checker.round
            let outcomes = Locked(Outcomes())
            let kept = Locked<[Promise<Int>]>([])
            let weak = Locked<[() -> AnyPromise?]>([])
            let tasks = DispatchGroup()
            let registered = Locked((completions: 0, awaiters: 0))
            final class Holder: @unchecked Sendable { var root: Promise<Int>? }
            let holders = (0..<3).map { _ in Holder() }
            do {
                let root = Promise<Int>()
                holders.forEach { $0.root = root }
                weak.withLock { refs in
                    weak let reference = root
                    refs.append { reference }
                }
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                let root = holders[seat].root.unsafelyUnwrapped
                crew.barrier.arriveAndWait()
                var mine: [Promise<Int>] = []
                for _ in 0..<(2 + random.below(4)) {
                    switch random.below(7) {
                    case 0: mine.append(root.then(on: .immediate) { $0 + 1 })
                    case 1: mine.append(root.then(on: queue) { $0 + 1 })
                    case 2: mine.append(root.recover(on: .immediate) { _ in -1 })
                    case 3:
                        registered.withLock { $0.completions += 1 }
                        root.whenComplete(on: random.below(2) == 0 ? .immediate : queue) { result in
                            outcomes.withLock { $0.completions.append(Seen(result)) }
                        }
                    case 4:
                        root.onCancel { outcomes.withLock { $0.cancelHandlersRun += 1 } }
                    case 5:
                        mine.append(Promise.all([root]).map(on: .immediate) { $0.count })
                    default:
                        let child = root.then(on: .immediate) { $0 }
                        registered.withLock { $0.awaiters += 1 }
                        tasks.enter()
                        Task {
                            let result = await child.result
                            outcomes.withLock { $0.awaited.append(Seen(result)) }
                            tasks.leave()
                        }
                    }
                }
                let waitOn = mine.first
                kept.withLock { $0.append(contentsOf: mine) }
                weak.withLock { refs in
                    for child in mine {
                        weak let reference = child
                        refs.append { reference }
                    }
                }
                for _ in 0..<random.below(200) { _ = random.next() }
                // Drop this seat's references; the last one runs the root's teardown.
                holders[seat].root = nil
                _ = consume root
                if let waitOn {
                    let result = Result { try waitOn.wait(timeout: .seconds(20)) }
                    outcomes.withLock { $0.waited.append(Seen(result)) }
                }
            }
            checker.check(finished, "round hung")
            checker.check(tasks.wait(timeout: .now() + 20) == .success, "an awaiting Task never resumed")
            queue.sync {}
            // Taken out of `kept`, read, and let go before the check that all are freed.
            let finals: [Final<Int>] = {
                let children = kept.withLock { kept -> [Promise<Int>] in
                    defer { kept = [] }
                    return kept
                }
                for child in children { _ = try? child.wait(timeout: .seconds(20)) }
                return children.map { Final($0, { $0 }) }
            }()
            let seen = outcomes.withLock { outcomes -> Outcomes in
                outcomes.children = finals
                return outcomes
            }
            checker.check(seen.completions.count == registered.withLock({ $0.completions }),
                          "\(seen.completions.count) completions ran for \(registered.withLock { $0.completions }) registered")
            checker.check(seen.awaited.count == registered.withLock({ $0.awaiters }),
                          "\(seen.awaited.count) awaiters resumed of \(registered.withLock { $0.awaiters })")
            for final in seen.children {
                checker.check(!final.isPending, "a child stayed pending")
                checker.check(final == .rejected(.brokenPromise) || final == .fulfilled(-1),
                              "a child ended \(final)")
            }
            for completion in seen.completions + seen.awaited {
                checker.check(completion == .error(.brokenPromise), "a dependent saw \(completion)")
            }
            for waited in seen.waited {
                // The child waited on may be a `recover`, which turns the error into -1.
                checker.check(waited == .error(.brokenPromise) || waited == .value(-1), "wait() returned \(waited)")
            }
            checker.check(seen.cancelHandlersRun == 0, "an onCancel handler ran for a dropped promise")
            dependents += seen.children.count + seen.completions.count + seen.awaited.count + seen.waited.count
            let deadline = Date(timeIntervalSinceNow: 5)
            func alive() -> Int { weak.withLock { $0.filter { $0() != nil }.count } }
            while alive() != 0 && Date() < deadline { usleep(100) }
            checker.check(alive() == 0, "\(alive()) promise(s) of the round still alive: "
                          + weak.withLock { $0.compactMap { $0() }.map { "\(type(of: $0)) \($0.state)" } }.joined(separator: ", "))
            return true
        }
    }
}
