// Unowned links under fire: the references that do not keep their target alive (a child's
// link to its pending parent, a follower's link to the promise it follows, a registry's link
// to a descendant in flight, an aggregate's link to its inputs) are read on some threads
// while the last reference to the target goes away on another. Every round checks
// that a read answers the target itself or nil, never another promise; that once the target
// is gone every read answers nil; and that, the round over and its promises dropped, every
// one of them is freed. The memory side (no read of a freed promise) is what the TSan and
// ASan runs of this suite check.
import Dispatch
import Foundation
import Promise
import Synchronization
import XCTest

/// Promises that one seat drops (its last references) while others work: behind a lock,
/// so that the seats never race on the array itself.
private final class Droppable: Sendable {
    private let promises: Locked<[AnyPromise]>

    init(_ promises: [AnyPromise]) {
        self.promises = Locked(promises)
    }

    /// The promise at `index`, if not dropped yet (a strong reference: keeps it alive).
    func take(_ index: Int) -> AnyPromise? {
        promises.withLock { $0.indices.contains(index) ? $0[index] : nil }
    }

    func drop() {
        // Moved out under the lock and released after it, so the deinits run unlocked.
        let dropped = promises.withLock { promises -> [AnyPromise] in
            defer { promises = [] }
            return promises
        }
        _ = consume dropped
    }
}

/// Weak references to a round's promises, read after the round.
private final class WeakSet: @unchecked Sendable {
    private var references: [() -> AnyPromise?] = []

    func track(_ promise: AnyPromise) {
        weak let reference = promise
        references.append { reference }
    }

    var alive: Int { references.filter { $0() != nil }.count }
}

final class UnownedLinkStressTests: XCTestCase {
    /// A chain top -> middle -> leaf built on a pending top; seat 0 drops the only
    /// references to top and middle while seats 1 and 2 read `leaf.parent` and
    /// `leaf.root` (and, in one round of three, seat 2 cancels `leaf.root`, which may
    /// settle the ancestors it reaches instead). The top dies pending, which breaks the
    /// chain under it: the leaf ends rejected with `brokenPromise`, unless a cancel got
    /// there first.
    func testNavigationRacesThePendingAncestorsDeath() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let reads = Atomic<Int>(0), readsOfALiveParent = Atomic<Int>(0), wrong = Atomic<Int>(0)
        let deathsSeenByAReader = Atomic<Int>(0)
        var brokenRounds = 0, cancelledRounds = 0

