import Dispatch
import Foundation
import XCTest
@testable import Promise

/// The library's Dispatch timer heap: every timer not cancelled runs once, never before its
/// deadline; a cancelled one never runs and leaves the heap at once, with its work; the
/// heap's queue never waits on itself, whatever a work does or frees.
final class TimerHeapTests: XCTestCase {
    private var heap: TimerHeap { TimerHeap.shared }

    /// A random mix of deadlines (some equal, some past) with a random half cancelled: a
    /// heap that took the wrong entry off (a cancel, or a fire) runs a cancelled timer,
    /// loses a live one, or runs one early.
    func testEveryTimerNotCancelledRunsOnceAndNoneEarly() {
        var random = SplitMix64(seed: DispatchTime.now().uptimeNanoseconds)
        let count = 2_000
        let runs = (0..<count).map { _ in Counter() }
        let early = Counter()
        let done = Countdown(count)  // one per timer: its run, or the cancel that stopped it
        var entries: [TimerHeap.Entry] = []
        var stopped = Set<Int>()
        for i in 0..<count {
            let delay = UInt64.random(in: 0...40, using: &random) * 1_000_000
            let deadline = DispatchTime(uptimeNanoseconds: DispatchTime.now().uptimeNanoseconds + delay)
            entries.append(heap.schedule(at: deadline) {
                if DispatchTime.now() < deadline { early.increment() }
                runs[i].increment()
                done.countDown()
            })
        }
        for i in 0..<count where Bool.random(using: &random) {
            // A cancel that comes after its timer fired changes nothing: that one runs.
            if heap.cancel(entries[i]) {
                stopped.insert(i)
                done.countDown()
            }
        }
        XCTAssertTrue(done.wait(), "a timer not cancelled never ran")
        XCTAssertEqual(done.overshoot, 0, "a timer ran twice, or a cancelled one ran")
        for i in 0..<count {
            XCTAssertEqual(runs[i].value, stopped.contains(i) ? 0 : 1, "timer \(i)")
        }
        XCTAssertEqual(early.value, 0, "a timer ran before its deadline")
    }

    /// Works due at once, cancelled by other threads as they fire: each runs, or its
    /// cancel stops it, never both, never twice; and the heap ends without them.
    func testCancelsRacingTheirDeadlinesRunEachWorkAtMostOnce() {
        let count = 5_000
        let start = heap.count
        let done = Countdown(count)
        let stopped = Counter()
        let entries = (0..<count).map { _ in heap.schedule(at: .now()) { done.countDown() } }
        DispatchQueue.concurrentPerform(iterations: 4) { part in
            for i in stride(from: part, to: count, by: 4) where TimerHeap.shared.cancel(entries[i]) {
                stopped.increment()
                done.countDown()
            }
        }
        for entry in entries {
            XCTAssertFalse(heap.cancel(entry), "a second cancel took an entry off the heap")
        }
        XCTAssertEqual(heap.count, start)
        XCTAssertTrue(done.wait(), "a timer neither ran nor was stopped")
        XCTAssertEqual(done.overshoot, 0, "a work ran twice, or after its cancel won")
    }

    /// A cancel takes the entry off the heap and releases what its work captured at once,
    /// an hour before its deadline.
    func testCancelLetsGoOfTheWorkAtOnce() {
        final class Captured: Sendable {}
        weak var weakCaptured: Captured?
        let start = heap.count
        let entry: TimerHeap.Entry
        do {
            let captured = Captured()
            weakCaptured = captured
            entry = heap.schedule(at: .now() + .seconds(3_600)) { _ = captured }
        }
        XCTAssertEqual(heap.count, start + 1)
        XCTAssertNotNil(weakCaptured)
        heap.cancel(entry)
        XCTAssertEqual(heap.count, start)
        XCTAssertNil(weakCaptured, "a cancelled timer kept its work")
    }

    /// Freeing a cancelled work may run code that sets and cancels timers (a promise it
    /// held is freed, its last observers run): the release happens outside the heap's
    /// critical section, or this would wait on itself for ever.
    func testAWorkFreedByItsCancelMaySetAndCancelTimers() {
        final class SetsTimersWhenFreed: @unchecked Sendable {
            let done = Flag()
            deinit {
                let other = TimerHeap.shared.schedule(at: .now() + .seconds(3_600)) {}
                TimerHeap.shared.cancel(other)
                done.set()
            }
        }
        let finished = DispatchSemaphore(value: 0)
        let done: Flag
        do {
            let freedLater = SetsTimersWhenFreed()
            done = freedLater.done
            let entry = heap.schedule(at: .now() + .seconds(3_600)) { _ = freedLater }
            Thread.detachNewThread { [entry] in
                TimerHeap.shared.cancel(entry)
                finished.signal()
            }
        }
        XCTAssertEqual(finished.wait(timeout: .now() + 10), .success, "the cancel never returned: the heap waited on itself")
        XCTAssertTrue(done.isSet)
    }

