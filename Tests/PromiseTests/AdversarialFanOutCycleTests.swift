// Adversarial tests of the cycle check through `all(_:maxConcurrent:)` with more than
// one slot: shapes where a step can still settle the output must never reject with
// `PromiseError.cycle`; shapes where nothing can must reject so within a few seconds.
import Dispatch
import Foundation
@testable import Promise
import XCTest

/// Inputs 0..<count pulled lazily; `beforeYielding(i)` runs on the pulling thread before
/// input `i` is handed to the run (a lazy sequence doing real work, or a test's gate).
private struct HookedInputs: Sequence {
    let count: Int
    let beforeYielding: @Sendable (Int) -> Void
    func makeIterator() -> AnyIterator<Int> {
        var next = 0
        let count = self.count, hook = beforeYielding
        return AnyIterator {
            guard next < count else { return nil }
            hook(next)
            defer { next += 1 }
            return next
        }
    }
}

final class AdversarialFanOutCycleTests: XCTestCase {
    private func isCycle<T>(_ result: Result<T, any Error>?) -> Bool { isPromiseError(result, .cycle) }

    /// Outcomes of many promises, all within one deadline (nil: still pending then).
    private func outcomes<T>(_ promises: [Promise<T>], within seconds: TimeInterval = 5) -> [Result<T, any Error>?] {
        let deadline = Date(timeIntervalSinceNow: seconds)
        return promises.map { outcome($0, timeout: max(0.001, deadline.timeIntervalSinceNow)) }
    }

    private func assertCycle<T>(_ promise: Promise<T>, _ message: String, file: StaticString = #filePath, line: UInt = #line) {
        let result = outcome(promise, timeout: 5)
        XCTAssertTrue(isCycle(result), "\(message): expected .cycle, got \(String(describing: result))", file: file, line: line)
    }

    private func assertError<T>(_ promise: Promise<T>, _ id: Int, _ message: String, file: StaticString = #filePath, line: UInt = #line) {
        let result = outcome(promise, timeout: 5)
        guard case .failure(let error)? = result, error as? TestError == TestError(id) else {
            return XCTFail("\(message): expected TestError(\(id)), got \(String(describing: result))", file: file, line: line)
        }
    }

    // MARK: False positives: a step still to be pulled from the inputs

    /// Slot 1 fulfils; the thread that completed it pulls input 2 (a lazy sequence: a
    /// little work per input). While it pulls, the follower locks in. Input 2's step
    /// fails and settles the output: no cycle. The run offers only step 0 (which waits on
    /// the follower) as complete: `results.count - finished == inFlight.count`, though
    /// the input being pulled is not counted yet.
    func testLockInWhileTheRunPullsTheNextInputIsNoCycle() {
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let follower = Promise<[Int]>()
        let gate = Promise<Int>()
        let inputs = HookedInputs(count: 3) { index in
            guard index == 2 else { return }
            entered.signal()
            _ = release.wait(timeout: .now() + 5)
        }
        let output = Promise<Int>.all(inputs, maxConcurrent: 2, on: .immediate) { index -> Promise<Int> in
            switch index {
            case 0: return follower.map(on: .immediate) { $0.count }
            case 1: return gate
            default: return Promise(error: TestError(9))
            }
        }
        let pulled = DispatchSemaphore(value: 0)
        Thread { gate.fulfill(1); pulled.signal() }.start()  // frees slot 1: input 2 is pulled
        XCTAssertEqual(entered.wait(timeout: .now() + 5), .success)
        follower.resolve(with: output)  // input 2 is still to start, and will fail
        XCTAssertTrue(follower.isPending, "rejected while input 2 was being pulled: \(String(describing: outcome(follower, timeout: 0)))")
        release.signal()
        XCTAssertEqual(pulled.wait(timeout: .now() + 5), .success)
        assertError(follower, 9, "the step of input 2 fails")
    }

