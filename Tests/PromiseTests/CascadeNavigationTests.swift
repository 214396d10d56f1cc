import Foundation
@testable import Promise
import XCTest

/// A chain that settles inline keeps each step until its cascade ends, for the path a
/// running handler's child looks up through, and frees a step's value early only when
/// nothing but the cascade can reach it. Whatever reaches a step meanwhile finds it
/// whole: its value, its place in the tree, its registry. These guard the "nothing but
/// the cascade": a `weak` or `unowned` reference the library cannot see reaches a step as
/// surely as `parent` does.
final class CascadeNavigationTests: XCTestCase {
    /// A step that a weak reference (a request-coalescing cache, say) still reaches while
    /// the cascade runs gives its value, not freed memory.
    func testAWeakReferenceReadsAStepsValueDuringItsCascade() {
        let root = Promise<Int>()
        let cache = WeakCell<Promise<Cell>>()
        let read = Handoff<Int>(nil)
        let leaf: Promise<Int>
        do {
            let step = root.then(on: .immediate) { Cell($0) }
            cache.value = step
            leaf = step.then(on: .immediate) { $0.number }
                .then(on: .immediate) { number -> Int in
                    if let cached = cache.value, let cell = try? cached.wait() { read.put(cell.number) }
                    return number
                }
        }
        root.fulfill(42)
        XCTAssertEqual(value(leaf), 42)
        XCTAssertEqual(read.peek, 42)
    }

    /// A step whose value the cascade freed early (nothing but the cascade held it when
    /// its child ran) and that a descendant in flight then kept past the cascade, for a
    /// cancel from above: `parent` does not show it (its value is gone), but `root` walks
    /// past it to the root the test holds, and that root's cancel reaches the whole tree.
    func testRootWalksPastAStepWhoseValueWasFreedAndThatOutlivesItsCascade() {
        let root = Promise<String>()
        let queue = heldQueue()
        let sibling = root.then(on: queue) { $0 + "-sibling" }
        let leaf: Promise<String>
        do {
            var step = root
            for letter in ["q", "p", "c", "g"] {
                step = step.then(on: .immediate) { $0 + letter }
            }
            leaf = step.then(on: queue) { $0 + "h" }  // in flight once the cascade reaches it
        }
        root.fulfill("r")
        XCTAssertTrue(leaf.isPending)
        var walked: [String] = []
        var node: AnyPromise = leaf
        while let up = node.parent {
            walked.append(up.description)
            node = up
        }
        XCTAssertFalse(walked.contains { $0.contains("\"rqp\"") }, "a step whose value was freed is shown: \(walked)")
        XCTAssertTrue(leaf.root === root, "root is \(leaf.root)")
        leaf.root.cancel()
        queue.resume()
        settle(leaf)
        settle(sibling)
        XCTAssertTrue(leaf.isCancelled, "the leaf: \(leaf)")
        XCTAssertTrue(sibling.isCancelled, "the root's other branch: \(sibling)")
    }

    /// The same through an `unowned` capture, which the step outlives until the cascade ends.
    func testAnUnownedReferenceReadsAStepsValueDuringItsCascade() {
        let root = Promise<Int>()
        let read = Handoff<String>(nil)
        let leaf: Promise<Int>
        do {
            let step = root.then(on: .immediate) { Cell($0) }
            leaf = step.then(on: .immediate) { $0.number }
                .then(on: .immediate) { [unowned step] number -> Int in
                    read.put("\(step.state) \((try? step.wait())?.number ?? -1)")
                    return number
                }
        }
        root.fulfill(7)
        XCTAssertEqual(value(leaf), 7)
        XCTAssertEqual(read.peek, "fulfilled 7")
    }

