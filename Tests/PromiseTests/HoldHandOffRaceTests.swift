// Races over who holds what while `.immediate` work waits on the per-thread trampoline:
// an `.immediate` child's hold on its parent (its own retain, the reference handed on by
// the frame that ran the parent's handler, or a borrow from the caller of the settling
// call that opened the thread's outermost firing scope), and the same borrow for
// `.immediate` observers. Settles, cancels, registrations, `resolve(with:)` and the last
// holder letting go race on several threads. Every test drops every reference it can,
// carries values that count their own instances (`HOValue`), and checks that every
// promise and every value is gone at the end. Rounds are bounded; `PROMISE_HANDOFF_ROUNDS`
// multiplies them for longer runs.
import Dispatch
import Foundation
import Promise
import XCTest

// MARK: Helpers (prefixed HO, to stay out of the other files' way; the instance counter
// and the counted error are AdversarialHoldTests')

/// A counted reference value: a leak keeps the count up, an over-release crashes or
/// drives it below zero.
private final class HOValue: @unchecked Sendable, CustomStringConvertible {
    let id: Int
    init(_ id: Int) { self.id = id; LiveCount.shared.up() }
    deinit { LiveCount.shared.down() }
    var description: String { "HOValue(\(id))" }
}

/// A counted value larger than three words (stored boxed).
private struct HOBig: Sendable {
    var ref: HOValue
    var a = 1, b = 2, c = 3, d = 4
}

/// A lock-protected optional slot that closures can fill, read and empty.
private final class HOSlot<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T?
    init(_ value: T? = nil) { self.value = value }
    func set(_ newValue: T?) { lock.lock(); value = newValue; lock.unlock() }
    func peek() -> T? { lock.lock(); defer { lock.unlock() }; return value }
    func take() -> T? { lock.lock(); defer { value = nil; lock.unlock() }; return value }
}

/// Weak references to many promises.
private final class HOWeakSet: @unchecked Sendable {
    private let lock = NSLock()
    private var boxes: [(String, WeakBox)] = []
    func add(_ name: String, _ object: AnyObject) {
        lock.lock(); boxes.append((name, WeakBox(object))); lock.unlock()
    }
    var alive: [String] {
        lock.lock(); defer { lock.unlock() }
        return boxes.filter { $0.1.object != nil }.map(\.0)
    }
}

final class HoldHandOffRaceTests: XCTestCase {
    override func setUp() {
        super.setUp()
        _ = eventually(timeout: 5) { LiveCount.shared.value == 0 }
        XCTAssertEqual(LiveCount.shared.value, 0, "leftovers from an earlier test")
    }

    private func assertAllFreed(_ weaks: HOWeakSet, _ message: String = "",
                                file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertTrue(eventually { weaks.alive.isEmpty && LiveCount.shared.value == 0 },
                      "still alive: promises \(weaks.alive.prefix(20)), values \(LiveCount.shared.value) \(message)",
                      file: file, line: line)
    }

    /// Fulfils `root` with `HOValue(value)` from outside any firing (its settling call
    /// lends it to its `.immediate` children), or inside another promise's handler (a
    /// nested scope: they retain it).
    private static func fulfill(_ root: Promise<HOValue>, with value: Int, insideScope: Bool) {
        guard insideScope else {
            root.fulfill(HOValue(value))
            return
        }
        let outer = Promise<Int>()
        outer.whenComplete(on: .immediate) { _ in root.fulfill(HOValue(value)) }
        outer.fulfill(0)
    }

    /// Records in `bad` an outcome other than `HOValue(value)` or `CountedError(error)`.
    private static func expect(_ result: Result<HOValue, any Error>, value: Int, error: Int, _ label: String,
                               into bad: Recorder<String>) {
        switch result {
        case .success(let v): if v.id != value { bad.append("\(label) value \(v.id)") }
        case .failure(let e): if (e as? CountedError)?.id != error { bad.append("\(label) error \(e)") }
        }
    }

    /// Rounds multiplier: `PROMISE_HANDOFF_ROUNDS` (default 1).
    private var roundScale: Int {
        max(1, Int(ProcessInfo.processInfo.environment["PROMISE_HANDOFF_ROUNDS"] ?? "") ?? 1)
    }

    // MARK: Settles, cancels and registrations