    /// A work that runs sets and cancels timers of its own, as `retry` does from a pause.
    func testAWorkThatRunsMaySetAndCancelTimers() {
        let ran = Countdown(1)
        _ = heap.schedule(at: .now()) {
            let other = TimerHeap.shared.schedule(at: .now() + .seconds(3_600)) {}
            TimerHeap.shared.cancel(other)
            _ = TimerHeap.shared.schedule(at: .now()) { ran.countDown() }
        }
        XCTAssertTrue(ran.wait(), "a timer set by a timer's work never ran")
    }

    /// After a burst of timers, all cancelled, the heap's array gives its peak back.
    func testTheHeapShrinksAfterABurst() {
        let burst = (0..<20_000).map { _ in heap.schedule(at: .now() + .seconds(3_600)) {} }
        XCTAssertGreaterThanOrEqual(heap.capacity, 20_000)
        for entry in burst { heap.cancel(entry) }
        XCTAssertLessThan(heap.capacity, 4_096, "the heap kept the capacity of its peak")
    }

    /// A due work is run, and let go of, on a global queue, never on the heap's own queue:
    /// a work's last reference dropped there would run a deinit (a value `delay` held, a
    /// promise and its last observers) on it, delaying every other timer, and, were the
    /// heap guarded by its queue, calling back into the heap from there would trap.
    func testFiredWorksAreLetGoOfOffTheHeapsQueue() {
        final class Probe: @unchecked Sendable {
            let onHeapQueue: Counter, freed: Countdown
            init(_ onHeapQueue: Counter, _ freed: Countdown) { self.onHeapQueue = onHeapQueue; self.freed = freed }
            deinit {
                if DispatchQueue.getSpecific(key: TimerHeap.queueKey) == true { onHeapQueue.increment() }
                freed.countDown()
            }
        }
        let count = 3_000
        let onHeapQueue = Counter()
        for _ in 0..<5 {
            let freed = Countdown(count)
            let deadline = DispatchTime.now() + .milliseconds(20)
            for _ in 0..<count {
                let probe = Probe(onHeapQueue, freed)
                _ = heap.schedule(at: deadline) { _ = probe }  // a work that returns at once
            }
            XCTAssertTrue(freed.wait())
        }
        XCTAssertEqual(onHeapQueue.value, 0, "works were let go of on the heap's queue")
    }

    /// After a burst, a steady load of a few timers does not reallocate the array on every
    /// remove (malloc rounds a shrunk capacity up: it must not qualify for a shrink again).
    func testASteadyLoadAfterABurstDoesNotShrinkOnEveryRemove() {
        let burst = (0..<20_000).map { _ in heap.schedule(at: .now() + .seconds(3_600)) {} }
        for entry in burst.dropFirst(100) { heap.cancel(entry) }
        let shrinks = heap.shrinks
        for _ in 0..<1_000 {
            heap.cancel(heap.schedule(at: .now() + .seconds(3_600)) {})
        }
        XCTAssertEqual(heap.shrinks, shrinks, "the heap reallocated its array under a steady load")
        for entry in burst.prefix(100) { heap.cancel(entry) }
    }

    /// Timers fire on time while Dispatch's global pool is saturated: blocking work queued
    /// there (`wait()` in many `.default` handlers, blocking I/O on global queues) is when
    /// a timeout matters most. Due works run on the library's own serial queues, which
    /// Dispatch gives a thread whatever the global pool is doing. Before, each due work
    /// went to a global queue, behind the blocked work: none of these fired in 5 s.
    func testTimersFireWhileTheGlobalPoolIsBlocked() {
        blockingTheGlobalPool {
            let fired = Countdown(4)
            let receiver = Promise<Int>()
            receiver.timeout(.milliseconds(20)).whenComplete(on: .immediate) { _ in fired.countDown() }
            receiver.timeout(.zero).whenComplete(on: .immediate) { _ in fired.countDown() }
            Promise.after(.milliseconds(20)).whenComplete(on: .immediate) { _ in fired.countDown() }
            Promise.after(.zero).whenComplete(on: .immediate) { _ in fired.countDown() }
            XCTAssertTrue(fired.wait(timeout: 5), "timers waited for the global pool")
            XCTAssertTrue(receiver.isPending)
        }
    }

    /// Runs `body` while 64 works block Dispatch's global pool (more than it runs at once
    /// on a small machine), then lets them go.
    private func blockingTheGlobalPool(_ body: () -> Void) {
        let blockers = 64  // more than Dispatch's global pool runs at once on a small machine
        let release = DispatchSemaphore(value: 0)
        let started = Countdown(1)
        let finished = Countdown(blockers)
        for _ in 0..<blockers {
            DispatchQueue.global().async {
                started.countDown()
                release.wait()
                finished.countDown()
            }
        }
        defer {
            for _ in 0..<blockers { release.signal() }
            XCTAssertTrue(finished.wait(), "the blocking work never finished")
        }
        XCTAssertTrue(started.wait(), "Dispatch ran none of the global work")

        body()
    }

