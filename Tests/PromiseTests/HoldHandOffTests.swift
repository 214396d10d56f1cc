// Who holds a parent while an `.immediate` child's handler reads it, and an observed
// promise while an `.immediate` observer waits on the trampoline: a retain of the child's
// own, the reference the frame that ran the parent's handler hands on, or a borrow from
// the caller of the settling call that opened the thread's firing scope. Each test drops
// every other reference on the way, so a hold taken the wrong way frees a promise its
// observer still reads (AddressSanitizer reports it; without it the value read is wrong),
// and every promise must be freed once done, so a hold never ended shows as a leak.
import Dispatch
import Foundation
import Promise
import XCTest

final class HoldHandOffTests: XCTestCase {

    /// Holds the only reference to a promise until code takes it out.
    private final class Holder: @unchecked Sendable {
        private let lock = NSLock()
        private var promise: Promise<Int>?
        init(_ promise: Promise<Int>) { self.promise = promise }
        func peek() -> Promise<Int> { lock.lock(); defer { lock.unlock() }; return promise! }
        func drop() { lock.lock(); defer { lock.unlock() }; promise = nil }
    }

    /// A step with several `.immediate` children and a queued one: the first inline child
    /// takes over the reference its frame held, the others and the queued one retain; each
    /// reads the step's value, and all of it is freed.
    func testEveryChildOfAStepReadsItsValueWhoeverHoldsIt() {
        let queue = DispatchQueue(label: "PromiseTests.hand-off")
        let seen = Recorder<String>()
        weak var weakStep: Promise<Int>?
        weak var weakLast: Promise<Int>?
        do {
            let root = Promise<Int>()
            let step = root.then(on: .immediate) { $0 * 10 }
            weakStep = step
            for name in ["a", "b", "c"] {
                step.then(on: .immediate) { v in seen.append("\(name)\(v)") }
            }
            step.then(on: queue) { v in seen.append("q\(v)") }
            let last = step.then(on: .immediate) { $0 + 1 }
            weakLast = last
            last.whenComplete(on: .immediate) { result in
                if case .success(let v) = result { seen.append("last\(v)") }
            }
            root.fulfill(4)
        }
        queue.sync {}
        XCTAssertEqual(Set(seen.values), ["a40", "b40", "c40", "q40", "last41"])
        XCTAssertEqual(Array(seen.values.filter { $0 != "q40" }), ["a40", "b40", "c40", "last41"],
                       "inline children run in registration order")
        XCTAssertTrue(eventually { weakStep == nil && weakLast == nil }, "a hold was never ended")
    }

    /// A promise settled inside another promise's handler (so its settling call opens no
    /// scope) and dropped right after: its first observer, a later `.immediate` observer
    /// and an `.immediate` child run after that call returned, and must hold it themselves.
    func testAPromiseSettledAndDroppedInsideAHandlerStillFeedsItsObservers() {
        let seen = Recorder<String>()
        let weakInner = WeakBox(nil)
        let outer = Promise<Int>()
        outer.whenComplete(on: .immediate) { _ in
            let inner = Promise<Int>()
            weakInner.object = inner
            inner.whenComplete(on: .immediate) { result in
                if case .success(let v) = result { seen.append("first\(v)") }
            }
            inner.whenComplete(on: .immediate) { result in
                if case .success(let v) = result { seen.append("second\(v)") }
            }
            inner.then(on: .immediate) { v in seen.append("child\(v)") }
            inner.fulfill(7)
            // `inner` goes here: its observers have not run yet (they wait on the trampoline).
        }
        outer.fulfill(0)
        XCTAssertEqual(seen.values, ["first7", "second7", "child7"])
        XCTAssertNil(weakInner.object)
    }

    /// `then` on a settled promise inside a handler, the promise dropped right after.
    func testThenOnASettledPromiseInsideAHandlerHoldsIt() {
        let seen = Recorder<Int>()
        let weakSettled = WeakBox(nil)
        let outer = Promise<Int>()
        outer.whenComplete(on: .immediate) { _ in
            let settled = Promise(value: 5)
            weakSettled.object = settled
            settled.then(on: .immediate) { seen.append($0) }
        }
        outer.fulfill(0)
        XCTAssertEqual(seen.values, [5])
        XCTAssertNil(weakSettled.object)
    }

