// Adversarial tests for the in-flight hold chain (holdPathWhileInFlight / addHold /
// removeHold), the cascade-end parent keeping, and the error stored in the payload words.
// Counted errors and values catch a leak (the count stays up) or an over-release (a crash
// or a count below zero); weak references check that everything is freed.
import Dispatch
import Foundation
import Promise
import XCTest

/// Counts live instances of the tracked classes below.
final class LiveCount: @unchecked Sendable {
    static let shared = LiveCount()
    private let lock = NSLock()
    private var live = 0
    func up() { lock.lock(); live += 1; lock.unlock() }
    func down() { lock.lock(); live -= 1; lock.unlock() }
    var value: Int { lock.lock(); defer { lock.unlock() }; return live }
}

/// A class error whose instances are counted (a leak leaves the count up; an over-release
/// crashes or drives it below zero).
final class CountedError: Error, @unchecked Sendable {
    let id: Int
    init(_ id: Int) { self.id = id; LiveCount.shared.up() }
    deinit { LiveCount.shared.down() }
}

/// A counted reference for values.
final class CountedRef: @unchecked Sendable {
    init() { LiveCount.shared.up() }
    deinit { LiveCount.shared.down() }
}

/// A value larger than three words (boxed), holding a counted reference.
struct BigValue: Sendable {
    var ref: CountedRef
    var a = 1, b = 2, c = 3, d = 4
}

/// A context that runs work synchronously inside `execute` (inside the firing).
struct InlineContext: ExecutionContext {
    func execute(_ work: @escaping @Sendable () -> Void) { work() }
}

/// A context that stores work to be run (or dropped) later.
final class ParkingContext: ExecutionContext, @unchecked Sendable {
    private let lock = NSLock()
    private var parked: [@Sendable () -> Void] = []
    func execute(_ work: @escaping @Sendable () -> Void) { lock.lock(); parked.append(work); lock.unlock() }
    func take() -> [@Sendable () -> Void] { lock.lock(); defer { parked = []; lock.unlock() }; return parked }
    func runAll() { for w in take() { w() } }
    func dropAll() { _ = take() }
    var count: Int { lock.lock(); defer { lock.unlock() }; return parked.count }
}

final class WeakBox: @unchecked Sendable {
    weak var object: AnyObject?
    init(_ object: AnyObject?) { self.object = object }
}

final class AdversarialHoldTests: XCTestCase {
    override func setUp() {
        super.setUp()
        // Leftovers from other tests' async work may still be alive: settle first.
        _ = eventually(timeout: 5) { LiveCount.shared.value == 0 }
    }

    private func assertNoLiveObjects(_ message: String = "", file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertTrue(eventually { LiveCount.shared.value == 0 },
                      "live counted objects: \(LiveCount.shared.value) \(message)", file: file, line: line)
    }

    private func assertAllGone(_ boxes: [WeakBox], _ message: String = "", file: StaticString = #filePath, line: UInt = #line) {
        let ok = eventually { boxes.allSatisfy { $0.object == nil } }
        let alive = boxes.enumerated().filter { $0.element.object != nil }.map(\.offset)
        XCTAssertTrue(ok, "still alive: \(alive.prefix(20)) \(message)", file: file, line: line)
    }

    // 1. The hold walk up a long settled chain races a cancel of the in-flight leaf: the
    //    remover (publisher clearing SELF) may overtake the adder's first-hold walk.
    func testHoldWalkRacesCancelOfInFlightLeaf() {
        let iterations = 300
        let depth = 200
        let parking = ParkingContext()
        for iteration in 0..<iterations {
            var boxes: [WeakBox] = []
            do {
                let root = Promise<Int>()
                var chain: [Promise<Int>] = []
                var last = root.then(on: .immediate) { $0 + 1 }
                chain.append(last)
                for _ in 0..<depth {
                    last = last.then(on: .immediate) { $0 + 1 }
                    chain.append(last)
                }
                let leaf = last.then(on: parking) { _ in CountedRef() }
                boxes = chain.map { WeakBox($0) } + [WeakBox(leaf), WeakBox(root)]
                let start = DispatchSemaphore(value: 0)
                let done = DispatchSemaphore(value: 0)
                let lastRef = last
                DispatchQueue.global().async {
                    start.wait()
                    // Cancel as soon as the leaf's parent has published.
                    while lastRef.isPending {}
                    leaf.cancel(reason: CountedError(iteration))
                    done.signal()
                }
                start.signal()
                root.fulfill(0)
                XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
                XCTAssertTrue(leaf.isCancelled)
                parking.runAll()
            }
            assertAllGone(boxes, "iteration \(iteration)")
        }
        assertNoLiveObjects()
    }

