// A promise never waits on itself: every way of closing a cycle of waits rejects the
// promises of the cycle with PromiseError.cycle instead of leaving them pending for ever
// (Promises/A+ 2.3.1).
import Dispatch
import Foundation
@testable import Promise
import XCTest

/// A slot a handler reads once the promise it needs exists.
private final class Slot<T>: @unchecked Sendable {
    var value: T?
}

final class CycleTests: XCTestCase {
    private func assertCycle<T>(_ promise: Promise<T>, file: StaticString = #filePath, line: UInt = #line) {
        let e = error(promise, file: file, line: line)
        guard case PromiseError.cycle? = e else {
            return XCTFail("expected PromiseError.cycle, got \(String(describing: e))", file: file, line: line)
        }
        XCTAssertTrue(promise.isRejected, file: file, line: line)
    }

    func testResolveWithItselfRejects() {
        let p = Promise<Int>()
        p.resolve(with: p)
        assertCycle(p)
    }

    func testTwoPromisesFollowingEachOtherBothReject() {
        let a = Promise<Int>(), b = Promise<Int>()
        a.resolve(with: b)
        XCTAssertTrue(a.isPending)
        b.resolve(with: a)
        assertCycle(a)
        assertCycle(b)
    }

    func testALongFollowCycleRejectsEveryPromiseOfIt() {
        let chain = (0..<1_000).map { _ in Promise<Int>() }
        for i in 0..<(chain.count - 1) { chain[i].resolve(with: chain[i + 1]) }
        chain[chain.count - 1].resolve(with: chain[0])
        for p in chain { assertCycle(p) }
    }

    func testAFollowChainThatDoesNotLoopStillSettles() {
        let a = Promise<Int>(), b = Promise<Int>(), c = Promise<Int>()
        a.resolve(with: b)
        c.resolve(with: b)  // two followers of one promise: no cycle
        b.fulfill(3)
        XCTAssertEqual(value(a), 3)
        XCTAssertEqual(value(c), 3)
    }

    func testHandlerReturningItsOwnChildRejectsIt() {
        let parent = Promise<Int>()
        let slot = Slot<Promise<Int>>()
        let child = parent.flatMap(on: .immediate) { _ in slot.value! }
        slot.value = child
        parent.fulfill(1)
        assertCycle(child)
    }

    func testHandlerOnAQueueReturningItsOwnChildRejectsIt() {
        let parent = Promise(value: 1)
        let slot = Slot<Promise<Int>>()
        let started = DispatchSemaphore(value: 0)
        let child = parent.flatMap(on: DispatchQueue(label: "cycle")) { _ -> Promise<Int> in
            started.wait()
            return slot.value!
        }
        slot.value = child
        started.signal()
        assertCycle(child)
    }

    func testHandlerReturningAChildOfItsChildRejects() {
        let parent = Promise<Int>()
        let slot = Slot<Promise<Int>>()
        let child = parent.flatMap(on: .immediate) { _ in slot.value!.map(on: .immediate) { $0 + 1 } }
        slot.value = child
        parent.fulfill(1)
        assertCycle(child)
    }

    func testHandlerReturningAPromiseThatFollowsItsChildRejectsBoth() {
        let parent = Promise<Int>()
        let slot = Slot<Promise<Int>>()
        let back = Slot<Promise<Int>>()
        let child = parent.flatMap(on: .immediate) { _ -> Promise<Int> in
            let follower = Promise<Int>()
            follower.resolve(with: slot.value!)
            back.value = follower
            return follower
        }
        slot.value = child
        parent.fulfill(1)
        assertCycle(child)
        assertCycle(back.value!)
    }

    func testRecoverReturningItsOwnChildRejects() {
        let parent = Promise<Int>()
        let slot = Slot<Promise<Int>>()
        let child = parent.recover(on: .immediate) { _ in slot.value! }
        slot.value = child
        parent.reject(TestError(1))
        assertCycle(child)
    }

    func testHandlerReturningItsParentsSiblingIsNoCycle() {
        let parent = Promise<Int>()
        let other = Promise<Int>()
        let child = parent.flatMap(on: .immediate) { _ in other.map(on: .immediate) { $0 * 2 } }
        parent.fulfill(1)
        XCTAssertTrue(child.isPending)
        other.fulfill(4)
        XCTAssertEqual(value(child), 8)
    }