        runStressRounds("navigation racing a pending ancestor's death", invariants: [
            "leaf.parent is the middle promise or nil, leaf.root is top, middle or leaf",
            "a leaf ends cancelled (the cancel came first) or rejected with brokenPromise (the top's death did)",
            "a broken leaf reaches no parent once its ancestors are gone, and is its own root",
            "every promise of the round is freed once dropped",
        ], details: {
            "\(reads.load(ordering: .relaxed)) reads, \(readsOfALiveParent.load(ordering: .relaxed)) found the parent alive; "
                + "a reader saw the parent alive, then gone \(deathsSeenByAReader.load(ordering: .relaxed)) times; "
                + "rounds ending broken \(brokenRounds), with a cancel \(cancelledRounds)"
        }) { checker in
            let round = checker.round
            let weak = WeakSet()
            let ids: (top: ObjectIdentifier, middle: ObjectIdentifier, leaf: ObjectIdentifier)
            let ancestors: Droppable
            let leafHolder: Droppable
            do {
                let top = Promise<Int>()
                let middle = top.then(on: round % 2 == 0 ? .immediate : .default) { $0 + 1 }
                let leaf = middle.then { $0 + 1 }
                ids = (ObjectIdentifier(top), ObjectIdentifier(middle), ObjectIdentifier(leaf))
                [top, middle, leaf].forEach(weak.track)
                ancestors = Droppable([top, middle])
                leafHolder = Droppable([leaf])
            }
            let cancelsRoot = round % 3 == 2
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                guard let leaf = leafHolder.take(0) else { return }
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    for _ in 0..<random.below(400) { _ = reads.load(ordering: .relaxed) }
                    ancestors.drop()
                    return
                }
                let cancelAt = random.below(8)
                // Bounded; a pause between reads, or the readers' own references would keep
                // the ancestors alive until the bound.
                var diedWhileReading = false
                for attempt in 0..<5_000 {
                    let parent = leaf.parent
                    let root = leaf.root
                    reads.add(1, ordering: .relaxed)
                    if let parent {
                        readsOfALiveParent.add(1, ordering: .relaxed)
                        if ObjectIdentifier(parent) != ids.middle { wrong.add(1, ordering: .relaxed) }
                    }
                    if ![ids.top, ids.middle, ids.leaf].contains(ObjectIdentifier(root)) {
                        wrong.add(1, ordering: .relaxed)
                    }
                    if seat == 2, cancelsRoot, attempt == cancelAt {
                        root.cancel(reason: StressError(id: round))
                    }
                    if parent == nil {
                        diedWhileReading = attempt > 0
                        break
                    }
                    if !leaf.isPending { break }  // settled: cancelled, or broken by the top's death
                    for _ in 0..<random.below(64) { _ = reads.load(ordering: .relaxed) }
                }
                if diedWhileReading { deathsSeenByAReader.add(1, ordering: .relaxed) }
            }
            checker.check(finished, "round hung")
            checker.check(wrong.load(ordering: .relaxed) == 0, "a read answered a promise that is not the target")
            guard let leaf = leafHolder.take(0) as? Promise<Int> else { return false }
            // The leaf's handler runs on `.default`: wait for it (bounded).
            checker.check((try? leaf.wait(timeout: .seconds(10))) == nil, "leaf fulfilled without a value above it")
            switch Final(leaf) {
            case .rejected(let tag):
                brokenRounds += 1
                checker.check(tag == .brokenPromise, "leaf rejected with \(tag), not brokenPromise")
                // Its handler has run: the settled middle is gone with nothing holding it.
                let deadline = Date(timeIntervalSinceNow: 5)
                while leaf.parent != nil && Date() < deadline { usleep(100) }
                checker.check(leaf.parent == nil, "a broken leaf still reaches a parent after it was dropped")
                checker.check(leaf.root === leaf, "a broken leaf's root is not itself")
            case .cancelled:
                cancelledRounds += 1
                if let parent = leaf.parent {
                    checker.check(ObjectIdentifier(parent) == ids.middle && !parent.isPending,
                                  "a cancelled leaf reaches a parent that is not the settled middle")
                }
            case let other:
                checker.check(false, "leaf ended \(other)")
            }
            _ = consume leaf
            leafHolder.drop()
            // The block that ran the leaf's handler on `.default` may still be releasing
            // it: poll briefly.
            let deadline = Date(timeIntervalSinceNow: 5)
            while weak.alive != 0 && Date() < deadline { usleep(100) }
            checker.check(weak.alive == 0, "\(weak.alive) promise(s) of the round still alive")
            return true
        }
    }

    /// A settled chain is released iteratively (the leaf's deinit steals each ancestor's
    /// links into a loop, so the ancestors are still alive, though about to die, when their
    /// own retains of their parents are dropped) while seats 1 and 2 load middle links of
    /// the chain through Swift weak references and read their `parent` and `root`. A
    /// promise reached that way must not lead to a parent that was already freed.
    func testWeakReadersRaceTheIterativeReleaseOfASettledChain() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let length = 60
        let loads = Atomic<Int>(0), wrong = Atomic<Int>(0)

        runStressRounds("weak readers racing the iterative release of a settled chain", invariants: [
            "a promise loaded through a weak reference answers its own parent or nil",
            "every promise of the chain is freed once the leaf is dropped",
        ], details: {
            "\(loads.load(ordering: .relaxed)) chain promises loaded through weak references, before or while the leaf was dropped"
        }) { checker in
            let round = checker.round
            let weak = WeakSet()
            let leafHolder: Droppable
            var ids: [ObjectIdentifier] = []
            do {
                let root = Promise<Int>()
                var chain: [Promise<Int>] = [root]
                for _ in 0..<length { chain.append(chain[chain.count - 1].then(on: .immediate) { $0 + 1 }) }
                root.fulfill(round)
                chain.forEach(weak.track)
                ids = chain.map(ObjectIdentifier.init)
                leafHolder = Droppable([chain[length]])
            }
            let parentOf = Dictionary(uniqueKeysWithValues: (1...length).map { (ids[$0], ids[$0 - 1]) })
            // Weak references to every other promise of the chain, taken from the leaf up.
            let middles: [@Sendable () -> AnyPromise?] = {
                var references: [@Sendable () -> AnyPromise?] = []
                var node = leafHolder.take(0)
                while let promise = node {
                    weak let reference = promise
                    references.append { reference }
                    node = promise.parent?.parent
                }
                return references
            }()
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    for _ in 0..<random.below(5_000) { _ = loads.load(ordering: .relaxed) }
                    leafHolder.drop()
                    return
                }
                for _ in 0..<300 {
                    guard let middle = middles[random.below(middles.count)]() else {
                        if middles.allSatisfy({ $0() == nil }) { break }
                        continue
                    }
                    loads.add(1, ordering: .relaxed)
                    // Several reads while holding it: one loaded as the loop was releasing
                    // it must keep answering its own parent or nil, not a freed one.
                    for _ in 0..<8 {
                        if let parent = middle.parent, parentOf[ObjectIdentifier(middle)] != ObjectIdentifier(parent) {
                            wrong.add(1, ordering: .relaxed)
                        }
                    }
                    _ = middle.root
                }
            }
            checker.check(finished, "round hung")
            checker.check(wrong.load(ordering: .relaxed) == 0, "a middle promise answered a parent not its own")
            checker.check(weak.alive == 0, "\(weak.alive) promise(s) of the chain still alive")
            return true
        }
    }

    /// A child follows a promise its handler returned; seat 0 drops the only reference to
    /// that promise (it dies pending, unless another seat holds it), seat 1 cancels the
    /// child (which cancels the followed promise if it can still reach it), and in half the
    /// rounds seat 2 fulfils the followed promise. The child ends fulfilled with its value,
    /// cancelled, or rejected with `brokenPromise` when the followed promise died pending
    /// first; everything is freed.
    func testFollowerCancelRacesTheFollowedPromisesDeath() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        var fulfilledRounds = 0, cancelledRounds = 0, brokenRounds = 0, followedCancelled = 0

        runStressRounds("follower cancel racing the followed promise's death", invariants: [
            "the follower ends fulfilled with the followed value, cancelled with the canceller's reason, or broken",
            "a followed promise that is cancelled carries that reason",
            "every promise of the round is freed once dropped",
        ], details: {
            "followers fulfilled \(fulfilledRounds), cancelled \(cancelledRounds), broken \(brokenRounds); followed promises "
                + "cancelled through the follower \(followedCancelled)"
        }) { checker in
            let round = checker.round
            let weak = WeakSet()
            let followedHolder: Droppable
            let followerHolder: Droppable
            let followedSaw = Locked<Seen?>(nil)
            do {
                let parent = Promise<Int>()
                let followed = Promise<Int>()
                followed.whenComplete(on: .immediate) { result in followedSaw.withLock { $0 = Seen(result) } }
                let follower = parent.flatMap(on: .immediate) { [followed] _ in followed }
                [parent, followed, follower].forEach(weak.track)
                followedHolder = Droppable([followed])
                followerHolder = Droppable([follower])
                parent.fulfill(round)
            }
            let fulfils = round % 2 == 0
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                let held = seat == 2 && fulfils ? followedHolder.take(0) : nil
                let follower = seat == 1 ? followerHolder.take(0) : nil
                crew.barrier.arriveAndWait()
                for _ in 0..<random.below(300) { _ = random.next() }
                switch seat {
                case 0: followedHolder.drop()
                case 1: follower?.cancel(reason: StressError(id: round))
                default: (held as? Promise<Int>)?.fulfill(round * 10)
                }
            }
            checker.check(finished, "round hung")
            guard let follower = followerHolder.take(0) as? Promise<Int> else { return false }
            switch Final(follower) {
            case .fulfilled(let value):
                fulfilledRounds += 1
                checker.check(fulfils && value == round * 10, "follower fulfilled with \(value)")
            case .cancelled(let tag):
                cancelledRounds += 1
                checker.check(tag == .stress(round), "follower cancelled with \(tag)")
            case .rejected(let tag):
                brokenRounds += 1
                checker.check(tag == .brokenPromise && !fulfils, "follower rejected with \(tag)")
            case let other:
                checker.check(false, "follower ended \(other)")
            }
            if case .error(let tag)? = followedSaw.withLock({ $0 }) {
                if tag == .brokenPromise {
                    checker.check(!fulfils, "a followed promise that seat 2 held died pending")
                } else {
                    followedCancelled += 1
                    checker.check(tag == .stress(round), "the followed promise failed with \(tag)")
                }
            }
            _ = consume follower
            followerHolder.drop()
            checker.check(weak.alive == 0, "\(weak.alive) promise(s) of the round still alive")
            return true
        }
    }

    /// Children in flight on a serial queue link themselves into their settled parent's
    /// cancellation registry and die as their handlers finish (nobody holds most of them),
    /// while seats 1 and 2 keep adding children (the registry is pruned past 32 links) and
    /// seat 0 forwards a cancel through the parent, which walks the registry and loads each
    /// child through its unowned link. Every child kept ends fulfilled or cancelled with
    /// that reason, and every child is freed once the queue is idle and the kept ones go.
    func testRegistryWalksRaceTheChildrensDeaths() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let queue = DispatchQueue(label: "UnownedLinkStressTests.registry")
        var fulfilled = 0, cancelled = 0

        runStressRounds("registry walks racing the children's deaths", invariants: [
            "a kept child ends fulfilled with its value or cancelled with the forwarded reason",
            "every child of the round is freed",
        ], details: {
            "kept children fulfilled \(fulfilled), cancelled \(cancelled)"
        }) { checker in
            let round = checker.round
            let parent = Promise(value: round)
            let kept = (0..<3).map { _ in SeatBox<Promise<Int>>() }
            let weak = (0..<3).map { _ in WeakSet() }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                if seat == 0 {
                    for _ in 0..<random.below(3_000) { _ = random.next() }
                    parent.cancel(reason: StressError(id: round))
                    return
                }
                for index in 0..<24 {
                    let child = parent.then(on: queue) { value -> Int in value + 1 }
                    weak[seat].track(child)
                    if index % 4 == 0 { kept[seat].items.append(child) }
                }
            }
            checker.check(finished, "round hung")
            queue.sync {}  // every handler has run (or been skipped) and let its child go
            for child in kept.flatMap(\.items) {
                switch Final(child) {
                case .fulfilled(let value):
                    fulfilled += 1
                    checker.check(value == round + 1, "child fulfilled with \(value)")
                case .cancelled(let tag):
                    cancelled += 1
                    checker.check(tag == .stress(round), "child cancelled with \(tag)")
                case let other:
                    checker.check(false, "child ended \(other)")
                }
            }
            kept.forEach { $0.items = [] }
            // A handler's block may still be releasing its child right after `sync` saw
            // the queue idle: poll briefly.
            let deadline = Date(timeIntervalSinceNow: 5)
            while weak.map(\.alive).reduce(0, +) != 0 && Date() < deadline { usleep(100) }
            checker.check(weak.map(\.alive).reduce(0, +) == 0, "children of the round still alive")
            return true
        }
    }

    /// An aggregate (`all`) holds its inputs through unowned links: seat 0 drops the only
    /// references to half of them (they die pending), seat 2 fulfils the other half, and
    /// seat 1 cancels the aggregate, which cancels the inputs it can still reach. The
    /// aggregate ends cancelled, or rejected with `brokenPromise` when a dropped input died
    /// before the cancel; the fulfilled inputs end fulfilled or cancelled with the reason,
    /// and everything is freed.
    func testAggregateCancelRacesItsInputsDeaths() {
        let crew = Crew(size: 3)
        defer { crew.stop() }
        let width = 8
        var inputsCancelled = 0, inputsFulfilled = 0, aggregatesBroken = 0

        runStressRounds("aggregate cancel racing its inputs' deaths", invariants: [
            "the aggregate ends cancelled with the canceller's reason, or broken by a dropped input",
            "a surviving input ends fulfilled with its value or cancelled with that reason",
            "everything of the round is freed",
        ], details: {
            "surviving inputs fulfilled \(inputsFulfilled), cancelled through the aggregate \(inputsCancelled); "
                + "aggregates broken by a dropped input \(aggregatesBroken)"
        }) { checker in
            let round = checker.round
            let weak = WeakSet()
            let dropped: Droppable, survivors: Droppable, outputHolder: Droppable
            do {
                let inputs = (0..<width).map { _ in Promise<Int>() }
                let output = Promise.all(inputs)
                (inputs + [output]).forEach(weak.track)
                dropped = Droppable(Array(inputs[(width / 2)...]))
                survivors = Droppable(Array(inputs[..<(width / 2)]))
                outputHolder = Droppable([output])
            }
            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                let output = seat == 1 ? outputHolder.take(0) : nil
                crew.barrier.arriveAndWait()
                for _ in 0..<random.below(1_000) { _ = random.next() }
                switch seat {
                case 0: dropped.drop()
                case 1: output?.cancel(reason: StressError(id: round))
                default:
                    for index in 0..<(width / 2) { (survivors.take(index) as? Promise<Int>)?.fulfill(index) }
                }
            }
            checker.check(finished, "round hung")
            if let output = outputHolder.take(0) as? Promise<[Int]> {
                let final = Final(output, { $0.count })
                if final == .rejected(.brokenPromise) { aggregatesBroken += 1 }
                checker.check(final == .cancelled(.stress(round)) || final == .rejected(.brokenPromise),
                              "aggregate ended \(final)")
            }
            for index in 0..<(width / 2) {
                guard let input = survivors.take(index) as? Promise<Int> else { return false }
                switch Final(input) {
                case .fulfilled(let value):
                    inputsFulfilled += 1
                    checker.check(value == index, "input fulfilled with \(value)")
                case .cancelled(let tag):
                    inputsCancelled += 1
                    checker.check(tag == .stress(round), "input cancelled with \(tag)")
                case let other:
                    checker.check(false, "input ended \(other)")
                }
            }
            survivors.drop()
            outputHolder.drop()
            checker.check(weak.alive == 0, "\(weak.alive) promise(s) of the round still alive")
            return true
        }
    }
}