    /// No lock-in at all: step 0 waits on the output (watched), slot 1 fulfils and its
    /// thread pulls input 3; slot 2 fulfils on this thread meanwhile, and its look finds
    /// only step 0 in flight. Input 3's step fails: no cycle.
    func testAStepFinishingWhileAnotherThreadPullsIsNoCycle() {
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let parked = ParkingContext()
        let box = Handoff<Promise<[Int]>>(nil)
        let gateA = Promise<Int>(), gateB = Promise<Int>()
        let inputs = HookedInputs(count: 4) { index in
            guard index == 3 else { return }
            entered.signal()
            _ = release.wait(timeout: .now() + 5)
        }
        let output = Promise<Int>.all(inputs, maxConcurrent: 3, on: parked) { index -> Promise<Int> in
            switch index {
            case 0: return box.peek!.map(on: .immediate) { $0.count }
            case 1: return gateA
            case 2: return gateB
            default: return Promise(error: TestError(10))
            }
        }
        box.put(output)
        parked.runAll()
        XCTAssertTrue(output.isPending)
        let pulled = DispatchSemaphore(value: 0)
        Thread { gateA.fulfill(1); pulled.signal() }.start()
        XCTAssertEqual(entered.wait(timeout: .now() + 5), .success)
        gateB.fulfill(2)  // input 3 is still being pulled
        XCTAssertTrue(output.isPending, "rejected while input 3 was being pulled: \(String(describing: outcome(output, timeout: 0)))")
        release.signal()
        XCTAssertEqual(pulled.wait(timeout: .now() + 5), .success)
        parked.runAll()  // input 3's work
        assertError(output, 10, "the step of input 3 fails")
        box.put(nil)
    }