    // MARK: Waits through a combinator

    /// The output of `allSettled` settles only once every input did: following it from
    /// one of its inputs closes a cycle. One of `race`, `any`, `all` or `and` may be
    /// settled by one input (`all` and `and` reject with the first error): it waits on the
    /// promise only when every input still pending does.
    func testFollowingACombinatorOverItselfRejects() {
        let race = Promise<Int>()
        race.resolve(with: Promise.race([race]))
        assertCycle(race)

        let all = Promise<Int>()
        all.resolve(with: Promise.all([Promise(value: 1), all]).map(on: .immediate) { $0[1] })
        assertCycle(all)

        let any = Promise<Int>()
        any.resolve(with: Promise.any([any, any, Promise(error: TestError(1))]))
        assertCycle(any)

        let settled = Promise<Int>(), other = Promise<Int>()
        settled.resolve(with: Promise.allSettled([settled, other]).map(on: .immediate) { _ in 0 })
        assertCycle(settled)
        XCTAssertTrue(other.isPending, "an input outside the cycle is untouched")

        let both = Promise<Int>()
        both.resolve(with: both.and(Promise(value: "x")).map(on: .immediate) { $0.0 })
        assertCycle(both)
    }

    /// The output itself ends as the cycle does: its input rejected it.
    func testACombinatorOutputInTheCycleRejectsWithIt() {
        let p = Promise<Int>()
        let race = Promise.race([p])
        p.resolve(with: race)
        assertCycle(p)
        assertCycle(race)
    }

    /// Through nested combinators and a child of the promise that closes the cycle.
    func testACycleThroughNestedCombinatorsAndAChildRejects() {
        let p = Promise<Int>()
        let child = p.then(on: .default) { $0 + 1 }
        let other = Promise<Int>()
        let outer = Promise.allSettled([Promise.all([Promise.race([child])]).map(on: .immediate) { $0[0] }, other]).map(on: .immediate) { _ in 0 }
        p.resolve(with: outer)
        assertCycle(p)
        XCTAssertTrue(other.isPending)
    }

    /// A handler that returns a combinator over its own child.
    func testHandlerReturningACombinatorOverItsOwnChildRejects() {
        let parent = Promise<Int>()
        let slot = Slot<Promise<Int>>()
        let other = Promise<Int>()
        let child = parent.flatMap(on: .immediate) { _ in Promise.allSettled([slot.value!, other]).map(on: .immediate) { _ in 0 } }
        slot.value = child
        parent.fulfill(1)
        assertCycle(child)
    }

    /// `race` or `any` over the follower and another input still pending is no cycle: the
    /// other input may settle it (a request racing a shutdown signal).
    func testFollowingARaceThatAnotherInputCanWinIsNoCycle() {
        let p = Promise<Int>(), shutdown = Promise<Int>()
        p.resolve(with: Promise.race([p, shutdown]))
        XCTAssertTrue(p.isPending)
        shutdown.fulfill(5)
        XCTAssertEqual(value(p), 5)

        let q = Promise<Int>(), fallback = Promise<Int>()
        q.resolve(with: Promise.any([q.then(on: .immediate) { $0 }, fallback]))
        XCTAssertTrue(q.isPending)
        fallback.fulfill(6)
        XCTAssertEqual(value(q), 6)

        // `all` over the follower and another input: that input may still reject it.
        let s = Promise<Int>(), other = Promise<Int>()
        s.resolve(with: Promise.all([s, other]).map(on: .immediate) { $0[0] })
        XCTAssertTrue(s.isPending)
        other.reject(TestError(7))
        XCTAssertEqual(error(s) as? TestError, TestError(7))

        // With every other input waiting on the follower too, nothing can settle it,
        // also when those inputs share a chain up to it.
        let r = Promise<Int>()
        r.resolve(with: Promise.race([r.then(on: .immediate) { $0 }, r]))
        assertCycle(r)
        let t = Promise<Int>()
        let shared = t.then(on: .default) { $0 }
        t.resolve(with: Promise.race([shared.then(on: .default) { $0 }, shared.then(on: .default) { $0 }]))
        assertCycle(t)
    }

