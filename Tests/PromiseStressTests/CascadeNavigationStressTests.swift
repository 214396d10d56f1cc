// Navigation into a running cascade: a chain that settles inline keeps each step it went
// through until the cascade ends, for the path a running handler's child looks up through.
// Here other threads walk up the chain with `parent` and `root`, read every ancestor they
// are given, and cancel the root, while the cascade runs. Every round checks that each
// value read is the one its step made (a step's value must stay readable while anything
// can reach the step: the cascade frees a kept step's value early only when nothing else
// can, and `parent` then answers nil; this races that check against the walkers'
// try-retains, and under ASan a read of a value let go of is a use after free), that the
// leaf ends with the value the whole chain made or cancelled, and that every value is
// freed once the round's promises are dropped.
import Foundation
import Promise
import Synchronization
import XCTest

/// A value whose reads check that it is still alive, and whose life is counted.
private final class Token: Sendable {
    static let alive = Atomic<Int>(0)
    let depth: Int
    private let check: Int

    init(depth: Int) {
        self.depth = depth
        check = depth &* 31 &+ 7
        Token.alive.add(1, ordering: .relaxed)
    }

    /// Whether the fields still hold what `init` wrote (a freed token's memory would not).
    var isIntact: Bool { check == depth &* 31 &+ 7 }

    deinit { Token.alive.subtract(1, ordering: .relaxed) }
}

final class CascadeNavigationStressTests: XCTestCase {
    /// Seat 0 fulfils the root of a 48-step `.immediate` chain and lets go of it, so only
    /// the cascade keeps the steps above the leaf; seats 1 and 2 walk up from the leaf with
    /// `parent`, read each fulfilled ancestor's value, and take `leaf.root`; in one round
    /// of three, seat 2 cancels the root it found, which must cancel the steps still to run.
    func testNavigationIntoARunningCascade() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let depth = 48
        let reads = Atomic<Int>(0), midCascade = Atomic<Int>(0), wrong = Atomic<Int>(0)
        var cancelledRounds = 0, fulfilledRounds = 0