    /// The same race without gates, over 2,000 rounds: the follower locks in while the
    /// way-out step fulfils and the run pulls the failing input. Never a cycle. `work`:
    /// microseconds each input takes to pull (0: an array).
    private func raceLockInAgainstAFreedSlot(pullMicroseconds: Int) -> (cycles: Int, wrong: [String]) {
        let rounds = 2_000
        final class Row: @unchecked Sendable {
            let follower = Promise<[Int]>()
            let gate = Promise<Int>()
            var output: Promise<[Int]>?
        }
        let rows = (0..<rounds).map { _ -> Row in
            let row = Row()
            let inputs = HookedInputs(count: 3) { index in if index == 2 && pullMicroseconds > 0 { busyWork(microseconds: pullMicroseconds) } }
            row.output = Promise<Int>.all(inputs, maxConcurrent: 2, on: .immediate) { [row] index -> Promise<Int> in
                switch index {
                case 0: return row.follower.map(on: .immediate) { $0.count }
                case 1: return row.gate
                default: return Promise(error: TestError(11))
                }
            }
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.follower.resolve(with: row.output!) } else { row.gate.fulfill(1) }
        })
        var cycles = 0
        var wrong: [String] = []
        for result in outcomes(rows.map(\.follower)) {
            if isCycle(result) { cycles += 1; continue }
            guard case .failure(let error)? = result, error as? TestError == TestError(11) else {
                wrong.append(String(describing: result)); continue
            }
        }
        return (cycles, wrong)
    }

    func testALockInRacingAFreedSlotIsNeverACycle() {
        let fast = raceLockInAgainstAFreedSlot(pullMicroseconds: 0)
        XCTAssertEqual(fast.cycles, 0, "array inputs: rounds rejected with .cycle")
        XCTAssertEqual(fast.wrong.count, 0, "\(fast.wrong.prefix(3))")
        let lazy = raceLockInAgainstAFreedSlot(pullMicroseconds: 20)
        XCTAssertEqual(lazy.cycles, 0, "lazy inputs (20 µs a pull): rounds rejected with .cycle")
        XCTAssertEqual(lazy.wrong.count, 0, "\(lazy.wrong.prefix(3))")
    }

    // MARK: Shapes decided from first principles (single thread)

    /// Steps are the follower itself and a pending root: no cycle until the root fulfils.
    func testTheFollowerItselfAndAPendingRoot() {
        for fulfil in [false, true] {
            let follower = Promise<Int>(), root = Promise<Int>()
            follower.resolve(with: Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { $0 == 0 ? follower : root }
                .map(on: .immediate) { $0.reduce(0, +) })
            XCTAssertTrue(follower.isPending, "the root may still fail")
            if fulfil {
                root.fulfill(1)  // the run is exhausted: only the follower is left
                assertCycle(follower, "only the follower is left in flight")
            } else {
                root.reject(TestError(1))
                // The follower is itself a step in flight: the first error cancels it (by
                // design), or it follows the rejection. Either way, no cycle.
                let result = outcome(follower, timeout: 5)
                guard case .failure(let error)? = result, error is CancellationError || error as? TestError == TestError(1) else {
                    return XCTFail("the root's failure: got \(String(describing: result))")
                }
            }
        }
        let both = Promise<Int>()
        both.resolve(with: Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { _ in both }.map(on: .immediate) { $0[0] })
        assertCycle(both, "both steps are the follower")
    }

    /// Three slots, five inputs: a settled step frees its slot at once, later pending roots
    /// keep a way out; the last one decides.
    func testThreeSlotsFiveInputsWithRootsSettledLater() {
        for lastFails in [true, false] {
            let follower = Promise<[Int]>()
            let roots = (0..<3).map { _ in Promise<Int>() }
            let output = Promise<Int>.all(0..<5, maxConcurrent: 3, on: .immediate) { index -> Promise<Int> in
                switch index {
                case 0: return follower.map(on: .immediate) { $0.count }
                case 1: return roots[0]
                case 2: return Promise(value: 2)
                case 3: return roots[1]
                default: return roots[2]
                }
            }
            follower.resolve(with: output)
            XCTAssertTrue(follower.isPending)
            roots[0].fulfill(1)  // frees a slot: input 4 starts
            XCTAssertTrue(follower.isPending, "roots 1 and 2 may still fail")
            roots[1].fulfill(3)
            XCTAssertTrue(follower.isPending, "root 2 may still fail")
            if lastFails {
                roots[2].reject(TestError(2))
                assertError(follower, 2, "the last root fails")
            } else {
                roots[2].fulfill(4)
                assertCycle(follower, "every step left waits on the follower")
            }
        }
    }

    /// More slots than inputs.
    func testMoreSlotsThanInputs() {
        let a = Promise<[Int]>()
        a.resolve(with: Promise<Int>.all([0, 1], maxConcurrent: 4, on: .immediate) { _ in a.map(on: .immediate) { $0.count } })
        assertCycle(a, "both steps wait on the follower")
        let b = Promise<[Int]>()
        b.resolve(with: Promise<Int>.all([0, 1], maxConcurrent: 4, on: .immediate) { $0 == 0 ? b.map(on: .immediate) { $0.count } : Promise(value: 1) })
        assertCycle(b, "the settled step left only the one that waits")
        let c = Promise<[Int]>()
        c.resolve(with: Promise<Int>.all([Int](), maxConcurrent: 4, on: .immediate) { _ in c.map(on: .immediate) { $0.count } })
        XCTAssertEqual(outcome(c, timeout: 5).flatMap { try? $0.get() }, [])
    }

    /// A pending step that does not wait on the output (a child of another root): a way
    /// out until it settles.
    func testAPendingStepThatDoesNotWaitOnTheOutput() {
        for fulfil in [false, true] {
            let follower = Promise<[Int]>(), other = Promise<Int>()
            follower.resolve(with: Promise<Int>.all([0, 1], maxConcurrent: 2, on: .immediate) { index in
                index == 0 ? follower.map(on: .immediate) { $0.count } : other.map(on: .immediate) { $0 + 1 }
            })
            XCTAssertTrue(follower.isPending)
            if fulfil {
                other.fulfill(1)
                assertCycle(follower, "the other step fulfilled")
            } else {
                other.reject(TestError(3))
                assertError(follower, 3, "the other step fails")
            }
        }
    }

    /// Children of the output, no follower: on a parked context, steps started one at a
    /// time, in both orders.
    func testChildrenOfTheOutputOnAParkedContext() {
        for order in [[0, 1], [1, 0]] {
            let parked = ParkingContext()
            let box = Handoff<Promise<[Int]>>(nil)
            let root = Promise<Int>()
            let output = Promise<Int>.all([0, 1, 2], maxConcurrent: 2, on: parked) { index -> Promise<Int> in
                switch index {
                case 0: return box.peek!.map(on: .immediate) { $0.count }
                case 1: return root
                default: return Promise(error: TestError(4))
                }
            }
            box.put(output)
            let work = parked.take()
            XCTAssertEqual(work.count, 2)
            work[order[0]]()
            XCTAssertTrue(output.isPending, "the other slot is still queued")
            work[order[1]]()
            XCTAssertTrue(output.isPending, "the root may still settle")
            root.fulfill(1)  // frees a slot: input 2 is queued
            XCTAssertTrue(output.isPending, "input 2 is queued on the context")
            parked.runAll()
            assertError(output, 4, "input 2 fails")
            box.put(nil)
        }
        // Both slots hold children of the output: input 2 never starts.
        let parked = ParkingContext()
        let box = Handoff<Promise<[Int]>>(nil)
        let output = Promise<Int>.all([0, 1, 2], maxConcurrent: 2, on: parked) { index -> Promise<Int> in
            index < 2 ? box.peek!.map(on: .immediate) { $0.count } : Promise(error: TestError(5))
        }
        box.put(output)
        parked.runAll()
        assertCycle(output, "both slots wait on the output")
        box.put(nil)
    }

    // MARK: Races

    /// One round of a race: a follower, a root, and a run whose step at input 1 is the
    /// root (when `withWayOut`) and every other a child of the follower.
    private final class Row: @unchecked Sendable {
        let follower = Promise<[Int]>()
        let root = Promise<Int>()
        let parked = ParkingContext()
        var output: Promise<[Int]>?
    }

    private func makeRows(_ rounds: Int, inputs: Int, parked: Bool, withWayOut: Bool = true) -> [Row] {
        (0..<rounds).map { _ -> Row in
            let row = Row()
            let context: any ExecutionContext = parked ? row.parked : .immediate
            row.output = Promise<Int>.all(0..<inputs, maxConcurrent: inputs, on: context) { [row] index -> Promise<Int> in
                index == 1 && withWayOut ? row.root : row.follower.map(on: .immediate) { $0.count }
            }
            return row
        }
    }

    /// The lock-in races the steps starting on another thread, with a way out among them:
    /// never a cycle; the way out then decides.
    func testALockInRacingStepStartsWithAWayOutIsNoCycle() {
        let rounds = 2_000
        let rows = makeRows(rounds, inputs: 3, parked: true)
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.follower.resolve(with: row.output!) } else { row.parked.runAll() }
        })
        let early = rows.filter { !$0.follower.isPending }.count
        XCTAssertEqual(early, 0, "settled while the root may still fail")
        for (index, row) in rows.enumerated() {
            if index % 2 == 0 { row.root.reject(TestError(12)) } else { row.root.fulfill(1) }
        }
        var wrong = 0
        for (index, result) in outcomes(rows.map(\.follower)).enumerated() {
            if index % 2 == 0 {
                if case .failure(let e)? = result, e as? TestError == TestError(12) { continue }
            } else if isCycle(result) { continue }
            wrong += 1
        }
        XCTAssertEqual(wrong, 0, "rounds that ended wrong")
    }

    /// The last way out fulfils on one thread while the follower locks in on another:
    /// always a cycle in the end.
    func testALockInRacingTheLastWayOutFindsTheCycle() {
        let rounds = 2_000
        let rows = makeRows(rounds, inputs: 3, parked: false)
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.follower.resolve(with: row.output!) } else { row.root.fulfill(1) }
        })
        let missed = outcomes(rows.map(\.follower)).filter { !isCycle($0) }.count
        XCTAssertEqual(missed, 0, "rounds left pending or ended otherwise")
    }

    /// A cancel of the output races the lock-in: cancelled or a cycle when every step
    /// waits; never a cycle when a root may still settle; never a hang.
    func testACancelOfTheOutputRacingTheLockIn() {
        for withWayOut in [false, true] {
            let rounds = 1_000
            let rows = makeRows(rounds, inputs: 2, parked: false, withWayOut: withWayOut)
            XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
                let row = rows[round]
                if thread == 0 { row.follower.resolve(with: row.output!) } else { row.output!.cancel(reason: TestError(13)) }
            })
            var bad: [String] = []
            for result in outcomes(rows.map(\.follower)) {
                guard let result else { bad.append("pending"); continue }
                if isCycle(result) && !withWayOut { continue }
                if case .failure(let e) = result, e as? TestError == TestError(13) { continue }
                bad.append(String(describing: result))
            }
            XCTAssertEqual(bad.count, 0, "way out: \(withWayOut): \(bad.prefix(3))")
        }
    }

    /// The output fulfilled from outside races the lock-in with a way out in flight: the
    /// follower ends with the value, never a cycle.
    func testAnOutsideFulfilRacingTheLockInWithAWayOut() {
        let rounds = 1_000
        let rows = makeRows(rounds, inputs: 2, parked: false)
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.follower.resolve(with: row.output!) } else { XCTAssertTrue(row.output!.fulfill([42])) }
        })
        let bad = outcomes(rows.map(\.follower)).filter { $0.flatMap { try? $0.get() } != [42] }.count
        XCTAssertEqual(bad, 0)
    }
}