    /// The other input settles after the follower locked in, without settling the output
    /// (`all`'s fulfils, `any`'s rejects): from then on only the follower could settle the
    /// output, and it waits on it. The output, and the promises of the cycle with it, reject
    /// with `PromiseError.cycle`, as when the other input had settled first; an input that
    /// does settle the output still wins.
    func testACycleClosedByAnotherInputSettlingLaterRejects() {
        let a = Promise<Int>(), b = Promise<Int>()
        let all = Promise.all([a, b])
        a.resolve(with: all.map(on: .immediate) { $0[1] })
        XCTAssertTrue(a.isPending, "b may still reject the output")
        b.fulfill(1)
        assertCycle(all)
        assertCycle(a)

        let c = Promise<Int>(), d = Promise<Int>()
        let any = Promise.any([c, d])
        c.resolve(with: any)
        d.reject(TestError(3))
        // The follower that closed the cycle rejects with the cycle error, as when it locks
        // in last; the `any` collects it with the other rejection.
        assertCycle(c)
        guard case PromiseError.allRejected(let errors)? = error(any), case PromiseError.cycle? = errors.first else {
            return XCTFail("any ended \(any.state)")
        }
        XCTAssertEqual(errors.last as? TestError, TestError(3))

        let e = Promise<Int>(), f = Promise<Int>(), g = Promise<Int>()
        let both = e.and(f, g)
        e.resolve(with: both.map(on: .immediate) { $0.0 })
        f.fulfill(1)
        XCTAssertTrue(e.isPending, "g may still reject the output")
        g.fulfill(2)
        assertCycle(both)
        assertCycle(e)

        // Still an input that settles the output: no cycle.
        let h = Promise<Int>(), i = Promise<Int>(), j = Promise<Int>()
        let settledByInput = Promise.all([h, i, j])
        h.resolve(with: settledByInput.map(on: .immediate) { $0[1] })
        i.fulfill(1)
        j.reject(TestError(4))
        XCTAssertEqual(error(settledByInput) as? TestError, TestError(4))
        XCTAssertEqual(error(h) as? TestError, TestError(4))

        // Through a nested combinator: the inner `race`'s other input settles later.
        let k = Promise<Int>(), l = Promise<Int>(), m = Promise<Int>()
        let inner = Promise.race([k.then(on: .immediate) { $0 }, l])
        let outer = Promise.all([inner, m])
        k.resolve(with: outer.map(on: .immediate) { $0[0] })
        m.fulfill(1)
        XCTAssertTrue(k.isPending, "l may still settle the race")
        l.reject(TestError(5))  // settles the race, and so the outer output: no cycle
        XCTAssertEqual(error(outer) as? TestError, TestError(5))
    }

    /// Two inputs of one combinator follow it: each one's walk comes back to the
    /// combinator it is asking about, which makes that input no way out (not the nesting
    /// limit's "cannot tell"), whichever locks in last and whether a third input settles
    /// before or after.
    func testTwoInputsFollowingTheirOwnCombinatorCloseACycle() {
        let a = Promise<Int>(), b = Promise<Int>()
        let all = Promise.all([a, b])
        a.resolve(with: all.map(on: .immediate) { $0[0] })
        XCTAssertTrue(a.isPending, "b could still settle it")
        b.resolve(with: all.map(on: .immediate) { $0[1] })
        assertCycle(all)
        assertCycle(a)
        assertCycle(b)

        let c = Promise<Int>(), d = Promise<Int>(), e = Promise<Int>()
        let three = Promise.all([c, d, e])
        c.resolve(with: three.map(on: .immediate) { $0[1] })
        d.fulfill(1)
        XCTAssertTrue(three.isPending, "e may still reject it")
        e.resolve(with: three.map(on: .immediate) { $0[2] })
        assertCycle(three)

        // Nested: the inner `any`'s last way out rejects after both followers locked in.
        let f = Promise<Int>(), g = Promise<Int>(), h = Promise<Int>()
        let inner = Promise.any([g, h])
        let outer = Promise.all([f, inner])
        f.resolve(with: outer.map(on: .immediate) { $0[0] })
        g.resolve(with: outer.map(on: .immediate) { $0[1] })
        XCTAssertTrue(outer.isPending, "h may still fulfil the inner any")
        h.reject(TestError(1))
        assertCycle(g)  // the follower the inner `any` found waiting on the output
        XCTAssertNotNil(error(f), "f ended \(f.state)")
        XCTAssertNotNil(error(inner), "inner ended \(inner.state)")
        XCTAssertNotNil(error(outer), "outer ended \(outer.state)")
        // The same graph with `h` rejected before `g` locks in ends the same way.
        let f2 = Promise<Int>(), g2 = Promise<Int>(), h2 = Promise<Int>()
        let inner2 = Promise.any([g2, h2])
        let outer2 = Promise.all([f2, inner2])
        f2.resolve(with: outer2.map(on: .immediate) { $0[0] })
        h2.reject(TestError(1))
        g2.resolve(with: outer2.map(on: .immediate) { $0[1] })
        assertCycle(g2)
        XCTAssertEqual(String(describing: error(f2)), String(describing: error(f)))
    }