    // 2. Same race, but several in-flight leaves share the chain, cancelled/settled from
    //    many threads (the remover meets other descendants' holds).
    func testManyLeavesOnSharedChainCancelAndSettleRacing() {
        let iterations = 200
        for iteration in 0..<iterations {
            var boxes: [WeakBox] = []
            let parking = ParkingContext()
            do {
                let root = Promise<Int>()
                var last = root.then(on: .immediate) { $0 }
                var chain = [last]
                for _ in 0..<50 { last = last.then(on: .immediate) { $0 }; chain.append(last) }
                let leaves = (0..<8).map { _ in last.then(on: parking) { _ in CountedRef() } }
                boxes = (chain + [root]).map { WeakBox($0) } + leaves.map { WeakBox($0) }
                let group = DispatchGroup()
                let lastRef = last
                for (i, leaf) in leaves.enumerated() {
                    DispatchQueue.global().async(group: group) {
                        while lastRef.isPending {}
                        if i % 2 == 0 { leaf.cancel(reason: CountedError(i)) } else { leaf.cancel() }
                    }
                }
                root.fulfill(iteration)
                XCTAssertEqual(group.wait(timeout: .now() + 10), .success)
                // Cancel the middle of the chain too, then run the parked handlers.
                chain[25].cancel(reason: CountedError(-1))
                parking.runAll()
            }
            assertAllGone(boxes, "iteration \(iteration)")
        }
        assertNoLiveObjects()
    }

    // 3. In-flight children dropped unrun by their context: they break, and everything
    // must be freed.
    func testDroppedWorkReleasesWholePath() {
        var boxes: [WeakBox] = []
        do {
            let root = Promise<BigValue>()
            let a = root.then(on: .immediate) { $0 }
            let b = a.then(on: .immediate) { v -> BigValue in v }
            let dropped = b.then(on: DroppingContext()) { _ in CountedRef() }
            let dropped2 = b.then(on: DroppingContext()) { _ -> Int in throw CountedError(1) }
            let grandchild = dropped.then(on: .immediate) { _ in 1 }
            boxes = [WeakBox(root), WeakBox(a), WeakBox(b), WeakBox(dropped), WeakBox(dropped2), WeakBox(grandchild)]
            root.fulfill(BigValue(ref: CountedRef()))
            // The context let go of the work unrun: the children it would have settled
            // broke at once, and with them the grandchild.
            XCTAssertTrue(eventually { dropped.isRejected && dropped2.isRejected && grandchild.isRejected })
        }
        assertAllGone(boxes)
        assertNoLiveObjects()
    }

    // 4. Every order of: cancel ancestor / cancel child / run parked / drop refs, with a
    //    parked (in-flight) grandchild below a settled non-root chain.
    func testInFlightChildrenCancelledDroppedSettledInEveryOrder() {
        let actions = [0, 1, 2, 3]
        var permutations: [[Int]] = []
        func permute(_ prefix: [Int], _ rest: [Int]) {
            if rest.isEmpty { permutations.append(prefix); return }
            for (i, x) in rest.enumerated() { var r = rest; r.remove(at: i); permute(prefix + [x], r) }
        }
        permute([], actions)
        for (pi, order) in permutations.enumerated() {
            var boxes: [WeakBox] = []
            let parking = ParkingContext()
            do {
                var root: Promise<Int>? = Promise<Int>()
                var mid: Promise<Int>? = root!.then(on: .immediate) { $0 + 1 }
                var leaf: Promise<CountedRef>? = mid!.then(on: parking) { _ in CountedRef() }
                var below: Promise<Int>? = leaf!.then(on: parking) { _ in 1 }
                boxes = [WeakBox(root), WeakBox(mid), WeakBox(leaf), WeakBox(below)]
                root!.fulfill(1)
                for action in order {
                    switch action {
                    case 0: mid?.cancel(reason: CountedError(pi))
                    case 1: leaf?.cancel(reason: CountedError(pi))
                    case 2: parking.runAll(); parking.runAll()
                    default: root = nil; mid = nil; leaf = nil; below = nil
                    }
                }
                parking.runAll(); parking.runAll()
                _ = (root, mid, leaf, below)
            }
            parking.dropAll()
            assertAllGone(boxes, "order \(order)")
        }
        assertNoLiveObjects()
    }

