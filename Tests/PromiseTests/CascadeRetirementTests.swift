import Foundation
@testable import Promise
import XCTest

/// A chain that settles inline (`.immediate` handlers run one after another by one settling
/// call) keeps each step until the cascade ends, for the path a cancel takes to the steps
/// below; but the value of a step nobody holds goes as soon as the next step has run.
final class CascadeRetirementTests: XCTestCase {
    /// A chain built in advance, 2,000 steps of large values, settled by one `fulfill`:
    /// at every step at most the values of the steps around it are alive, not every
    /// value above it.
    func testAnInlineChainLetsGoOfEachValueOnceTheNextStepRan() {
        let tracker = LifeTracker()
        let peak = LargestSeen()
        let root = Promise<Payload>()
        var leaf = root
        for index in 0..<2_000 {
            leaf = leaf.then(on: .immediate) { previous -> Payload in
                peak.record(tracker.alive)
                return Payload(bytes: [UInt8(truncatingIfNeeded: index), previous.bytes[0]], tracker: tracker)
            }
        }
        root.fulfill(Payload(bytes: [7], tracker: tracker))
        XCTAssertEqual(value(leaf)?.bytes[0], UInt8(truncatingIfNeeded: 1_999))
        XCTAssertLessThanOrEqual(peak.largest, 3, "the cascade keeps every value until it ends")
        XCTAssertEqual(tracker.alive, 2, "the root's and the leaf's, which the test holds")
    }

    /// The same chain of boxed values (too large for the inline payload).
    func testAnInlineChainOfBoxedValuesLetsGoOfThemToo() {
        struct Large: Sendable {
            let payload: Payload
            let padding: (Int, Int, Int) = (0, 0, 0)
        }
        let tracker = LifeTracker()
        let peak = LargestSeen()
        let root = Promise<Int>()
        var leaf = root.then(on: .immediate) { Large(payload: Payload(bytes: [UInt8($0)], tracker: tracker)) }
        for _ in 0..<1_000 {
            leaf = leaf.then(on: .immediate) { previous -> Large in
                peak.record(tracker.alive)
                return Large(payload: Payload(bytes: previous.payload.bytes, tracker: tracker))
            }
        }
        root.fulfill(5)
        XCTAssertEqual(value(leaf)?.payload.bytes, [5])
        XCTAssertLessThanOrEqual(peak.largest, 3, "the cascade keeps every boxed value until it ends")
        XCTAssertEqual(tracker.alive, 1, "the leaf's, which the test holds")
    }

    /// A step that someone holds keeps its value: only a step nobody else can reach lets go.
    func testAHeldStepKeepsItsValue() {
        let tracker = LifeTracker()
        let root = Promise<Int>()
        let held = root.then(on: .immediate) { Payload(bytes: [UInt8($0)], tracker: tracker) }
        var leaf = held.then(on: .immediate) { Payload(bytes: $0.bytes + [1], tracker: tracker) }
        for _ in 0..<10 { leaf = leaf.then(on: .immediate) { Payload(bytes: $0.bytes + [1], tracker: tracker) } }
        root.fulfill(9)
        XCTAssertEqual(value(held)?.bytes, [9], "a held step lost its value")
        XCTAssertEqual(value(leaf)?.bytes.count, 12)
        XCTAssertEqual(tracker.alive, 2)
        // A sibling registered later still reads it.
        XCTAssertEqual(value(held.then(on: .immediate) { $0.bytes.count }), 1)
    }

    /// While the cascade runs, `root` passes the steps whose values went and answers the
    /// root the caller holds, so `root.cancel()` still reaches the steps below; `parent`
    /// of a step whose parent's value went answers nil, as for a parent that is gone.
    func testRootPassesRetiredStepsAndItsCancelReachesTheStepsBelow() {
        let tracker = LifeTracker()
        let root = Promise<Int>()
        let ran = Counter()
        let seen = Handoff<(parentIsNil: Bool, rootIsRoot: Bool)>(nil)
        let leafBox = Handoff<Promise<Payload>>(nil)
        var leaf = root.then(on: .immediate) { Payload(bytes: [UInt8($0)], tracker: tracker) }
        for index in 1...100 {
            leaf = leaf.then(on: .immediate) { previous -> Payload in
                ran.increment()
                if index == 50, let leaf = leafBox.peek {
                    // Walk up from the leaf, which is still pending below this step.
                    var step: AnyPromise = leaf
                    while let up = step.parent, !up.isFulfilled { step = up }
                    // `step` is this handler's own promise. Its parent, step 49, whose
                    // value this handler reads, is there; step 48 let go of its value
                    // when step 49 ran.
                    XCTAssertEqual(step.parent?.fulfilledValue(as: Payload.self)?.bytes, [1])
                    seen.put((step.parent?.parent == nil, leaf.root === root))
                    leaf.root.cancel()
                }
                return Payload(bytes: previous.bytes, tracker: tracker)
            }
        }
        leafBox.put(leaf)
        root.fulfill(1)
        XCTAssertEqual(seen.peek?.parentIsNil, true, "a retired step answered as a parent")
        XCTAssertEqual(seen.peek?.rootIsRoot, true, "root stopped below the held root")
        XCTAssertEqual(ran.value, 50, "steps ran after the root was cancelled")
        XCTAssertTrue(leaf.isCancelled)
        XCTAssertEqual(tracker.alive, 0)
    }
}

/// The largest value recorded, from any thread.
private final class LargestSeen: @unchecked Sendable {
    private let lock = NSLock()
    private var value = 0

    func record(_ candidate: Int) { lock.withLock { value = max(value, candidate) } }
    var largest: Int { lock.withLock { value } }
}

extension CascadeRetirementTests {
    /// A chain of `timeout` steps settles inline too (the receiver's waiter list settles
    /// the timeout child, whose `.immediate` child runs next): each receiver's value goes
    /// once its timeout child took it.
    func testAChainThroughTimeoutsLetsGoOfEachReceiversValue() {
        let tracker = LifeTracker()
        let peak = LargestSeen()
        let root = Promise<Int>()
        var leaf = root.then(on: .immediate) { Payload(bytes: [UInt8($0)], tracker: tracker) }
        for _ in 0..<500 {
            leaf = leaf.timeout(.seconds(600)).then(on: .immediate) { previous -> Payload in
                peak.record(tracker.alive)
                return Payload(bytes: previous.bytes, tracker: tracker)
            }
        }
        root.fulfill(4)
        XCTAssertEqual(value(leaf)?.bytes, [4])
        XCTAssertLessThanOrEqual(peak.largest, 4, "the cascade keeps every receiver's value until it ends")
        XCTAssertEqual(tracker.alive, 1, "the leaf's, which the test holds")
    }
}