    /// A combinator of more inputs than the walk's budget, every one but the follower
    /// settled one by one: the recheck starts where its last scan found a way out, so it
    /// finds the cycle at the last settle, however many inputs came before.
    func testACycleThroughALargeCombinatorIsFoundAtItsLastWayOut() {
        let follower = Promise<Int>()
        let others = (0..<3_000).map { _ in Promise<Int>() }
        let all = Promise.all([follower] + others)
        follower.resolve(with: all.map(on: .immediate) { $0[1] })
        for (index, other) in others.enumerated() { other.fulfill(index) }
        assertCycle(all)
        assertCycle(follower)
    }

    /// A cycle through an `all` nested in an `any`: the follower ends with the cycle
    /// error whichever way out settles last, or whether both settled before it locked in
    /// (the `any` ends rejected too, with the cycle error itself or among the errors it
    /// collects, depending on which of its inputs the cycle error reached first).
    func testACycleEndsTheSameWhicheverWayOutSettlesLast() {
        for order in 0..<3 {
            let a = Promise<Int>(), y = Promise<Int>(), z = Promise<Int>()
            let any = Promise.any([Promise.all([a, y]).map(on: .immediate) { $0[0] }, z])
            if order == 2 { y.fulfill(1); z.reject(TestError(2)) }
            a.resolve(with: any)
            if order == 0 { y.fulfill(1); z.reject(TestError(2)) }
            if order == 1 { z.reject(TestError(2)); y.fulfill(1) }
            assertCycle(a)
            XCTAssertTrue(any.isRejected, "order \(order): the any ended \(any.state)")
        }
    }

    /// The same, with the other input settling on another thread while the follower locks
    /// in: whichever comes first, the cycle is found (the aggregator's cycle watch and the
    /// input's publish are a Dekker pairing).
    func testACycleClosedByAnInputSettlingDuringTheLockInRejects() {
        for round in 0..<2_000 {
            let a = Promise<Int>(), b = Promise<Int>()
            let all = Promise.all([a, b])
            let follower = all.map(on: .immediate) { $0[1] }
            let go = DispatchSemaphore(value: 0)
            let settler = Thread { go.wait(); b.fulfill(round) }
            settler.start()
            go.signal()
            a.resolve(with: follower)
            guard case PromiseError.cycle? = error(all) else {
                return XCTFail("round \(round): the output ended \(all.state)")
            }
        }
    }

    /// `any([p, q])` that `p` follows, while `q` rejects on another thread: whichever
    /// thread finds the cycle, `p` is the promise it rejects with `PromiseError.cycle`
    /// (`p`'s lock-in, or `q`'s recheck, which picks `p` as the follower), and the `any`
    /// collects that error with `q`'s, as in any order on one thread. Before, `q`'s
    /// recheck read `p`'s claim a second time, after `p`'s own check had rejected it:
    /// finding no follower, it rejected the `any` itself with a bare `cycle` (about 1 round
    /// in 5,000).
    func testAnAnyOnACycleCollectsTheCycleErrorWhicheverThreadFindsIt() {
        for round in 0..<20_000 {
            let p = Promise<Int>(), q = Promise<Int>()
            let any = Promise.any([p, q])
            let go = DispatchSemaphore(value: 0)
            let settler = Thread { go.wait(); q.reject(TestError(round)) }
            settler.start()
            go.signal()
            p.resolve(with: any)
            let failure = error(any)
            guard case PromiseError.allRejected(let errors)? = failure else {
                return XCTFail("round \(round): the any ended \(String(describing: failure))")
            }
            guard errors.count == 2, case PromiseError.cycle? = errors[0] as? PromiseError,
                  (errors[1] as? TestError)?.id == round else {
                return XCTFail("round \(round): the any collected \(errors)")
            }
            assertCycle(p)
        }
    }