        runStressRounds("navigation into a running cascade", invariants: [
            "every value read through parent or root is intact and the one its step made",
            "the leaf ends fulfilled with the chain's value, or cancelled by a cancel of its root",
            "every value is freed once the round's promises are dropped",
        ], details: {
            "\(reads.load(ordering: .relaxed)) values read, \(midCascade.load(ordering: .relaxed)) of a middle step "
                + "while the leaf was pending; rounds fulfilled \(fulfilledRounds), cancelled \(cancelledRounds)"
        }) { checker in
            let round = checker.round
            let rootHolder = Locked<Promise<Token>?>(Promise<Token>())
            let leaf: Promise<Token>
            do {
                var step = rootHolder.withLock { $0! }
                for _ in 0..<depth {
                    step = step.then(on: .immediate) { Token(depth: $0.depth + 1) }
                }
                leaf = step
            }
            let cancels = round % 3 == 2
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    for _ in 0..<random.below(200) { _ = reads.load(ordering: .relaxed) }
                    let root = rootHolder.withLock { root in
                        defer { root = nil }
                        return root!
                    }
                    root.fulfill(Token(depth: 0))
                    return
                }
                for attempt in 0..<200 {
                    var node: AnyPromise = leaf
                    var level = depth
                    while let up = node.parent {
                        level -= 1
                        node = up
                        guard up.isFulfilled, let promise = up as? Promise<Token>,
                              let token = try? promise.wait() else { continue }
                        reads.add(1, ordering: .relaxed)
                        if level > 0 && leaf.isPending { midCascade.add(1, ordering: .relaxed) }
                        if !token.isIntact || token.depth != level { wrong.add(1, ordering: .relaxed) }
                    }
                    let root = leaf.root
                    if root.isFulfilled, let token = try? (root as? Promise<Token>)?.wait() {
                        reads.add(1, ordering: .relaxed)
                        if !token.isIntact || token.depth > depth { wrong.add(1, ordering: .relaxed) }
                    }
                    if seat == 2, cancels, attempt == random.below(4) { root.cancel() }
                    if !leaf.isPending { break }
                }
            }
            checker.check(finished, "round hung")
            checker.check(wrong.load(ordering: .relaxed) == 0, "a value read was not the one its step made")
            switch leaf.state {
            case .fulfilled:
                fulfilledRounds += 1
                let token = try? leaf.wait()
                checker.check(token?.depth == depth && token?.isIntact == true, "the leaf's value is wrong")
            case .cancelled:
                cancelledRounds += 1
                checker.check(cancels, "the leaf was cancelled in a round without a cancel")
            default:
                checker.fail("the leaf ended \(leaf.state)")
            }
            _ = consume leaf
            checker.check(Token.alive.load(ordering: .relaxed) == 0,
                          "\(Token.alive.load(ordering: .relaxed)) values outlived their promises")
            return finished
        }
    }

    /// A user's own references to a step that nothing else holds, turned from weak to
    /// strong and back (a cache read on another thread), and from unowned to strong and
    /// back, while the step's cascade runs: the cascade may free a kept step's value only
    /// when one snapshot of the counts shows no such reference, so every read through them
    /// finds the value whole (under ASan, a read of a freed one is a use after free).
    func testUserReferencesTurnedStrongDuringACascade() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let reads = Atomic<Int>(0), wrong = Atomic<Int>(0)

        runStressRounds("user references turned strong during a cascade", invariants: [
            "every value read through a weak or unowned reference the user turned strong is intact",
            "the chain's leaf ends with the value its steps made",
            "every value is freed once the round's promises are dropped",
        ], details: { "\(reads.load(ordering: .relaxed)) values read" }) { checker in
            let round = checker.round
            let rootHolder = Locked<Promise<Token>?>(Promise<Token>())
            let stepHolder = Locked<Promise<Token>?>(nil)
            let leaf: Promise<Token>
            do {
                let step = rootHolder.withLock { $0! }.then(on: .immediate) { Token(depth: $0.depth + 1) }
                leaf = step.then(on: .immediate) { Token(depth: $0.depth + 1) }
                    .then(on: .immediate) { Token(depth: $0.depth + 1) }
                stepHolder.withLock { $0 = step }
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                if seat == 0 {
                    crew.barrier.arriveAndWait()
                    for _ in 0..<random.below(300) { _ = reads.load(ordering: .relaxed) }
                    let root = rootHolder.withLock { root in
                        defer { root = nil }
                        return root!
                    }
                    root.fulfill(Token(depth: 0))
                    return
                }
                // Seats 1 and 2 share the step: each takes a strong reference, then the
                // holder lets go of its own, so only the seats' references remain.
                var strong = stepHolder.withLock { $0 }
                crew.barrier.arriveAndWait()
                if seat == 1 { stepHolder.withLock { $0 = nil } }
                func read(_ step: Promise<Token>) {
                    guard step.isFulfilled, let token = try? step.wait() else { return }
                    reads.add(1, ordering: .relaxed)
                    if !token.isIntact || token.depth != 1 { wrong.add(1, ordering: .relaxed) }
                }
                for _ in 0..<200 {
                    if seat == 1 {
                        weak var weakStep = strong
                        strong = nil
                        strong = weakStep
                        weakStep = nil
                    } else if let held = strong {
                        unowned let unownedStep = held
                        strong = nil
                        strong = unownedStep
                    }
                    if let held = strong { read(held) }
                    if !leaf.isPending { break }
                }
                strong = nil
            }
            checker.check(finished, "round hung")
            checker.check(wrong.load(ordering: .relaxed) == 0, "a value read through a user's reference was not whole")
            do {
                let token = try? leaf.wait()
                checker.check(token?.depth == 3 && token?.isIntact == true, "the leaf's value is wrong: \(leaf)")
            }
            _ = consume leaf
            checker.check(Token.alive.load(ordering: .relaxed) == 0,
                          "\(Token.alive.load(ordering: .relaxed)) values outlived their promises")
            return finished
        }
    }
}