    /// The same with the system's clocks passed as `clock:` (what code that takes a clock
    /// for its tests passes in production): they time on the heap too. (Each was a Task
    /// sleeping on the clock, which waited for the concurrency pool.)
    func testTimersOnTheSystemClocksFireWhileTheGlobalPoolIsBlocked() {
        blockingTheGlobalPool {
            let fired = Countdown(6)
            let receiver = Promise<Int>()
            func observe<V>(_ promise: Promise<V>) {
                promise.whenComplete(on: .immediate) { _ in fired.countDown() }
            }
            observe(receiver.timeout(.milliseconds(20), clock: ContinuousClock()))
            observe(receiver.timeout(.milliseconds(20), clock: SuspendingClock()))
            observe(receiver.timeout(until: ContinuousClock.now + .milliseconds(20), clock: ContinuousClock()))
            observe(Promise.after(.milliseconds(20), clock: ContinuousClock()))
            observe(Promise.after(.milliseconds(20), clock: SuspendingClock()))
            observe(Promise(value: 1).delay(.milliseconds(20), clock: ContinuousClock()))
            XCTAssertTrue(fired.wait(timeout: 5), "timers on a system clock waited for the global pool")
            XCTAssertTrue(receiver.isPending)
        }
    }

    /// A timer's `.immediate` handler that blocks holds its lane, and the timers set after
    /// it go to the others: eight timers set one after the other, then a burst of eight due
    /// together, all fire on time while the first handler still blocks. (With the lanes
    /// taken in turn, every fourth timer waited behind the blocked one; with the least
    /// busy lane first and ties to the first lane, the burst's last did.)
    func testATimerHandlerThatBlocksHoldsOnlyItsOwnLane() {
        let release = DispatchSemaphore(value: 0)
        let blocking = Countdown(1)
        Promise.after(.milliseconds(1)).whenComplete(on: .immediate) { _ in
            blocking.countDown()
            release.wait()
        }
        defer { release.signal() }
        XCTAssertTrue(blocking.wait(), "the blocking handler never ran")
        for index in 0..<8 {
            let fired = Countdown(1)
            Promise.after(.milliseconds(5)).whenComplete(on: .immediate) { _ in fired.countDown() }
            XCTAssertTrue(fired.wait(timeout: 5), "timer \(index) waited behind the blocked handler")
        }
        let burst = Countdown(8)
        for _ in 0..<8 { Promise.after(.milliseconds(20)).whenComplete(on: .immediate) { _ in burst.countDown() } }
        XCTAssertTrue(burst.wait(timeout: 5), "timers due together waited behind the blocked handler")
    }

    /// A timer due at once does not go through the heap (the hop to its queue would only
    /// delay it), and still fires.
    func testATimerDueAtOnceSkipsTheHeap() {
        let start = heap.count
        let now = Promise.after(.zero)
        let delayed = Promise(value: 7).delay(.zero)
        XCTAssertEqual(heap.count, start)
        XCTAssertNoThrow(try now.wait(timeout: .seconds(10)))
        XCTAssertEqual(try delayed.wait(timeout: .seconds(10)), 7)
    }

    /// Durations from configuration may be absurd: past `Int64`'s seconds in the past
    /// trapped where the deadline was computed (`Duration.components`), and in a clock's
    /// sleep. Such a timer is simply due.
    func testDurationsFarInThePastAreDueAtOnce() throws {
        let past = Duration.seconds(-1e20)
        XCTAssertNoThrow(try Promise.after(past).wait(timeout: .seconds(10)))
        XCTAssertNoThrow(try Promise.after(past, clock: ContinuousClock()).wait(timeout: .seconds(10)))
        XCTAssertEqual(try Promise(value: 3).delay(past).wait(timeout: .seconds(10)), 3)
        let receiver = Promise<Int>()  // held: a receiver dropped pending would break the child first
        XCTAssertThrowsError(try receiver.timeout(past).wait(timeout: .seconds(10))) {
            guard case PromiseError.timedOut = $0 else { return XCTFail("\($0)") }
        }
        XCTAssertThrowsError(try Promise<Int>().wait(timeout: past)) {
            guard case PromiseError.timedOut = $0 else { return XCTFail("\($0)") }
        }
    }

    /// The timers the library sets through it: a settled `timeout` and a cancelled `after`
    /// or `delay` leave nothing on the heap.
    func testTimersOfSettledOrCancelledPromisesLeaveTheHeap() {
        let start = heap.count
        let source = Promise<Int>()
        let timeouts = (0..<100).map { _ in source.timeout(.seconds(3_600)) }
        let after = Promise.after(.seconds(3_600))
        let delay = Promise(value: 1).delay(.seconds(3_600))
        XCTAssertEqual(heap.count, start + 102)
        source.fulfill(1)
        after.cancel()
        delay.cancel()
        XCTAssertTrue(timeouts.allSatisfy(\.isFulfilled))
        XCTAssertEqual(heap.count, start, "a timer outlived what it would settle")
    }
}
