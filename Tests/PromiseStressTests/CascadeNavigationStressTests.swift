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

/// A weak cell for a token (not for a promise: a weak reference would give the promise a
/// side table, which rules its early freeing out).
private final class WeakToken: @unchecked Sendable {
    weak var token: Token?
}

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

/// Seat 0's part of a round: after a pause of `spins`, takes the round's root out of
/// `holder` and fulfils it with `value`, letting go of it, so that only the cascade keeps
/// the steps above the leaf.
private func settleAndLetGo<Value>(_ holder: Locked<Promise<Value>?>, with value: Value, after spins: Int) {
    spin(spins)
    let root = holder.withLock { root in
        defer { root = nil }
        return root!
    }
    root.fulfill(value)
}

/// One step of a chain, of one of three kinds the cascade frees early in different ways:
/// 0 a `then`; 1 a `flatMap` whose handler returns a settled promise; 2 a `flatMap` whose
/// handler returns a promise still pending, which settles later in the same cascade.
private func chainStep(after parent: Promise<Token>, kind: Int,
                       _ make: @escaping @Sendable (Token) -> Token) -> Promise<Token> {
    switch kind % 3 {
    case 0:
        return parent.then(on: .immediate, make)
    case 1:
        return parent.flatMap(on: .immediate) { Promise(value: make($0)) }
    default:
        return parent.flatMap(on: .immediate) { token in
            let source = Promise<Token>()
            let returned = source.then(on: .immediate) { $0 }
            source.fulfill(make(token))
            return returned
        }
    }
}