    /// A root settled from outside any firing lends itself to its `.immediate` children
    /// and observers (its settling call's caller holds it till their work is done), even
    /// when code inside the cascade drops every other reference to it: a later step
    /// still finds the root's cancel, and everything is freed once the call returns.
    func testABorrowedRootOutlivesItsCascadeAndPassesItsCancelOn() {
        weak var weakRoot: Promise<Int>?
        weak var weakLeaf: Promise<Int>?
        let seen = Recorder<Int>()
        let holder = Holder(Promise<Int>())
        do {
            let root = holder.peek()
            weakRoot = root
            root.whenComplete(on: .immediate) { result in
                if case .success(let v) = result { seen.append(v) }
            }
            let first = root.then(on: .immediate) { v -> Int in
                holder.peek().cancel()  // the root is settled: its cancel goes to descendants
                holder.drop()           // and the holder's reference goes
                return v + 1
            }
            let leaf = first.then(on: .immediate) { $0 + 1 }
            weakLeaf = leaf
            leaf.whenComplete(on: .immediate) { result in
                if case .failure(let error) = result, error is CancellationError { seen.append(-1) }
            }
        }
        holder.peek().fulfill(1)
        XCTAssertEqual(seen.values, [1, -1], "the first observer saw 1, the leaf was cancelled")
        XCTAssertNil(weakRoot)
        XCTAssertNil(weakLeaf)
    }

    /// A root dropped pending: its `.immediate` observers and children move to a broken
    /// stand-in, which opens the firing scope and lends itself to them.
    func testObserversMovedToABrokenStandInReadItsError() {
        for _ in 0..<200 {
            let seen = Recorder<String>()
            weak var weakChild: Promise<Int>?
            do {
                var root: Promise<Int>? = Promise<Int>()
                root!.whenComplete(on: .immediate) { r in
                    if case .failure(PromiseError.brokenPromise) = r { seen.append("first") }
                }
                root!.whenComplete(on: .immediate) { r in
                    if case .failure(PromiseError.brokenPromise) = r { seen.append("box") }
                }
                let child = root!.then(on: .immediate) { $0 + 1 }.recover(on: .immediate) { _ in 42 }
                weakChild = child
                child.then(on: .immediate) { v in seen.append("child\(v)") }
                root = nil
            }
            XCTAssertEqual(seen.values, ["first", "box", "child42"])
            XCTAssertNil(weakChild)
        }
    }

    /// `whenComplete` on a settled promise opens the scope itself: its body chains
    /// `.immediate` children on that promise after dropping every other reference to it.
    func testAnInlineObservationLendsThePromiseItObserves() {
        let seen = Recorder<Int>()
        for i in 0..<200 {
            let holder = Holder(Promise(value: i))
            holder.peek().whenComplete(on: .immediate) { _ in
                let p = holder.peek()
                holder.drop()
                p.then(on: .immediate) { $0 * 2 }.then(on: .immediate) { seen.append($0) }
            }
        }
        XCTAssertEqual(seen.values, (0..<200).map { $0 * 2 })
    }

    /// A cancel from outside opens the scope: the cancelled root lends itself to the
    /// children it cancels, whose error sides still run (for clean-up).
    func testACancelLendsThePromiseItCancels() {
        let seen = Recorder<String>()
        for _ in 0..<200 {
            let holder = Holder(Promise<Int>())
            let leaf = holder.peek().then(on: .immediate) { $0 }
                .recover(on: .immediate) { error in seen.append(error is CancellationError ? "clean-up" : "?"); return 7 }
                .then(on: .immediate) { $0 + 1 }
            leaf.whenComplete(on: .immediate) { r in
                if case .failure(let error) = r, error is CancellationError { seen.append("cancelled") }
            }
            let root = holder.peek()
            holder.drop()
            root.cancel()
        }
        XCTAssertEqual(seen.values, Array(repeating: ["clean-up", "cancelled"], count: 200).flatMap { $0 })
    }
}