    /// A root fulfilled on one thread (at depth 0, or inside a scope), cancelled on
    /// another in some rounds, while other threads register `.immediate` children and
    /// observers on it and drop them. Every handler runs at most once, every observer
    /// exactly once, values are right, and all is freed.
    func testConcurrentSettleCancelAndRegistration() {
        let rounds = 300 * roundScale
        for round in 0..<rounds {
            let weaks = HOWeakSet()
            let observed = Counter()
            let handlerRuns = Counter()
            let bad = Recorder<String>()
            let expected = 6 * 3
            let cancelThisRound = round % 3 == 0
            let insideScope = round % 2 == 0
            let slot = HOSlot(Promise<HOValue>())
            weaks.add("root", slot.peek()!)
            DispatchQueue.concurrentPerform(iterations: 8) { i in
                switch i {
                case 0:
                    Self.fulfill(slot.peek()!, with: round, insideScope: insideScope)
                case 1:
                    if cancelThisRound { slot.peek()!.cancel(reason: CountedError(round)) }
                default:
                    let root = slot.peek()!
                    let c = root.then(on: .immediate) { v -> HOValue in
                        handlerRuns.increment()
                        if v.id != round { bad.append("value \(v.id)") }
                        return HOValue(v.id + 1)
                    }
                    weaks.add("c\(i)", c)
                    c.whenComplete(on: .immediate) { r in
                        observed.increment()
                        Self.expect(r, value: round + 1, error: round, "child", into: bad)
                    }
                    root.whenComplete(on: .immediate) { r in
                        observed.increment()
                        Self.expect(r, value: round, error: round, "root", into: bad)
                    }
                    c.then(on: .immediate) { v -> Int in
                        handlerRuns.increment()
                        return v.id
                    }.whenComplete(on: .immediate) { _ in observed.increment() }
                }
            }
            XCTAssertEqual(observed.value, expected, "round \(round)")
            XCTAssertLessThanOrEqual(handlerRuns.value, 12, "round \(round)")
            XCTAssertEqual(bad.values, [], "round \(round)")
            if !cancelThisRound { XCTAssertEqual(handlerRuns.value, 12, "round \(round)") }
            _ = slot.take()
            assertAllFreed(weaks, "round \(round)")
            if !weaks.alive.isEmpty || !bad.values.isEmpty { break }
        }
    }

    /// A chain of `.immediate` steps settling on one thread while another thread cancels
    /// a middle step (or the root): along the chain, once a step ends cancelled every step
    /// below does too (a descendant decided before the cancel keeps its value; every
    /// later one is cancelled), and nothing leaks.
    func testCancelRacingInlineCascadeIsMonotone() {
        let length = 40
        for round in 0..<(200 * roundScale) {
            let weaks = HOWeakSet()
            var message = ""
            do {
                var steps: [Promise<HOValue>] = []
                let root = Promise<HOValue>()
                weaks.add("root", root)
                var last = root
                for i in 0..<length {
                    last = last.then(on: .immediate) { HOValue($0.id + 1) }
                    weaks.add("s\(i)", last)
                    steps.append(last)
                }
                let targetIndex = round % 4 == 0 ? -1 : length / 2
                let target: Promise<HOValue> = targetIndex < 0 ? root : steps[targetIndex]
                DispatchQueue.concurrentPerform(iterations: 2) { i in
                    if i == 0 { root.fulfill(HOValue(0)) } else { target.cancel(reason: CountedError(7)) }
                }
                var sawCancel = false
                for (i, step) in steps.enumerated() {
                    switch step.state {
                    case .fulfilled:
                        if sawCancel { message += " s\(i) fulfilled below a cancelled step" }
                        if (try? step.wait().id) != i + 1 { message += " s\(i) value" }
                    case .cancelled:
                        sawCancel = true
                        if i < targetIndex { message += " s\(i) above the target cancelled" }
                    default:
                        message += " s\(i) \(step.state)"
                    }
                }
            }
            XCTAssertEqual(message, "", "round \(round)")
            assertAllFreed(weaks, "round \(round)")
            if !message.isEmpty || !weaks.alive.isEmpty { break }
        }
    }

    /// Threads that each fulfil their own root (depth 0) while a shared step's queued
    /// children and `.immediate` grandchildren hop between threads; roots and steps are
    /// dropped by whichever thread is last.
    func testManyThreadsSettlingChainsThatMeet() {
        for round in 0..<(100 * roundScale) {
            let weaks = HOWeakSet()
            let done = Countdown(8)
            let queue = DispatchQueue(label: "ho.meet", attributes: .concurrent)
            let results = Recorder<Int>()
            do {
            let shared = Promise<HOValue>()
            weaks.add("shared", shared)
            for i in 0..<8 {
                let mine = Promise<HOValue>()
                weaks.add("mine\(i)", mine)
                // Each chain waits on its own root and on the shared one.
                let both = mine.flatMap(on: .immediate) { m in
                    shared.then(on: .immediate) { s in HOValue(m.id + s.id) }
                }
                weaks.add("both\(i)", both)
                both.then(on: queue) { v in HOValue(v.id * 2) }
                    .then(on: .immediate) { v in results.append(v.id) }
                    .whenComplete(on: .immediate) { _ in done.countDown() }
                queue.async { mine.fulfill(HOValue(i)) }
            }
            queue.async { shared.fulfill(HOValue(100)) }
            }
            XCTAssertTrue(done.wait(), "round \(round)")
            XCTAssertEqual(Set(results.values), Set((0..<8).map { ($0 + 100) * 2 }), "round \(round)")
            queue.sync(flags: .barrier) {}
            assertAllFreed(weaks, "round \(round)")
        }
    }