final class CascadeNavigationStressTests: XCTestCase {
    /// Seat 0 fulfils the root of a 48-step `.immediate` chain (of `then` and `flatMap`
    /// steps, `chainStep`) and lets go of it, so only
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
                for level in 0..<depth {
                    step = chainStep(after: step, kind: level + round) { Token(depth: $0.depth + 1) }
                }
                leaf = step
            }
            let cancels = round % 3 == 2
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    settleAndLetGo(rootHolder, with: Token(depth: 0), after: random.below(200))
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

    /// The same race for errors: every other step of the chain throws an error that
    /// carries a token (or returns a promise rejected with one) and the next recovers, so the cascade frees rejected steps' errors
    /// early too; seats 1 and 2 walk up from the leaf, describe every ancestor and read
    /// each rejected one's error, which must be whole and the one its step threw.
    func testNavigationIntoARunningCascadeOfRejectedSteps() {
        struct Thrown: Error { let token: Token }
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let depth = 48
        let reads = Atomic<Int>(0), wrong = Atomic<Int>(0)

        runStressRounds("navigation into a running cascade of rejected steps", invariants: [
            "every error read through parent is intact and the one its step threw",
            "the leaf ends fulfilled with the chain's value",
            "every error is freed once the round's promises are dropped",
        ], details: {
            "\(reads.load(ordering: .relaxed)) errors read"
        }) { checker in
            let round = checker.round
            let rootHolder = Locked<Promise<Int>?>(Promise<Int>())
            let leaf: Promise<Int>
            do {
                var step = rootHolder.withLock { $0! }
                for level in stride(from: 1, to: depth, by: 2) {
                    let failed: Promise<Int> = (level / 2 + round) % 2 == 0
                        ? step.then(on: .immediate) { _ -> Int in throw Thrown(token: Token(depth: level)) }
                        : step.flatMap(on: .immediate) { _ in Promise(error: Thrown(token: Token(depth: level))) }
                    step = failed.recover(on: .immediate) { ($0 as? Thrown)?.token.depth ?? -1 }
                }
                leaf = step
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    settleAndLetGo(rootHolder, with: 0, after: random.below(200))
                    return
                }
                for _ in 0..<200 {
                    var node: AnyPromise = leaf
                    var below = depth  // the steps throw at odd depths, fewer going up
                    while let up = node.parent {
                        node = up
                        _ = up.debugDescription
                        guard up.isRejected, let promise = up as? Promise<Int> else { continue }
                        do {
                            _ = try promise.wait()
                            wrong.add(1, ordering: .relaxed)
                        } catch let thrown as Thrown {
                            reads.add(1, ordering: .relaxed)
                            let token = thrown.token
                            if !token.isIntact || token.depth % 2 != 1 || token.depth >= below {
                                wrong.add(1, ordering: .relaxed)
                            }
                            below = token.depth
                        } catch {
                            wrong.add(1, ordering: .relaxed)
                        }
                    }
                    if !leaf.isPending { break }
                }
            }
            checker.check(finished, "round hung")
            checker.check(wrong.load(ordering: .relaxed) == 0, "an error read was not the one its step threw")
            checker.check((try? leaf.wait()) == depth - 1, "the leaf ended \(leaf.state)")
            _ = consume leaf
            checker.check(Token.alive.load(ordering: .relaxed) == 0,
                          "\(Token.alive.load(ordering: .relaxed)) errors outlived their promises")
            return finished
        }
    }

    /// Readers that reach the steps of a running cascade through `parent` and keep them
    /// only through references of their own, `unowned` (seat 1) or `weak` (seat 2), made
    /// from the strong one `parent` gave, which they drop before reading again: the
    /// cascade frees a kept step's value early only when one snapshot of its counts shows
    /// no such reference, so every read finds the value whole (under ASan, a read of a
    /// freed one is a use after free). The chain's last handler holds the cascade open
    /// until both readers are done, so the steps they reach stay alive; it counts the
    /// steps whose value was freed by then (the retirements the race is against).
    func testReferencesMadeFromParentDuringACascade() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let depth = 24
        let freedEarly = Atomic<Int>(0), reads = Atomic<Int>(0), wrong = Atomic<Int>(0)

        runStressRounds("references made from parent during a cascade", invariants: [
            "every value read through an unowned or weak reference made from parent is whole and its step's",
            "the chain's leaf ends with the value its steps made",
        ], details: {
            "\(reads.load(ordering: .relaxed)) values read; \(freedEarly.load(ordering: .relaxed)) step values freed "
                + "early while the readers ran"
        }) { checker in
            let round = checker.round
            let made = (0...depth).map { _ in WeakToken() }
            let readersDone = Atomic<Int>(0)
            let rootHolder = Locked<Promise<Token>?>(Promise<Token>())
            let leaf: Promise<Token>
            do {
                var step = rootHolder.withLock { $0! }
                for level in 1...depth {
                    step = chainStep(after: step, kind: level + round) { parent -> Token in
                        let token = Token(depth: parent.depth + 1)
                        made[level].token = token
                        if level == depth {
                            let deadline = Date(timeIntervalSinceNow: 20)
                            while readersDone.load(ordering: .acquiring) < 2 && Date() < deadline { sched_yield() }
                            for earlier in 1..<(depth - 2) where made[earlier].token == nil {
                                freedEarly.add(1, ordering: .relaxed)
                            }
                        }
                        return token
                    }
                }
                leaf = step
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    settleAndLetGo(rootHolder, with: Token(depth: 0), after: random.below(400))
                    return
                }
                defer { readersDone.add(1, ordering: .releasing) }
                func read(_ step: Promise<Token>, level: Int) {
                    guard step.isFulfilled, let token = try? step.wait() else { return }
                    reads.add(1, ordering: .relaxed)
                    if !token.isIntact || token.depth != level { wrong.add(1, ordering: .relaxed) }
                }
                for _ in 0..<(20 + random.below(40)) {
                    var node: AnyPromise = leaf
                    var level = depth
                    while let up = node.parent as? Promise<Token> {
                        level -= 1
                        if seat == 1 {
                            unowned let own = up
                            _ = consume up
                            for _ in 0..<random.below(20) { _ = reads.load(ordering: .relaxed) }
                            read(own, level: level)
                            node = own
                        } else {
                            weak var own = up
                            _ = consume up
                            for _ in 0..<random.below(20) { _ = reads.load(ordering: .relaxed) }
                            guard let again = own else { break }
                            own = nil
                            read(again, level: level)
                            node = again
                        }
                    }
                }
            }
            checker.check(finished, "round hung")
            checker.check(wrong.load(ordering: .relaxed) == 0, "a value read through a reference made from parent was not whole")
            do {
                let token = try? leaf.wait()
                checker.check(token?.depth == depth && token?.isIntact == true, "the leaf's value is wrong: \(leaf)")
            }
            return finished
        }
    }

    /// `flatMap` steps whose returned promises seat 1 settles while seat 0's cascade runs
    /// the chain: a step adopts in seat 0's cascade if its promise settled before its
    /// handler returned, else in seat 1's, which then frees early while seat 0's cascade
    /// ends and lets go of what it kept. Seat 2 walks up from the leaf reading every
    /// fulfilled ancestor, and holds every fourth step it finds until the round ends, whose
    /// value must then still be whole.
    func testNavigationIntoFlatMapStepsAdoptingOnTwoThreads() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let depth = 24
        let reads = Atomic<Int>(0), wrong = Atomic<Int>(0)

        runStressRounds("navigation into flatMap steps adopting on two threads", invariants: [
            "every value read through parent, or kept by a reader, is intact and the one its step made",
            "the leaf ends fulfilled with the chain's value",
            "every value is freed once the round's promises are dropped",
        ], details: {
            "\(reads.load(ordering: .relaxed)) values read"
        }) { checker in
            let round = checker.round
            let gates = (0..<depth).map { _ in Promise<Int>() }
            let rootHolder = Locked<Promise<Token>?>(Promise<Token>())
            let leaf: Promise<Token>
            do {
                var step = rootHolder.withLock { $0! }
                for level in 1...depth {
                    let gate = gates[level - 1]
                    step = step.flatMap(on: .immediate) { parent in
                        gate.then(on: .immediate) { _ in Token(depth: parent.depth + 1) }
                    }
                }
                leaf = step
            }
            let kept = Locked<[(promise: Promise<Token>, level: Int)]>([])
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                switch seat {
                case 0:
                    settleAndLetGo(rootHolder, with: Token(depth: 0), after: random.below(200))
                case 1:
                    for gate in gates {
                        spin(random.below(60))
                        gate.fulfill(0)
                    }
                default:
                    for attempt in 0..<200 {
                        var node: AnyPromise = leaf
                        var level = depth
                        while let up = node.parent {
                            level -= 1
                            node = up
                            guard up.isFulfilled, let promise = up as? Promise<Token>,
                                  let token = try? promise.wait() else { continue }
                            reads.add(1, ordering: .relaxed)
                            if !token.isIntact || token.depth != level { wrong.add(1, ordering: .relaxed) }
                            if attempt % 4 == 0 && level % 4 == 0 { kept.withLock { $0.append((promise, level)) } }
                        }
                        if !leaf.isPending { break }
                    }
                }
            }
            checker.check(finished, "round hung")
            kept.withLock { kept in
                for (promise, level) in kept {
                    let token = try? promise.wait()
                    if token?.isIntact != true || token?.depth != level { wrong.add(1, ordering: .relaxed) }
                }
                kept.removeAll()
            }
            checker.check(wrong.load(ordering: .relaxed) == 0, "a value read was not the one its step made")
            do {
                let token = try? leaf.wait()
                checker.check(token?.depth == depth && token?.isIntact == true, "the leaf ended \(leaf.state)")
            }
            _ = consume leaf
            checker.check(Token.alive.load(ordering: .relaxed) == 0,
                          "\(Token.alive.load(ordering: .relaxed)) values outlived their promises")
            return finished
        }
    }

    /// `root` taken on another thread while a cascade decides whether to free its steps'
    /// values: what it answers has no parent (a step it walked past was retired for good),
    /// and a cancel of it reaches a branch made on anything above the leaf it can reach.
    /// The chain's root is settled inside an outer handler that lets go of it, so it may
    /// be retired too.
    func testRootDuringARetirementIsTheTop() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        let depth = 8
        let withParent = Atomic<Int>(0), walks = Atomic<Int>(0)

        runStressRounds("root during a retirement", invariants: [
            "leaf.root has no parent: it is the topmost promise whose value is not freed",
        ], details: { "\(walks.load(ordering: .relaxed)) walks" }) { checker in
            let round = checker.round
            let outer = Promise<Int>()
            let innerHolder = Locked<Promise<Token>?>(Promise<Token>())
            let leaf: Promise<Token>
            do {
                var step = innerHolder.withLock { $0! }
                for _ in 1...depth { step = step.then(on: .immediate) { Token(depth: $0.depth + 1) } }
                leaf = step.then(on: .immediate) { parent -> Token in
                    for _ in 0..<200 { _ = walks.load(ordering: .relaxed) }  // the cascade stays open a little
                    return Token(depth: parent.depth + 1)
                }
            }
            let kick = outer.then(on: .immediate) { _ in
                let inner = innerHolder.withLock { inner in
                    defer { inner = nil }
                    return inner!
                }
                inner.fulfill(Token(depth: 0))
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    for _ in 0..<random.below(200) { _ = walks.load(ordering: .relaxed) }
                    outer.fulfill(1)
                    return
                }
                for _ in 0..<400 {
                    walks.add(1, ordering: .relaxed)
                    if leaf.root.parent != nil {
                        withParent.add(1, ordering: .relaxed)
                        break
                    }
                    if !leaf.isPending { break }
                }
            }
            checker.check(finished, "round hung")
            checker.check(withParent.load(ordering: .relaxed) == 0, "leaf.root answered a promise with a parent")
            _ = kick
            return finished
        }
    }
}