    // 5. A follower whose followee is itself in flight (a parked child of a non-root chain).
    func testFollowerOfInFlightFollowee() {
        for mode in 0..<4 {
            var boxes: [WeakBox] = []
            let parking = ParkingContext()
            do {
                let otherRoot = Promise<Int>()
                let otherMid = otherRoot.then(on: .immediate) { $0 }
                let followee = otherMid.then(on: parking) { _ in CountedRef() }
                let root = Promise<Int>()
                let mid = root.then(on: .immediate) { $0 }
                let follower = mid.then(on: .immediate) { _ in followee }
                let tail = follower.then(on: parking) { r in r }
                boxes = [WeakBox(otherRoot), WeakBox(otherMid), WeakBox(followee), WeakBox(root), WeakBox(mid),
                         WeakBox(follower), WeakBox(tail)]
                otherRoot.fulfill(1)
                root.fulfill(1)
                switch mode {
                case 0: mid.cancel(reason: CountedError(0)); XCTAssertTrue(followee.isCancelled)
                case 1: follower.cancel(reason: CountedError(1)); XCTAssertTrue(followee.isCancelled)
                case 2: otherMid.cancel(reason: CountedError(2)); XCTAssertTrue(follower.isCancelled)
                default: break
                }
                parking.runAll(); parking.runAll(); parking.runAll()
                XCTAssertFalse(tail.isPending, "mode \(mode)")
            }
            parking.dropAll()
            assertAllGone(boxes, "mode \(mode)")
        }
        assertNoLiveObjects()
    }

    // 6. delay children (handOff) dropped, cancelled, or let run, under a non-root parent.
    func testDelayChildrenDroppedCancelledOrRun() {
        var boxes: [WeakBox] = []
        do {
            let root = Promise<BigValue>()
            let mid = root.then(on: .immediate) { $0 }
            let d1 = mid.delay(.milliseconds(20))
            let d2 = mid.delay(.milliseconds(20))
            let d3 = mid.delay(.milliseconds(300))  // cancelled below while its timer runs
            let d4 = mid.delay(.milliseconds(5)).then(on: .immediate) { v -> BigValue in throw CountedError(4) }
            boxes = [WeakBox(root), WeakBox(mid), WeakBox(d1), WeakBox(d2), WeakBox(d3), WeakBox(d4)]
            root.fulfill(BigValue(ref: CountedRef()))
            d2.cancel(reason: CountedError(2))
            mid.cancel(reason: CountedError(3))  // reaches d1, d3 (in flight)
            XCTAssertTrue(d3.isCancelled)
            XCTAssertTrue(d1.isCancelled)
        }
        assertAllGone(boxes)
        assertNoLiveObjects()
    }

    // 7. Custom error classes through rejection, cancellation, followers, two-handler
    //    forms: every error instance freed exactly once.
    func testCountedErrorsBalanceThroughFailurePaths() {
        do {
            for i in 0..<200 {
                let root = Promise<Int>()
                let a = root.then(on: .immediate) { v -> Int in throw CountedError(v) }
                let b = a.then(on: .default) { $0 }
                let c = a.recover(on: .immediate) { _ -> Int in throw CountedError(-i) }
                let f = root.then(on: .immediate) { _ in Promise<Int>(error: CountedError(i)) }
                let g = f.then(on: .default, { $0 }, { _ in throw CountedError(i) })
                let h = root.then(on: .immediate) { _ in Promise<BigValue>(error: CountedError(i)) }
                let cancelled = Promise<Int>()
                cancelled.cancel(reason: CountedError(i))
                let k = cancelled.then(on: .default) { $0 }
                let r = Promise<Int>(); r.resolve(with: f)
                root.fulfill(i)
                if i % 3 == 0 { root.cancel(reason: CountedError(i)) }
                _ = try? g.wait(timeout: .seconds(10))
                _ = try? b.wait(timeout: .seconds(10))
                _ = try? k.wait(timeout: .seconds(10))
                _ = (c, h, r)
            }
        }
        assertNoLiveObjects()
    }