    /// `any([p, q, y])` that `p` follows, `q` rejected and `y` dropped pending, in either
    /// order: `y`'s slot counts it as rejected (`brokenPromise`), which settles no `any`,
    /// so nothing can settle it but `p`: a cycle. Before, the walks took `y`'s cleared
    /// link for a way out, and `p` and the `any` stayed pending for ever.
    func testAnAnyOnACycleWhoseOtherInputsRejectOrDieIsACycle() {
        for yDiesFirst in [false, true] {
            let p = Promise<Int>(), q = Promise<Int>()
            var y: Promise<Int>? = Promise<Int>()
            let any = Promise.any([p, q, y.unsafelyUnwrapped])
            p.resolve(with: any)
            if yDiesFirst { y = nil }
            q.reject(TestError(1))
            if !yDiesFirst { y = nil }
            assertCycle(p)
            let failure = error(any)
            guard case PromiseError.allRejected(let errors)? = failure, errors.count == 3 else {
                return XCTFail("y dies first: \(yDiesFirst): the any ended \(String(describing: failure))")
            }
            XCTAssertNil(y)
        }
    }

    /// The same, `y` dropped before `p` locks in: the lock-in's own walk finds the cycle.
    func testFollowingAnAnyWhoseOtherInputsRejectedOrDiedIsACycle() {
        let p = Promise<Int>(), q = Promise<Int>()
        var y: Promise<Int>? = Promise<Int>()
        let any = Promise.any([p, q, y.unsafelyUnwrapped])
        q.reject(TestError(1))
        y = nil
        XCTAssertNil(y)
        p.resolve(with: any)
        assertCycle(p)
        XCTAssertTrue(any.isRejected, "the any ended \(any.state)")
    }

    /// Inputs that share a long pending chain: the walk takes the chain once, and finds
    /// the cycle at its end.
    func testInputsSharingAPendingChainAreWalkedOnce() {
        let p = Promise<Int>()
        var top: Promise<Int> = p.then(on: .default) { $0 }
        for _ in 0..<200 { top = top.then(on: .default) { $0 } }
        let other = Promise<Int>()
        let inputs = (0..<200).map { index in top.then(on: .default) { $0 + index } } + [other]
        p.resolve(with: Promise.allSettled(inputs).map(on: .immediate) { _ in 0 })
        assertCycle(p)
    }

    /// No false cycle: inputs that share an ancestor (a diamond), and a combinator whose
    /// inputs wait on the follower's siblings, settle as usual.
    func testFollowingACombinatorOfUnrelatedInputsIsNoCycle() {
        let p = Promise<Int>()
        let source = Promise<Int>()
        let inputs = (0..<100).map { index in source.then(on: .immediate) { $0 + index } }
        let sum = Promise.all(inputs + [Promise.race(inputs)]).map(on: .immediate) { $0.reduce(0, +) }
        let observed = p.then(on: .immediate) { $0 }
        p.resolve(with: sum)
        XCTAssertTrue(p.isPending)
        source.fulfill(1)
        let expected = (0..<100).reduce(0) { $0 + 1 + $1 } + 1
        XCTAssertEqual(value(p), expected)
        XCTAssertEqual(value(observed), expected)
    }

    /// A cycle through `race` or `all` outputs nested in each other is found at every
    /// depth up to the documented 64 levels (before, past 8 levels it stayed pending).
    func testCyclesThroughNestedCombinatorsAreFoundDeepDown() {
        for depth in [1, 8, 9, 20, 60] {
            let p = Promise<Int>()
            var inner: Promise<Int> = p
            for _ in 0..<depth { inner = Promise.race([inner]) }
            p.resolve(with: inner)
            assertCycle(p)

            let q = Promise<Int>()
            var nested: Promise<Int> = q
            for _ in 0..<depth { nested = Promise.all([nested, Promise(value: 0)]).map(on: .immediate) { $0[0] } }
            q.resolve(with: nested)
            assertCycle(q)
        }
    }