    // MARK: Followers and settled promises

    /// One thread settles a root (at depth 0, or inside a scope); others hang short inline
    /// chains with observers on it and drop them at once, publishing a middle step in a
    /// shared slot that another thread cancels; `resolve(with:)` followers of the root are
    /// cancelled and locked in concurrently. Every observer runs exactly once, with a
    /// value or error consistent with its promise, and everything is freed.
    func testRegistrationsCancelsAndFollowersRacingASettle() {
        for round in 0..<(200 * roundScale) {
            let weaks = HOWeakSet()
            let observed = Counter()
            let bad = Recorder<String>()
            let middle = HOSlot<Promise<HOValue>>()
            let follower = HOSlot(Promise<HOValue>())
            weaks.add("follower", follower.peek()!)
            follower.peek()!.whenComplete(on: .immediate) { r in
                observed.increment()
                Self.expect(r, value: round, error: -round - 1, "follower", into: bad)
            }
            follower.peek()!.then(on: .immediate) { v in HOValue(v.id) }.whenComplete(on: .immediate) { _ in observed.increment() }
            let slot = HOSlot(Promise<HOValue>())
            weaks.add("root", slot.peek()!)
            let insideScope = round % 2 == 1
            DispatchQueue.concurrentPerform(iterations: 6) { i in
                switch i {
                case 0:
                    Self.fulfill(slot.peek()!, with: round, insideScope: insideScope)
                case 1:
                    // Cancels whatever middle step is published, a few times.
                    for _ in 0..<3 { middle.take()?.cancel(reason: CountedError(round)) }
                case 2:
                    let f = follower.take()!
                    f.resolve(with: slot.peek()!)
                    if round % 3 == 0 { f.cancel(reason: CountedError(-round - 1)) }
                default:
                    let root = slot.peek()!
                    for k in 0..<3 {
                        let a = root.then(on: .immediate) { v -> HOValue in
                            if v.id != round { bad.append("a value \(v.id)") }
                            return HOValue(v.id + 1)
                        }
                        if k == 1 { middle.set(a) }
                        let b = a.then(on: .immediate) { HOValue($0.id + 1) }
                        weaks.add("b\(i).\(k)", b)
                        b.whenComplete(on: .immediate) { r in
                            observed.increment()
                            Self.expect(r, value: round + 2, error: round, "b", into: bad)
                        }
                        a.whenComplete(on: .immediate) { _ in observed.increment() }
                    }
                }
            }
            // The follower's observers may run on the thread that settles the root.
            XCTAssertTrue(eventually { observed.value == 2 + 3 * 3 * 2 }, "round \(round): \(observed.value)")
            XCTAssertEqual(bad.values, [], "round \(round)")
            _ = slot.take()
            _ = middle.take()
            assertAllFreed(weaks, "round \(round)")
            if !bad.values.isEmpty || !weaks.alive.isEmpty { break }
        }
    }

    /// Several threads register on the same settled promise at once (each registration
    /// opens its own thread's scope and lends the promise) and drop everything; the
    /// promise's last holder lets go while they run.
    func testConcurrentRegistrationsOnASettledPromise() {
        for round in 0..<(200 * roundScale) {
            let weaks = HOWeakSet()
            let sum = Counter()
            let participants = Counter()
            let slot = HOSlot(Promise(value: HOBig(ref: HOValue(round))))
            weaks.add("settled", slot.peek()!)
            DispatchQueue.concurrentPerform(iterations: 4) { i in
                // A thread that comes after the last holder let go has nothing to observe.
                guard let p = i == 3 ? slot.take() : slot.peek() else { return }
                participants.increment()
                for _ in 0..<5 {
                    p.then(on: .immediate) { v in HOValue(v.ref.id) }
                        .then(on: .immediate) { v in if v.id == round { sum.increment() } }
                    p.whenComplete(on: .immediate) { r in
                        if case .success(let v) = r, v.ref.id == round { sum.increment() }
                        p.then(on: .immediate) { v in if v.ref.id == round { sum.increment() } }
                    }
                }
            }
            XCTAssertEqual(sum.value, participants.value * 5 * 3, "round \(round)")
            _ = slot.take()
            assertAllFreed(weaks, "round \(round)")
            if sum.value != participants.value * 15 || !weaks.alive.isEmpty { break }
        }
    }
}