    // 8. A handler's fulfilled result turned into a cancel (a cancel forwarded through a
    //    settled ancestor while the handler runs): the value is dropped, the reason kept.
    func testFulfilledAfterClaimTurnedIntoCancel() {
        for i in 0..<50 {
            var boxes: [WeakBox] = []
            do {
                let root = Promise<Int>()
                let mid = root.then(on: .immediate) { $0 }
                let entered = DispatchSemaphore(value: 0)
                let proceed = DispatchSemaphore(value: 0)
                let child = mid.then(on: .default) { _ -> BigValue in
                    entered.signal()
                    _ = proceed.wait(timeout: .now() + 10)
                    return BigValue(ref: CountedRef())
                }
                let small = mid.then(on: .default) { _ -> CountedRef in
                    entered.signal()
                    _ = proceed.wait(timeout: .now() + 10)
                    return CountedRef()
                }
                let follows = mid.then(on: .default) { _ -> Promise<CountedRef> in
                    entered.signal()
                    _ = proceed.wait(timeout: .now() + 10)
                    return Promise(value: CountedRef())
                }
                boxes = [WeakBox(root), WeakBox(mid), WeakBox(child), WeakBox(small), WeakBox(follows)]
                root.fulfill(i)
                for _ in 0..<3 { XCTAssertEqual(entered.wait(timeout: .now() + 10), .success) }
                mid.cancel(reason: CountedError(i))
                for _ in 0..<3 { proceed.signal() }
                XCTAssertThrowsError(try child.wait(timeout: .seconds(10)))
                XCTAssertThrowsError(try small.wait(timeout: .seconds(10)))
                XCTAssertThrowsError(try follows.wait(timeout: .seconds(10)))
                XCTAssertTrue(child.isCancelled && small.isCancelled && follows.isCancelled)
                if case .failure(let e)? = Optional(Result { try child.wait(timeout: .seconds(1)) }) { XCTAssertTrue(e is CountedError) }
            }
            assertAllGone(boxes)
        }
        assertNoLiveObjects()
    }

    // 9. A very deep chain of in-flight (parked) children: unwinding the holds when they all
    //    settle or die must not overflow the stack.
    func testVeryDeepParkedChainUnwinds() {
        let depth = 100_000
        for mode in 0..<2 {
            let parking = ParkingContext()
            weak var weakRoot: Promise<Int>?
            weak var weakLeaf: Promise<Int>?
            do {
                let root = Promise<Int>()
                weakRoot = root
                var last = root.then(on: .immediate) { $0 }
                for _ in 0..<depth { last = last.then(on: .immediate) { $0 } }
                let leaf = last.then(on: parking) { $0 }
                weakLeaf = leaf
                root.fulfill(1)
                XCTAssertEqual(parking.count, 1)
                if mode == 0 { parking.runAll() } else { parking.dropAll() }
            }
            XCTAssertTrue(eventually { weakRoot == nil && weakLeaf == nil }, "mode \(mode)")
        }
        // A deep chain of parked handlers, each going in flight in turn.
        let parking = ParkingContext()
        weak var weakLast: Promise<Int>?
        do {
            let root = Promise<Int>()
            var last = root.then(on: .immediate) { $0 }
            for _ in 0..<20_000 { last = last.then(on: parking) { $0 } }
            weakLast = last
            root.fulfill(1)
            var rounds = 0
            while parking.count > 0 && rounds < 30_000 { parking.runAll(); rounds += 1 }
            XCTAssertTrue(last.isFulfilled)
        }
        XCTAssertTrue(eventually { weakLast == nil })
    }

    // 10. cancel racing settle (fulfill/reject with class errors) on many threads, on
    //     children in flight under a non-root parent.
    func testCancelRacingSettleOnManyThreads() {
        let rounds = 30
        for round in 0..<rounds {
            var boxes: [WeakBox] = []
            do {
                let root = Promise<Int>()
                let mid = root.then(on: .immediate) { $0 }
                let ds = (0..<6).map { _ in mid.delay(.milliseconds(20)) }  // see test 6 on timers
                let qs = (0..<6).map { _ in mid.then(on: .default) { _ in BigValue(ref: CountedRef()) } }
                boxes = [WeakBox(root), WeakBox(mid)] + ds.map { WeakBox($0) } + qs.map { WeakBox($0) }
                let group = DispatchGroup()
                DispatchQueue.global().async(group: group) { root.fulfill(round) }
                for (i, d) in ds.enumerated() {
                    DispatchQueue.global().async(group: group) {
                        switch i % 3 {
                        case 0: _ = d.fulfill(i)
                        case 1: _ = d.reject(CountedError(i))
                        default: d.cancel(reason: CountedError(i))
                        }
                    }
                    DispatchQueue.global().async(group: group) { d.cancel(reason: CountedError(-i)) }
                }
                for q in qs { DispatchQueue.global().async(group: group) { q.cancel(reason: CountedError(7)) } }
                DispatchQueue.global().async(group: group) { mid.cancel(reason: CountedError(8)) }
                XCTAssertEqual(group.wait(timeout: .now() + 10), .success)
                for q in qs { _ = try? q.wait(timeout: .seconds(10)) }
                for d in ds { XCTAssertTrue(eventually { !d.isPending }) }
            }
            assertAllGone(boxes, "round \(round)")
        }
        assertNoLiveObjects()
    }