    /// A cycle through combinators whose inputs share the chain below (`all([next, next])`
    /// at each level, or an input and a child of it): the walk asks each level's question
    /// once, however many inputs lead to it (before, it asked again for each, twice as
    /// many tries per level, so from about seven levels on it ran out of its budget and
    /// the cycle stayed pending).
    func testACycleThroughCombinatorsWhoseInputsShareAChainIsFound() {
        for depth in [7, 12, 40] {
            let p = Promise<Int>()
            var next: Promise<Int> = p
            for _ in 0..<depth { next = Promise.all([next, next]).map(on: .immediate) { $0[0] } }
            p.resolve(with: next)
            XCTAssertEqual(p.state, .rejected, "all, \(depth) levels")
            assertCycle(p)

            let q = Promise<Int>()
            var shared: Promise<Int> = q
            for _ in 0..<depth {
                let level = shared
                shared = Promise.race([level, level.map(on: .immediate) { $0 }])
            }
            q.resolve(with: shared)
            XCTAssertEqual(q.state, .rejected, "race, \(depth) levels")
            assertCycle(q)
        }
    }

    /// A walk that meets a child whose settle is decided but not yet published does not
    /// wait for the publish: the child waits on nothing any more. (It looked at the child
    /// again and again, so a walk on the thread that was between the child's claim and its
    /// publish spun for ever: here, a diagnostics handler, which runs there for a cycle,
    /// locking a promise in against the rules, which say not to.)
    func testAWalkDoesNotWaitForADecidedSettleToBePublished() {
        let parent = Promise<Int>()
        defer { parent.cancel() }
        let child = parent.map(on: .immediate) { $0 }
        let follower = Promise<Int>()
        follower.resolve(with: child)
        let side = Promise<Int>()
        side.whenComplete(on: .immediate) { _ in }
        let events = Recorder<Int>()
        PromiseDiagnostics.setHandler { event in
            guard case .cycle = event.kind else { return }
            events.append(1)
            if events.count == 1 { side.resolve(with: follower) }  // walks follower, then child
        }
        defer { PromiseDiagnostics.setHandler(nil) }
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            child.resolve(with: child)  // claims the cycle's rejection, reports, then publishes
            done.signal()
        }
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success, "the walk waited for the publish on its own thread")
        assertCycle(child)
        assertCycle(side)
    }

    /// An output its holder locked in to follow another promise is no longer its
    /// aggregator's to settle: an input settling later asks nothing, and an input that
    /// follows the output waits on that other promise, no cycle (before, it was rejected
    /// with `cycle`, and so was a promise following an `any` that then fulfilled).
    func testAnOutputItsHolderLockedInIsNoCycleForItsInputs() {
        let a = Promise<Int>(), b = Promise<Int>()
        let all = Promise.all([a, b])
        a.resolve(with: all.map(on: .immediate) { $0[0] })  // no cycle: b may still reject
        let other = Promise<[Int]>()
        all.resolve(with: other)
        b.fulfill(2)  // the input that asks again
        XCTAssertTrue(a.isPending, "a: \(a)")
        other.fulfill([7, 8])
        XCTAssertEqual(value(all), [7, 8])
        XCTAssertEqual(value(a), 7)

        let c = Promise<Int>(), d = Promise<Int>()
        let any = Promise.any([c, d])
        c.resolve(with: any)
        let elsewhere = Promise<Int>()
        any.resolve(with: elsewhere)
        d.reject(PromiseError.validationFailure)
        XCTAssertTrue(c.isPending, "c: \(c)")
        elsewhere.fulfill(9)
        XCTAssertEqual(value(any), 9)
        XCTAssertEqual(value(c), 9)
    }
}