    /// The same for the steps of a `flatMap` chain, which the cascade frees once the next
    /// step adopted: a step reached through a `weak` reference, an `unowned` one, or
    /// held by a handler's capture, gives its value while the cascade runs.
    func testReferencesToAFlatMapStepReadItsValueDuringItsCascade() {
        let root = Promise<Int>()
        let cache = WeakCell<Promise<Cell>>()
        let read = Handoff<[String]>(nil)
        let leaf: Promise<Int>
        do {
            let first = root.then(on: .immediate) { Cell($0) }
                .flatMap(on: .immediate) { Promise(value: Cell($0.number + 1)) }
            let weakly = first.flatMap(on: .immediate) { Promise(value: Cell($0.number + 1)) }
            cache.value = weakly
            let unownedly = weakly.flatMap(on: .immediate) { Promise(value: Cell($0.number + 1)) }
            let strongly = unownedly.flatMap(on: .immediate) { Promise(value: Cell($0.number + 1)) }
            leaf = strongly.flatMap(on: .immediate) { Promise(value: Cell($0.number + 1)) }
                .flatMap(on: .immediate) { Promise(value: $0.number) }
                .then(on: .immediate) { [unowned unownedly, strongly] number -> Int in
                    let numbers = [cache.value.flatMap { try? $0.wait() }, try? unownedly.wait(), try? strongly.wait()]
                    read.put(numbers.map { $0.map { "\($0.number)" } ?? "gone" })
                    return number
                }
        }
        root.fulfill(1)
        XCTAssertEqual(value(leaf), 6)
        XCTAssertEqual(read.peek, ["3", "4", "5"])
    }

    /// A root settled inside a handler and held by nobody stays the tree's root while its
    /// cascade runs: `leaf.root` answers it, and its cancel reaches a branch in flight
    /// below it as well as the steps still to run.
    func testARootSettledInsideAHandlerStaysTheRootOfItsCascade() {
        let outer = Promise<Int>()
        let never = Promise<Int>()
        let nested = WeakCell<Promise<Int>>()
        let side = Handoff<Promise<Int>>(nil)
        let leafBox = Handoff<Promise<Int>>(nil)
        let rootWasNested = Handoff<Bool>(nil)
        outer.then(on: .immediate) { _ -> Int in
            let inner = Promise<Int>()
            nested.value = inner
            side.put(inner.then(on: .immediate) { _ in never })  // in flight below `inner`
            var leaf = inner.then(on: .immediate) { $0 + 1 }
            for index in 0..<6 {
                leaf = leaf.then(on: .immediate) { value -> Int in
                    if index == 3, let leaf = leafBox.peek {
                        rootWasNested.put(leaf.root === nested.value)
                        leaf.root.cancel()
                    }
                    return value + 1
                }
            }
            leafBox.put(leaf)
            inner.fulfill(1)
            return 0
        }
        outer.fulfill(0)
        XCTAssertTrue(leafBox.peek?.isCancelled == true)
        XCTAssertEqual(rootWasNested.peek, true)
        XCTAssertTrue(side.peek?.isCancelled == true, "the branch in flight was missed")
    }

    /// A step that a descendant in flight holds after the cascade is still its child's
    /// parent, value and all.
    func testAStepHeldByADescendantInFlightStaysAParent() {
        let root = Promise<Int>()
        let pending = Promise<Int>()
        let first = WeakCell<Promise<[Int]>>()
        let second: Promise<[Int]>
        let third: Promise<Int>
        do {
            let step = root.then(on: .immediate) { [$0] }
            first.value = step
            second = step.then(on: .immediate) { $0 + [2] }
            third = second.then(on: .immediate) { _ in pending }  // follows: in flight
        }
        root.fulfill(1)
        XCTAssertNotNil(first.value, "the path of a promise in flight is held")
        XCTAssertTrue(second.parent === first.value)
        XCTAssertEqual(first.value.flatMap { try? $0.wait() }, [1])
        root.cancel()
        XCTAssertTrue(third.isCancelled, "a cancel of the root reaches the promise in flight")
    }
}

/// A value whose reads would show freed memory (under ASan).
private final class Cell: Sendable {
    let number: Int
    init(_ number: Int) { self.number = number }
}

/// A weak reference a `@Sendable` closure may read.
private final class WeakCell<T: AnyObject>: @unchecked Sendable {
    weak var value: T?
}