    // 11. `.immediate` cascades started from inside a handler running on a queue, with
    //     in-flight leaves and a cancel of a settled middle from the handler itself.
    func testImmediateCascadeFromInsideQueuedHandler() {
        for i in 0..<100 {
            var boxes = [WeakBox]()
            let parking = ParkingContext()
            let holder = Recorder<WeakBox>()
            do {
                let outer = Promise<Int>()
                let outerChild = outer.then(on: .immediate) { $0 }
                let finished = outerChild.then(on: .default) { v -> Int in
                    let inner = Promise<Int>()
                    var last = inner.then(on: .immediate) { $0 }
                    let first = last
                    for _ in 0..<30 { last = last.then(on: .immediate) { $0 } }
                    let leaf = last.then(on: parking) { _ in CountedRef() }
                    let leaf2 = last.then(on: .immediate) { _ -> Int in throw CountedError(v) }
                    holder.append(WeakBox(inner)); holder.append(WeakBox(first)); holder.append(WeakBox(leaf))
                    holder.append(WeakBox(leaf2)); holder.append(WeakBox(last))
                    inner.fulfill(v)
                    first.cancel(reason: CountedError(v))
                    XCTAssertTrue(leaf.isCancelled)
                    return v
                }
                boxes = [WeakBox(outer), WeakBox(outerChild), WeakBox(finished)]
                outer.fulfill(i)
                XCTAssertEqual(try? finished.wait(timeout: .seconds(10)), i)
                parking.runAll()
            }
            assertAllGone(boxes + holder.values, "iteration \(i)")
        }
        assertNoLiveObjects()
    }

    // 12. A context that runs work inline inside the firing (a queued child run within a
    //     cascade): keepParentUntilCascadeEnds reuses the node.
    func testInlineContextInsideCascade() {
        for i in 0..<200 {
            var boxes = [WeakBox]()
            do {
                let root = Promise<Int>()
                let a = root.then(on: .immediate) { $0 }
                let b = a.then(on: InlineContext()) { v -> BigValue in
                    if v % 2 == 0 { throw CountedError(v) }
                    return BigValue(ref: CountedRef())
                }
                let c = b.then(on: InlineContext()) { _ in Promise<Int>(value: 3) }
                let d = c.then(on: .immediate) { $0 }
                let e = b.then(on: InlineContext()) { _ in Promise<Int>() }  // follows forever
                boxes = [WeakBox(root), WeakBox(a), WeakBox(b), WeakBox(c), WeakBox(d), WeakBox(e)]
                root.fulfill(i)
                if i % 3 == 0 { a.cancel(reason: CountedError(-i)) }
                XCTAssertFalse(b.isPending)
                XCTAssertFalse(d.isPending)
                e.cancel(reason: CountedError(i))
            }
            assertAllGone(boxes, "iteration \(i)")
        }
        assertNoLiveObjects()
    }

    // 13. Boxed values (more than three words) with failures, in every settle path.
    func testBoxedValuesWithFailures() {
        do {
            for i in 0..<300 {
                let root = Promise<BigValue>()
                let a = root.then(on: .immediate) { $0 }
                let b = a.then(on: .default) { v -> BigValue in
                    if i % 2 == 0 { throw CountedError(i) }
                    return v
                }
                let c = b.then(on: .immediate) { v in Promise<BigValue>(value: v) }
                let d = Promise<BigValue>(); d.resolve(with: c)
                let e = a.recover(on: .immediate) { _ in BigValue(ref: CountedRef()) }
                root.fulfill(BigValue(ref: CountedRef()))
                if i % 5 == 0 { a.cancel(reason: CountedError(i)) }
                _ = try? d.wait(timeout: .seconds(10))
                _ = try? c.wait(timeout: .seconds(10))
                _ = e
                let rejected = Promise<BigValue>(error: CountedError(i))
                let r2 = rejected.then(on: .immediate) { $0 }
                XCTAssertTrue(r2.isRejected)
                let cancelled = Promise<BigValue>(); cancelled.cancel(reason: CountedError(i))
                _ = cancelled.then(on: .immediate) { $0 }
            }
        }
        assertNoLiveObjects()
    }
}