/// A run (`retry`, `sequence`, `all(_:maxConcurrent:)`) waits on its steps, which your code
/// makes after the run started: a step that waits on the promise following the run closes
/// a cycle, seen when the step starts or when the promise locks in, whichever is last.
final class RunCycleTests: XCTestCase {
    private func assertCycle<T>(_ promise: Promise<T>, _ message: String, file: StaticString = #filePath, line: UInt = #line) {
        let e = error(promise, file: file, line: line)
        guard case PromiseError.cycle? = e else {
            return XCTFail("\(message): expected PromiseError.cycle, got \(String(describing: e))", file: file, line: line)
        }
    }

    func testFollowingARetryOverItselfRejects() {
        for context in [.immediate as any ExecutionContext, .default as any ExecutionContext] {
            let promise = Promise<Int>()
            promise.resolve(with: Promise.retry(attempts: 3, on: context) { promise })
            assertCycle(promise, "retry on \(context)")
            let child = Promise<Int>()
            child.resolve(with: Promise.retry(attempts: 3, on: context) { child.map(on: .immediate) { $0 + 1 } })
            assertCycle(child, "retry of a child on \(context)")
        }
    }

    func testFollowingASequenceOrABoundedAllOverItselfRejects() {
        for context in [.immediate as any ExecutionContext, .default as any ExecutionContext] {
            let sequence = Promise<[Int]>()
            sequence.resolve(with: Promise<Int>.sequence(on: context, [1, 2]) { _ in sequence.map(on: .immediate) { $0.count } })
            assertCycle(sequence, "sequence on \(context)")
            // Each step waits on the output, and no other starts before one settles.
            for slots in [1, 2, 3] {
                let all = Promise<[Int]>()
                all.resolve(with: Promise<Int>.all([1, 2], maxConcurrent: slots, on: context) { _ in all.map(on: .immediate) { $0.count } })
                assertCycle(all, "all(_:maxConcurrent: \(slots)) on \(context)")
            }
            // Every step is the promise that locks in to follow the run.
            let follower = Promise<Int>()
            follower.resolve(with: Promise<Int>.all([1, 2], maxConcurrent: 2, on: context) { _ in follower }.map(on: .immediate) { $0[0] })
            assertCycle(follower, "all(_:maxConcurrent: 2) whose steps are its follower, on \(context)")
        }
    }

    /// A run that something else may still settle is no cycle: another step may fail (the
    /// first error settles `all(_:maxConcurrent:)`), a retry's pause is a timer.
    func testARunAnotherStepCanSettleIsNoCycle() {
        let all = Promise<[Int]>()
        let failing = Promise<Int>()
        all.resolve(with: Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { index in
            index == 0 ? all.map(on: .immediate) { $0.count } : failing
        })
        XCTAssertTrue(all.isPending, "rejected while the other step may still fail")
        failing.reject(TestError(4))
        XCTAssertEqual(error(all) as? TestError, TestError(4))

        let retried = Promise<Int>()
        let attempts = Counter()
        retried.resolve(with: Promise.retry(attempts: 2, backoff: .fixed(.milliseconds(1)), on: .immediate) {
            attempts.increment() == 1 ? Promise(error: TestError(5)) : Promise(value: 6)
        })
        XCTAssertEqual(value(retried), 6)
    }
}

extension RunCycleTests {
    /// `all(_:maxConcurrent:)` with more than one slot while a step queued but not started,
    /// or one fulfilled whose slot the run has not freed yet, may be followed by one that
    /// fails and settles the run: no cycle (both were once rejected as cycles).
    func testABoundedAllWithSeveralSlotsIsNoCycleWhileAStepMaySettleIt() {
        // The follower locks in while the steps are queued; they start in turn. Once the
        // step that could settle the run fulfils, only the follower's child is left.
        for (slots, fails) in [(3, true), (2, true), (2, false)] {
            let parked = ParkingContext()
            let queued = Promise<[Int]>(), failing = Promise<Int>()
            let output = Promise<Int>.all([0, 1], maxConcurrent: slots, on: parked) { index in
                index == 0 ? queued.map(on: .immediate) { $0.count } : failing
            }
            queued.resolve(with: output)
            let work = parked.take()
            work[0]()  // the second step is still queued
            XCTAssertTrue(queued.isPending, "\(slots) slots: the second step is queued")
            work[1]()
            XCTAssertTrue(queued.isPending, "\(slots) slots: the second step may still settle the run")
            if fails {
                failing.reject(TestError(7))
                XCTAssertEqual(error(queued) as? TestError, TestError(7), "\(slots) slots")
            } else {
                failing.fulfill(1)
                assertCycle(queued, "\(slots) slots: only the follower's child is left")
            }
        }

        let freeing = Promise<[Int]>(), gate = Promise<Int>()
        let box = Handoff<Promise<[Int]>>(nil)
        gate.whenComplete(on: .immediate) { _ in if let output = box.peek { freeing.resolve(with: output) } }
        let second = Promise<Int>.all([0, 1, 2], maxConcurrent: 2, on: .immediate) { index -> Promise<Int> in
            switch index {
            case 0: return gate
            case 1: return freeing.map(on: .immediate) { $0.count }
            default: return Promise(error: TestError(8))
            }
        }
        box.put(second)
        gate.fulfill(1)  // frees slot 0: the third step rejects the run
        XCTAssertEqual(error(freeing) as? TestError, TestError(8))
    }

    /// A settled run's output keeps nothing of the run: its link for the cycle check goes
    /// when it settles.
    func testASettledRunOutputLetsGoOfItsRun() {
        let retried = Promise.retry(attempts: 2, on: .immediate) { Promise(value: 1) }
        let sequenced = Promise<Int>.sequence(on: .immediate, [1, 2]) { Promise(value: $0) }
        XCTAssertEqual(value(retried), 1)
        XCTAssertEqual(value(sequenced), [1, 2])
        XCTAssertEqual(retried.existingRareState?.runWord.pointee, 0)
        XCTAssertEqual(sequenced.existingRareState?.runWord.pointee, 0)
    }

    /// Steps that wait on the run's output, with nobody locking in to follow it: found as
    /// the last of them starts, or as the last step that could settle the run finishes
    /// without starting another.
    func testABoundedAllWhoseStepsAllWaitOnItsOutputRejects() {
        let queue = heldQueue()
        let box = Handoff<Promise<[Int]>>(nil)
        let output = Promise<Int>.all([1, 2, 3], maxConcurrent: 2, on: queue) { _ in box.peek!.map(on: .immediate) { $0.count } }
        box.put(output)
        queue.resume()
        assertCycle(output, "every step in flight waits on the output")

        let gate = Promise<Int>()
        let later = heldQueue()
        let laterBox = Handoff<Promise<[Int]>>(nil)
        let freed = Promise<Int>.all([0, 1, 2], maxConcurrent: 2, on: later) { index -> Promise<Int> in
            switch index {
            case 0: return gate
            case 1: return laterBox.peek!.map(on: .immediate) { $0.count }
            default: return Promise(value: 7)
            }
        }
        laterBox.put(freed)
        later.resume()
        later.sync {}
        XCTAssertTrue(freed.isPending, "rejected while the gate may still fail")
        gate.fulfill(5)  // the third step starts and fulfils; the second is left alone
        assertCycle(freed, "the steps left wait on the output")
        laterBox.put(nil)
    }

    /// A promise locking in to follow the run on one thread while its steps start on
    /// another: whichever comes last finds the cycle.
    func testALockInRacingTheStepsOfABoundedAllFindsTheCycle() {
        let rounds = 2_000
        final class Row: @unchecked Sendable {
            let follower = Promise<Int>()
            let parked = ParkingContext()
            var output: Promise<[Int]>?
        }
        let rows = (0..<rounds).map { _ -> Row in
            let row = Row()
            row.output = Promise<Int>.all([0, 1], maxConcurrent: 2, on: row.parked) { [follower = row.follower] _ in follower }
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 {
                row.follower.resolve(with: row.output!.map(on: .immediate) { $0[0] })
            } else {
                row.parked.runAll()
            }
        })
        // Both threads are done: the verdict was given on one of them.
        var missed: [Int] = []
        for (round, row) in rows.enumerated() where !isPromiseError(outcome(row.follower, timeout: 1), .cycle) {
            missed.append(round)
            if missed.count == 5 { break }
        }
        XCTAssertEqual(missed, [], "rounds that left the cycle pending or answered otherwise")
    }
}
