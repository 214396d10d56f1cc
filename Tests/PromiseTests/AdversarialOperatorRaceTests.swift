// Races on the server operators: `retry` (pauses on a manual clock, attempts failing as
// the output is cancelled), bounded fan-out (`all(_:maxConcurrent:)`, `sequence`),
// `timeout`/`delay`/`after` timers racing cancels, and the diagnostics each
// dropped or cancelled promise must (or must not) report. Each test races two or three
// threads released together over many rounds and checks an exact invariant once
// everything settled; every wait is bounded.
import Dispatch
import Foundation
import XCTest
@testable import Promise

// MARK: What the tests share

private final class LockedBox<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: T
    init(_ value: T) { stored = value }
    func withLock<R>(_ body: (inout T) throws -> R) rethrows -> R {
        lock.lock(); defer { lock.unlock() }
        return try body(&stored)
    }
    var value: T { withLock { $0 } }
}

private final class CaptureToken: @unchecked Sendable {
    let alive: LifeTracker
    init(_ alive: LifeTracker) { self.alive = alive; alive.born() }
    deinit { alive.died() }
}

private struct OpRaceRetryValue: Sendable { let n: Int }
private struct OpRaceFanOutValue: Sendable { let n: Int }
private struct OpRaceTimerValue: Sendable { let n: Int }
private struct OpRaceDelayValue: Sendable {
    let token: CaptureToken
}

private struct OperatorError: Error, Equatable, Sendable { let id: Int }

/// Records the diagnostics events whose promise type names one of this file's types.
private final class RecordedDiagnostics: @unchecked Sendable {
    struct Event { let kind: String; let type: String; let hasSite: Bool; let error: String }
    private let lock = NSLock()
    private var events: [Event] = []

    func install() {
        PromiseDiagnostics.setHandler { [self] event in
            guard event.promiseType.contains("OpRace") else { return }
            let kind: String, error: String
            switch event.kind {
            case .brokenPromise: kind = "broken"; error = ""
            case .unhandledRejection(let e): kind = "unhandled"; error = String(describing: e)
            case .cycle: kind = "cycle"; error = ""
            }
            lock.withLock { events.append(Event(kind: kind, type: event.promiseType, hasSite: event.creationSite != nil, error: error)) }
        }
    }

    var all: [Event] { lock.withLock { events } }
    func count(_ filter: (Event) -> Bool) -> Int { all.filter(filter).count }
}


/// Busy for about `n` additions: sweeps one thread's action across the other's window.
private func spin(_ n: Int) {
    var x = 0
    for i in 0..<n { x &+= i }
    _ = x
}

final class AdversarialOperatorRaceTests: XCTestCase {
    override func tearDown() {
        PromiseDiagnostics.setHandler(nil)
        super.tearDown()
    }

    // MARK: retry: cancel racing the end of a pause

    private final class RetryRow: @unchecked Sendable {
        let clock = ManualClock()
        let attempts = LockedBox<[Promise<OpRaceRetryValue>]>([])
        var output: Promise<OpRaceRetryValue>?
        weak var weakOutput: Promise<OpRaceRetryValue>?
        let reason: OperatorError
        init(reason: OperatorError) { self.reason = reason }
    }

    /// A retry pausing on a manual clock: one thread advances the clock past the pause
    /// (which starts attempt 2), the other cancels the output. Whatever wins, the output
    /// ends cancelled with the reason, at most one more attempt is made and it ends
    /// cancelled, no sleeper is left on the clock, and once dropped the run is freed.
    func testRetryCancelRacingTheEndOfItsPauseOnAManualClock() {
        let rounds = 2_000
        let alive = LifeTracker()
        let rows = (0..<rounds).map { round -> RetryRow in
            let row = RetryRow(reason: OperatorError(id: round))
            let token = CaptureToken(alive)
            let attempts = row.attempts
            let output = Promise<OpRaceRetryValue>.retry(attempts: 3, backoff: .fixed(.seconds(1)), clock: row.clock, on: .immediate) {
                _ = token
                let p = Promise<OpRaceRetryValue>()
                attempts.withLock { $0.append(p) }
                return p
            }
            row.output = output
            row.weakOutput = output
            row.attempts.value[0].reject(OperatorError(id: -1))
            return row
        }
        XCTAssertTrue(eventually(timeout: 20) { rows.allSatisfy { $0.clock.sleeperCount == 1 } }, "setup: every run pauses")
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.clock.advance(by: .seconds(1)) } else { row.output!.cancel(reason: row.reason) }
        })
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            let output = row.output!
            if !output.isCancelled { problems.append("round \(round): output \(output.state)") }
            if !eventually(timeout: 2, { row.clock.sleeperCount == 0 }) { problems.append("round \(round): a sleeper is left on the clock") }
        }
        // Drop the outputs: a run is freed only once its pause and its attempts let go.
        for row in rows { row.output = nil }
        for (round, row) in rows.enumerated() {
            if !eventually(timeout: 2, { row.weakOutput == nil }) { problems.append("round \(round): the output (and its run) is kept") }
            let attempts = row.attempts.value
            if attempts.count > 2 { problems.append("round \(round): \(attempts.count) attempts") }
            if attempts.count == 2 {
                let second = attempts[1]
                if !second.isCancelled {
                    problems.append("round \(round): attempt 2 is \(second.state), not cancelled")
                } else if let e = try? second.wait(timeout: .seconds(1)) {
                    problems.append("round \(round): attempt 2 has a value \(e)")
                }
            }
            if problems.count > 20 { break }
        }
        XCTAssertTrue(eventually { alive.alive == 0 }, "captures of the user's code kept: \(alive.alive)")
        XCTAssertEqual(problems, [], "\(problems.count) problems")
    }

    // MARK: retry: cancel racing the attempt's failure, long backoff

    /// One thread rejects the attempt in flight (which makes the run pause for an hour on
    /// a manual clock, on `.immediate` or, through `shouldRetry`, on a serial queue), the
    /// other cancels the output. The output ends cancelled, no further attempt starts, the
    /// pause (if it started) leaves the clock, and the run is freed once dropped.
    func testRetryCancelRacingTheAttemptsFailureBeforeALongPause() {
        let events = RecordedDiagnostics()
        events.install()
        let rounds = 3_000
        let alive = LifeTracker()
        let queue = DispatchQueue(label: "op-race.retry.predicate")
        let rows = (0..<rounds).map { round -> RetryRow in
            let row = RetryRow(reason: OperatorError(id: round))
            let token = CaptureToken(alive)
            let attempts = row.attempts
            let body: @Sendable () throws -> Promise<OpRaceRetryValue> = {
                _ = token
                let p = Promise<OpRaceRetryValue>()
                attempts.withLock { $0.append(p) }
                return p
            }
            let output: Promise<OpRaceRetryValue>
            if round.isMultiple(of: 2) {
                output = .retry(attempts: 3, backoff: .fixed(.seconds(3600)), clock: row.clock, on: .immediate, body)
            } else {
                output = .retry(attempts: 3, backoff: .fixed(.seconds(3600)), clock: row.clock, on: queue,
                                shouldRetry: { _ in true }, body)
            }
            row.output = output
            row.weakOutput = output
            return row
        }
        XCTAssertTrue(eventually(timeout: 20) { rows.allSatisfy { $0.attempts.value.count == 1 } }, "setup")
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.attempts.value[0].reject(OperatorError(id: -1)) } else { row.output!.cancel(reason: row.reason) }
        })
        queue.sync {}
        queue.sync {}
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            let output = row.output!
            if !output.isCancelled { problems.append("round \(round): output \(output.state)") }
            if (try? output.wait(timeout: .seconds(1))) != nil { problems.append("round \(round): output has a value") }
            if !eventually(timeout: 2, { row.clock.sleeperCount == 0 }) { problems.append("round \(round): the pause still sleeps on the clock") }
            let attempts = row.attempts.value
            if attempts.count != 1 { problems.append("round \(round): \(attempts.count) attempts") }
            if attempts[0].isPending { problems.append("round \(round): attempt 1 pending") }
            if problems.count > 20 { break }
        }
        for row in rows { row.output = nil }
        for (round, row) in rows.enumerated() where problems.count <= 20 {
            if !eventually(timeout: 2, { row.weakOutput == nil }) { problems.append("round \(round): the output (and its run) is kept") }
        }
        XCTAssertTrue(eventually { alive.alive == 0 }, "captures of the user's code kept: \(alive.alive)")
        XCTAssertEqual(problems, [], "\(problems.count) problems")
        // The attempts' rejections were read by the run (or the run stopped watching
        // them): freed, none is an unhandled rejection; a cancelled output never is.
        for row in rows { row.attempts.withLock { $0 = [] } }
        XCTAssertEqual(events.all.map { "\($0.kind) \($0.type) \($0.error)" }, [], "diagnostics")
    }

    // MARK: retry: attempts that fail at once, cancelled from another thread

    /// A retry of many attempts, each returning a promise rejected already, hopping on a
    /// serial queue: a cancel from another thread stops it. At most one attempt (the one
    /// the queue was already starting) may begin after `cancel` returned; the output ends
    /// cancelled; nothing is reported to the diagnostics hook.
    func testRetryOfAttemptsFailingAtOnceStopsWhenCancelledFromAnotherThread() {
        let events = RecordedDiagnostics()
        events.install()
        var problems: [String] = []
        for round in 0..<300 {
            let queue = DispatchQueue(label: "op-race.retry.hops")
            let calls = LockedBox(0)
            let output = Promise<OpRaceRetryValue>.retry(attempts: 1_000_000, delay: .zero, on: queue) {
                calls.withLock { $0 += 1 }
                return Promise<OpRaceRetryValue>(error: OperatorError(id: -2))
            }
            let started = DispatchSemaphore(value: 0)
            let snapshot = LockedBox(-1)
            let spins = (round * 7919) % 50_000
            Thread {
                spin(spins)
                output.cancel(reason: OperatorError(id: round))
                snapshot.withLock { $0 = calls.value }
                started.signal()
            }.start()
            XCTAssertEqual(started.wait(timeout: .now() + 10), .success)
            queue.sync {}
            queue.sync {}
            let final = calls.value
            if final - snapshot.value > 1 {
                problems.append("round \(round): \(final - snapshot.value) attempts began after cancel returned")
            }
            if !output.isCancelled { problems.append("round \(round): output \(output.state)") }
            if problems.count > 20 { break }
        }
        XCTAssertEqual(problems, [])
        // Every promise of the loop is gone by now (the queues drained).
        XCTAssertEqual(events.all.map { "\($0.kind) \($0.type) \($0.error)" }, [], "diagnostics for cancelled runs")
    }

    // MARK: bounded fan-out: cancel racing step settlements

    private final class FanRow: @unchecked Sendable {
        let steps = LockedBox<[Int: Promise<OpRaceFanOutValue>]>([:])
        let cancelReturned = LockedBox(false)
        let callsAfterCancel = LockedBox(0)
        let settledByUs = LockedBox<Set<Int>>([])
        var output: Promise<[OpRaceFanOutValue]>?
        weak var weakOutput: Promise<[OpRaceFanOutValue]>?
        let reason: OperatorError
        let kind: Int
        let queue: DispatchQueue?
        init(reason: OperatorError, kind: Int, queue: DispatchQueue?) {
            self.reason = reason
            self.kind = kind
            self.queue = queue
        }
        func step(_ i: Int) -> Promise<OpRaceFanOutValue>? { steps.withLock { $0[i] } }
    }

    /// `all(0..<8, maxConcurrent: 3)`: one thread cancels the output while the other
    /// fulfils the steps in flight (which starts new ones), rejects one, cancels one from
    /// outside, or fulfils one whose successor's factory throws. Afterwards no step is
    /// left pending, at most one factory call began after the cancel returned, the steps
    /// cancelled took the output's reason when the output ended cancelled, and the run is
    /// freed once dropped.
    func testBoundedFanOutCancelRacingItsStepsSettling() {
        let events = RecordedDiagnostics()
        events.install()
        let rounds = 4_000
        let alive = LifeTracker()
        let serial = DispatchQueue(label: "op-race.fanout")
        let rows = (0..<rounds).map { round -> FanRow in
            let row = FanRow(reason: OperatorError(id: round), kind: round % 4, queue: round % 8 >= 4 ? serial : nil)
            let token = CaptureToken(alive)
            let context: any ExecutionContext = row.queue ?? .immediate
            let output = Promise<OpRaceFanOutValue>.all(0..<8, maxConcurrent: 3, on: context) { [unowned row] i in
                _ = token
                if row.cancelReturned.value { row.callsAfterCancel.withLock { $0 += 1 } }
                if row.kind == 3 && i == 3 { throw OperatorError(id: -3) }
                let p = Promise<OpRaceFanOutValue>()
                row.steps.withLock { $0[i] = p }
                return p
            }
            row.output = output
            row.weakOutput = output
            return row
        }
        XCTAssertTrue(eventually(timeout: 20) { rows.allSatisfy { $0.steps.value.count == 3 } }, "setup: three steps in flight")
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 {
                row.output!.cancel(reason: row.reason)
                row.cancelReturned.withLock { $0 = true }
                return
            }
            switch row.kind {
            case 0, 3:
                for i in 0..<3 {
                    if let step = row.step(i), step.fulfill(OpRaceFanOutValue(n: i)) { row.settledByUs.withLock { _ = $0.insert(i) } }
                }
            case 1:
                if let step = row.step(1), step.reject(OperatorError(id: -1)) { row.settledByUs.withLock { _ = $0.insert(1) } }
            default:
                if let step = row.step(0) {
                    step.cancel(reason: OperatorError(id: -4))
                    if (step.settledResult.flatMap { r -> OperatorError? in if case .failure(let e) = r { return e as? OperatorError }; return nil }) == OperatorError(id: -4) {
                        row.settledByUs.withLock { _ = $0.insert(0) }
                    }
                }
            }
        })
        serial.sync {}
        serial.sync {}
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            let output = row.output!
            if output.isPending { problems.append("round \(round) kind \(row.kind): output pending"); continue }
            let steps = row.steps.value
            let ours = row.settledByUs.value
            for (i, step) in steps.sorted(by: { $0.key < $1.key }) {
                if step.isPending {
                    problems.append("round \(round) kind \(row.kind) ctx \(row.queue == nil ? "imm" : "queue"): step \(i) left pending, output \(output.state)")
                    continue
                }
                if output.isCancelled && !ours.contains(i) {
                    // Cancelled by the run with the output's reason.
                    let reason = step.settledResult.flatMap { r -> OperatorError? in if case .failure(let e) = r { return e as? OperatorError }; return nil }
                    if !step.isCancelled || reason != row.reason {
                        problems.append("round \(round) kind \(row.kind): step \(i) \(step.state) \(String(describing: reason)), output cancelled with \(row.reason)")
                    }
                }
            }
            if row.callsAfterCancel.value > 1 {
                problems.append("round \(round) kind \(row.kind): \(row.callsAfterCancel.value) factory calls after the cancel returned")
            }
            if problems.count > 20 { break }
        }
        for row in rows { row.output = nil }
        // Settle whatever we may have left (none should be pending), then check the runs are gone.
        for row in rows { for step in row.steps.value.values { step.cancel() } }
        for (round, row) in rows.enumerated() where problems.count <= 20 {
            if !eventually(timeout: 2, { row.weakOutput == nil }) { problems.append("round \(round): output kept") }
        }
        XCTAssertTrue(eventually { alive.alive == 0 }, "captures of the work kept: \(alive.alive)")
        XCTAssertEqual(problems, [], "\(problems.count) problems")
        // Steps rejected by us were read by the run (or it stopped watching them); the
        // outputs were held and are freed now: a rejected one unread is reported, once.
        for row in rows { row.steps.withLock { $0 = [:] } }
        let all = events.all
        XCTAssertEqual(all.filter { $0.hasSite }.map { "\($0.kind) \($0.error)" }, [], "steps reported")
        let rejectedOutputs = all.filter { !$0.hasSite }
        XCTAssertEqual(rejectedOutputs.filter { $0.kind != "unhandled" }.count, 0)
    }

    // MARK: bounded fan-out dropped unheld, two steps failing at once

    /// Nobody holds the output of `all(_:maxConcurrent:)`: two threads reject two steps at
    /// once.
    /// The output rejects once, is freed, and is reported once as an unhandled rejection;
    /// no step is reported (the run read their errors, or cancelled them).
    func testDroppedBoundedFanOutOutputFailedFromTwoThreadsIsReportedOnce() {
        let events = RecordedDiagnostics()
        events.install()
        let rounds = 3_000
        let alive = LifeTracker()
        final class Row: @unchecked Sendable {
            let steps = LockedBox<[Int: Promise<OpRaceFanOutValue>]>([:])
            weak var weakOutput: Promise<[OpRaceFanOutValue]>?
        }
        let rows = (0..<rounds).map { _ -> Row in
            let row = Row()
            let token = CaptureToken(alive)
            let steps = row.steps
            let output = Promise<OpRaceFanOutValue>.all(0..<4, maxConcurrent: 2, on: .immediate) { i in
                _ = token
                let p = Promise<OpRaceFanOutValue>()
                steps.withLock { $0[i] = p }
                return p
            }
            row.weakOutput = output
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            rows[round].steps.value[thread]?.reject(OperatorError(id: thread))
        })
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            if !eventually(timeout: 2, { row.weakOutput == nil }) { problems.append("round \(round): output kept") }
            for (i, step) in row.steps.value where step.isPending { problems.append("round \(round): step \(i) pending") }
            if problems.count > 20 { break }
        }
        XCTAssertEqual(problems, [])
        XCTAssertTrue(eventually { alive.alive == 0 }, "captures of the work kept: \(alive.alive)")
        for row in rows { row.steps.withLock { $0 = [:] } }
        let all = events.all
        let isOutput = { (e: RecordedDiagnostics.Event) in e.type.contains("[") || e.type.contains("Array") }
        let outputReports = all.filter(isOutput)
        let stepReports = all.filter { !isOutput($0) }
        XCTAssertEqual(outputReports.filter { $0.kind == "unhandled" }.count, rounds, "one unhandled rejection per dropped output")
        XCTAssertEqual(outputReports.filter { $0.kind != "unhandled" }.count, 0)
        XCTAssertEqual(stepReports.map { "\($0.kind) \($0.type) \($0.error)" }, [], "steps reported")
    }

    // MARK: timeout: the timer firing racing a cancel of the child and the receiver settling

    /// `timeout` with a timer this test fires itself (the `scheduling:` form PromiseNIO
    /// uses): three threads fire the timer, cancel the child, and reject the receiver.
    /// The child settles exactly once; its observer runs once; the timer's cancel is
    /// called once; the receiver is never reported (the child read it or stopped waiting
    /// for it); the child, unobserved in odd rounds, is reported once exactly when it
    /// rejected, never when cancelled.
    func testTimeoutTimerFiringRacingCancelAndReceiverSettling() {
        let events = RecordedDiagnostics()
        events.install()
        let rounds = 6_000
        final class Row: @unchecked Sendable {
            var receiver: Promise<OpRaceTimerValue>?
            var child: Promise<OpRaceTimerValue>?
            var fire: (@Sendable () -> Void)?
            let timerCancels = LockedBox(0)
            let observed = Countdown(1)
            var outcome = ""
        }
        let rows = (0..<rounds).map { round -> Row in
            let row = Row()
            let receiver = Promise<OpRaceTimerValue>()
            let cancels = row.timerCancels
            let child = receiver.timeout(.seconds(60), scheduling: { _, fire in
                row.fire = fire
                return { cancels.withLock { $0 += 1 } }
            })
            if round.isMultiple(of: 2) {
                let observed = row.observed
                child.whenComplete(on: .immediate) { _ in observed.countDown() }
            }
            row.receiver = receiver
            row.child = child
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 3, rounds: rounds) { thread, round in
            let row = rows[round]
            switch thread {
            case 0: row.fire!()
            case 1: row.child!.cancel(reason: OperatorError(id: round))
            default: row.receiver!.reject(OperatorError(id: -round - 1))
            }
        })
        var problems: [String] = []
        var expectedChildReports = 0
        for (round, row) in rows.enumerated() {
            let child = row.child!
            if child.isPending { problems.append("round \(round): child pending"); continue }
            row.outcome = "\(child.state)"
            if round.isMultiple(of: 2) {
                if !row.observed.wait(timeout: 2) { problems.append("round \(round): observer did not run") }
                if row.observed.overshoot != 0 { problems.append("round \(round): observer ran \(1 + row.observed.overshoot) times") }
            } else if child.isRejected {
                expectedChildReports += 1
            }
            if row.timerCancels.value != 1 { problems.append("round \(round): timer cancelled \(row.timerCancels.value) times") }
            if problems.count > 20 { break }
        }
        for row in rows {
            row.fire = nil
            row.child = nil
            row.receiver = nil
        }
        // Nothing async holds these promises: the reports are in.
        let all = events.all
        let receiverReports = all.filter { $0.hasSite }
        let childReports = all.filter { !$0.hasSite }
        XCTAssertEqual(problems, [])
        XCTAssertEqual(receiverReports.map { "\($0.kind) \($0.error)" }, [], "the receiver was reported")
        XCTAssertEqual(childReports.filter { $0.kind != "unhandled" }.map { "\($0.kind) \($0.error)" }, [])
        XCTAssertEqual(childReports.count, expectedChildReports, "unobserved rejected children reported")
    }

    // MARK: delay on a manual clock: the receiver fulfilling racing a cancel of the child

    /// `delay` on a manual clock: one thread fulfils the receiver (which starts the
    /// timer), the other cancels the child. The child ends cancelled, its observer runs
    /// once, no sleeper is left on the clock, and the value is freed.
    func testDelayOnAClockReceiverFulfilRacingChildCancel() {
        let rounds = 3_000
        let alive = LifeTracker()
        final class Row: @unchecked Sendable {
            let clock = ManualClock()
            var receiver: Promise<OpRaceDelayValue>?
            var child: Promise<OpRaceDelayValue>?
            let observed = Countdown(1)
        }
        let rows = (0..<rounds).map { _ -> Row in
            let row = Row()
            let receiver = Promise<OpRaceDelayValue>()
            let child = receiver.delay(.seconds(5), clock: row.clock)
            let observed = row.observed
            child.whenComplete(on: .immediate) { _ in observed.countDown() }
            row.receiver = receiver
            row.child = child
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.receiver!.fulfill(OpRaceDelayValue(token: CaptureToken(alive))) } else { row.child!.cancel() }
        })
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            if !row.child!.isCancelled { problems.append("round \(round): child \(row.child!.state)") }
            if !row.observed.wait(timeout: 2) || row.observed.overshoot != 0 { problems.append("round \(round): observer ran \(row.observed.overshoot + 1)?") }
            if !eventually(timeout: 2, { row.clock.sleeperCount == 0 }) { problems.append("round \(round): the timer still sleeps") }
            if problems.count > 20 { break }
        }
        for row in rows { row.receiver = nil; row.child = nil }
        XCTAssertEqual(problems, [])
        XCTAssertTrue(eventually { alive.alive == 0 }, "delayed values kept: \(alive.alive)")
    }

    /// `delay` on a manual clock whose receiver fulfilled: advancing the clock races a
    /// cancel of the child. The child ends fulfilled or cancelled, its observer runs once,
    /// nothing sleeps afterwards, and every value is freed once dropped.
    func testDelayOnAClockFiringRacingChildCancel() {
        let rounds = 3_000
        let alive = LifeTracker()
        final class Row: @unchecked Sendable {
            let clock = ManualClock()
            var child: Promise<OpRaceDelayValue>?
            let observed = Countdown(1)
        }
        let rows = (0..<rounds).map { _ -> Row in
            let row = Row()
            let receiver = Promise<OpRaceDelayValue>(value: OpRaceDelayValue(token: CaptureToken(alive)))
            let child = receiver.delay(.seconds(5), clock: row.clock)
            let observed = row.observed
            child.whenComplete(on: .immediate) { _ in observed.countDown() }
            row.child = child
            return row
        }
        XCTAssertTrue(eventually(timeout: 20) { rows.allSatisfy { $0.clock.sleeperCount == 1 } }, "setup")
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.clock.advance(by: .seconds(5)) } else { row.child!.cancel() }
        })
        var problems: [String] = []
        var fulfilled = 0
        for (round, row) in rows.enumerated() {
            if !row.observed.wait(timeout: 2) { problems.append("round \(round): observer did not run, child \(row.child!.state)") }
            if row.observed.overshoot != 0 { problems.append("round \(round): observer ran twice") }
            if row.child!.isFulfilled { fulfilled += 1 }
            if row.child!.isPending || row.child!.isRejected { problems.append("round \(round): child \(row.child!.state)") }
            if !eventually(timeout: 2, { row.clock.sleeperCount == 0 }) { problems.append("round \(round): the timer still sleeps") }
            if problems.count > 20 { break }
        }
        for row in rows { row.child = nil }
        XCTAssertEqual(problems, [])
        XCTAssertTrue(eventually { alive.alive == 0 }, "delayed values kept: \(alive.alive) (fulfilled \(fulfilled))")
    }

    // MARK: after on a manual clock: advance racing cancel

    func testAfterOnAClockAdvanceRacingCancel() {
        let rounds = 3_000
        final class Row: @unchecked Sendable {
            let clock = ManualClock()
            var timer: Promise<Void>?
            weak var weakTimer: Promise<Void>?
            let observed = Countdown(1)
            let thens = LockedBox(0)
            var thenChild: Promise<Void>?
        }
        let rows = (0..<rounds).map { _ -> Row in
            let row = Row()
            let timer = Promise<Void>.after(.seconds(3), clock: row.clock)
            let observed = row.observed
            let thens = row.thens
            timer.whenComplete(on: .immediate) { _ in observed.countDown() }
            row.thenChild = timer.then(on: .immediate) { thens.withLock { $0 += 1 } }
            row.timer = timer
            row.weakTimer = timer
            return row
        }
        XCTAssertTrue(eventually(timeout: 20) { rows.allSatisfy { $0.clock.sleeperCount == 1 } }, "setup")
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.clock.advance(by: .seconds(3)) } else { row.timer!.cancel() }
        })
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            if !row.observed.wait(timeout: 2) { problems.append("round \(round): observer did not run") }
            if row.observed.overshoot != 0 { problems.append("round \(round): observer ran twice") }
            let timer = row.timer!
            if timer.isCancelled && row.thens.value != 0 { problems.append("round \(round): a success handler of a cancelled timer ran") }
            // A cancel of a fulfilled timer may still reach its child before its handler ran
            // (documented): the child then ends cancelled and its handler never runs.
            let child = row.thenChild!
            if !eventually(timeout: 2, { !child.isPending }) { problems.append("round \(round): then-child pending") }
            // (A handler already running when the cancel came runs to its end, and its
            // child ends cancelled: documented. So only "fulfilled without the handler"
            // and "ran twice" are wrong.)
            if (child.isFulfilled && row.thens.value != 1) || row.thens.value > 1 || (timer.isCancelled && row.thens.value != 0) {
                problems.append("round \(round): then-child \(child.state), handler ran \(row.thens.value)")
            }
            if !eventually(timeout: 2, { row.clock.sleeperCount == 0 }) { problems.append("round \(round): still sleeping") }
            if problems.count > 20 { break }
        }
        for row in rows { row.timer = nil; row.thenChild = nil }
        for (round, row) in rows.enumerated() where problems.count <= 20 {
            if !eventually(timeout: 2, { row.weakTimer == nil }) { problems.append("round \(round): timer promise kept") }
        }
        XCTAssertEqual(problems, [])
    }

    // MARK: retry dropped unheld, pausing on Dispatch

    /// Retry outputs nobody holds, each attempt failing at once, with short Dispatch
    /// pauses: every run ends, its output is freed and reported once as an unhandled
    /// rejection with the last attempt's error; no attempt is reported; the user's code
    /// is let go.
    func testDroppedRetryOutputsEndFreedAndAreReportedOnce() {
        let events = RecordedDiagnostics()
        events.install()
        let runs = 400
        let alive = LifeTracker()
        let calls = LockedBox(0)
        for round in 0..<runs {
            let token = CaptureToken(alive)
            let counter = LockedBox(0)
            _ = Promise<OpRaceRetryValue>.retry(attempts: 3, backoff: .fixed(.microseconds(200), jitter: 1),
                                             on: round.isMultiple(of: 2) ? .immediate : .default) {
                _ = token
                calls.withLock { $0 += 1 }
                let n = counter.withLock { $0 += 1; return $0 }
                return Promise<OpRaceRetryValue>(error: OperatorError(id: n))
            }
        }
        XCTAssertTrue(eventually(timeout: 20) { alive.alive == 0 }, "runs kept: \(alive.alive)")
        XCTAssertTrue(eventually(timeout: 20) { events.count { !$0.hasSite } >= runs })
        XCTAssertEqual(calls.value, runs * 3)
        let all = events.all
        XCTAssertEqual(all.filter { $0.hasSite }.map { "\($0.kind) \($0.error)" }, [], "attempts reported")
        let outputs = all.filter { !$0.hasSite }
        XCTAssertEqual(outputs.count, runs)
        XCTAssertEqual(outputs.filter { $0.kind != "unhandled" || $0.error != "OperatorError(id: 3)" }.map { "\($0.kind) \($0.error)" }, [])
    }

    /// The same race as `testRetryCancelRacingTheAttemptsFailureBeforeALongPause`, with the
    /// hour-long pause on the library's Dispatch timer heap: once the output is dropped,
    /// the cancelled pause's heap entry keeps nothing of the run.
    func testRetryCancelRacingTheAttemptsFailureBeforeAnHourLongDispatchPause() {
        let rounds = 3_000
        let alive = LifeTracker()
        let rows = (0..<rounds).map { round -> RetryRow in
            let row = RetryRow(reason: OperatorError(id: round))
            let token = CaptureToken(alive)
            let attempts = row.attempts
            let output = Promise<OpRaceRetryValue>.retry(attempts: 3, backoff: .fixed(.seconds(3600)), on: .immediate) {
                _ = token
                let p = Promise<OpRaceRetryValue>()
                attempts.withLock { $0.append(p) }
                return p
            }
            row.output = output
            row.weakOutput = output
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.attempts.value[0].reject(OperatorError(id: -1)) } else { row.output!.cancel(reason: row.reason) }
        })
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            if !row.output!.isCancelled { problems.append("round \(round): output \(row.output!.state)") }
            if row.attempts.value.count != 1 { problems.append("round \(round): \(row.attempts.value.count) attempts") }
        }
        for row in rows { row.output = nil }
        for (round, row) in rows.enumerated() where problems.count <= 20 {
            if !eventually(timeout: 2, { row.weakOutput == nil }) { problems.append("round \(round): output kept by its cancelled pause") }
        }
        XCTAssertTrue(eventually { alive.alive == 0 }, "captures kept: \(alive.alive)")
        XCTAssertEqual(problems, [])
    }

    // MARK: bounded fan-out on a concurrent context, cancelled while it pumps

    /// `all(0..<200, maxConcurrent: 4)` on a concurrent queue, every step fulfilled at
    /// once, cancelled from another thread while it pumps. Fulfilled, the values are in
    /// order; cancelled, at most `maxConcurrent` factory calls begin after `cancel`
    /// returned, and every step made is settled.
    func testBoundedFanOutOnAConcurrentContextCancelledWhilePumping() {
        let concurrent = DispatchQueue(label: "op-race.fan.concurrent", attributes: .concurrent)
        var problems: [String] = []
        for round in 0..<300 {
            let cancelReturned = LockedBox(false)
            let callsAfter = LockedBox(0)
            let made = LockedBox<[Promise<OpRaceFanOutValue>]>([])
            let output = Promise<OpRaceFanOutValue>.all(0..<200, maxConcurrent: 4, on: .concurrent(concurrent)) { i in
                if cancelReturned.value { callsAfter.withLock { $0 += 1 } }
                let p = i.isMultiple(of: 3) ? Promise<OpRaceFanOutValue>() : Promise<OpRaceFanOutValue>(value: OpRaceFanOutValue(n: i))
                if i.isMultiple(of: 3) {
                    made.withLock { $0.append(p) }
                    DispatchQueue.global().async { p.fulfill(OpRaceFanOutValue(n: i)) }
                }
                return p
            }
            let done = DispatchSemaphore(value: 0)
            let spins = (round * 104_729) % 200_000
            Thread {
                spin(spins)
                output.cancel(reason: OperatorError(id: round))
                cancelReturned.withLock { $0 = true }
                done.signal()
            }.start()
            XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
            if !eventually(timeout: 5, { !output.isPending }) { problems.append("round \(round): output pending"); continue }
            concurrent.sync(flags: .barrier) {}
            if output.isFulfilled {
                let values = (try? output.wait(timeout: .seconds(1)))?.map(\.n)
                if values != Array(0..<200) { problems.append("round \(round): values out of order") }
            } else if callsAfter.value > 4 {
                problems.append("round \(round): \(callsAfter.value) factory calls after cancel returned")
            }
            if !eventually(timeout: 5, { made.value.allSatisfy { !$0.isPending } }) { problems.append("round \(round): a step left pending") }
            if problems.count > 20 { break }
        }
        XCTAssertEqual(problems, [])
    }

    // MARK: delay: the receiver rejecting racing a cancel of the child, diagnostics

    /// `delay` children nobody observes: one thread rejects the receiver (which passes on
    /// at once), the other cancels the child. Freed, a child that ended rejected is
    /// reported once as an unhandled rejection, a cancelled one never; the receiver never
    /// (its child read its error, or stopped waiting for it first).
    func testDelayReceiverRejectRacingChildCancelReportsOnlyRejectedChildren() {
        let events = RecordedDiagnostics()
        events.install()
        let rounds = 8_000
        final class Row: @unchecked Sendable {
            var receiver: Promise<OpRaceTimerValue>?
            var child: Promise<OpRaceTimerValue>?
        }
        let clock = ManualClock()
        let rows = (0..<rounds).map { round -> Row in
            let row = Row()
            let receiver = Promise<OpRaceTimerValue>()
            row.child = round.isMultiple(of: 2) ? receiver.delay(.seconds(1), clock: clock) : receiver.delay(.seconds(3600))
            row.receiver = receiver
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.receiver!.reject(OperatorError(id: round)) } else { row.child!.cancel(reason: OperatorError(id: -round - 1)) }
        })
        var rejectedChildren = 0
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            let child = row.child!
            if child.isPending { problems.append("round \(round): child pending") }
            if child.isFulfilled { problems.append("round \(round): child fulfilled") }
            if child.isRejected { rejectedChildren += 1 }
        }
        for row in rows { row.child = nil; row.receiver = nil }
        let all = events.all
        XCTAssertEqual(problems, [])
        XCTAssertEqual(all.filter { $0.hasSite }.map { "\($0.kind) \($0.error)" }, [], "receivers reported")
        XCTAssertEqual(all.filter { !$0.hasSite && $0.kind == "unhandled" }.count, rejectedChildren)
        XCTAssertEqual(all.filter { !$0.hasSite && $0.kind != "unhandled" }.count, 0)
    }

    // MARK: memory over many rounds

    private func residentBytes() -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
        let fields = text.split(separator: " ")
        return (fields.count > 1 ? Int(fields[1]) ?? 0 : 0) * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    /// Many rounds of retries cancelled during an hour-long Dispatch pause and bounded
    /// fan-outs cancelled with work in flight, each capturing a 64 KB buffer: the
    /// process's resident memory stays flat (a leak of the run, the pause's heap entry or
    /// the user's code would keep 64 KB a round: gigabytes).
    func testCancelledRetriesAndFanOutsKeepNoMemoryOverManyRounds() {
        final class Buffer: @unchecked Sendable {
            let bytes: [UInt8]
            let token: CaptureToken
            init(_ alive: LifeTracker) { bytes = [UInt8](repeating: 7, count: 64 * 1024); token = CaptureToken(alive) }
        }
        let alive = LifeTracker()
        func round(_ i: Int) {
            let buffer = Buffer(alive)
            let attempt = Promise<OpRaceRetryValue>(error: OperatorError(id: i))
            let retry = Promise<OpRaceRetryValue>.retry(attempts: 3, backoff: .fixed(.seconds(3600)), on: .immediate) {
                _ = buffer.bytes.count
                return attempt
            }
            let steps = [Promise<OpRaceFanOutValue>(), Promise<OpRaceFanOutValue>()]
            let fan = Promise<OpRaceFanOutValue>.all(0..<6, maxConcurrent: 2, on: .immediate) { j in
                _ = buffer.bytes.count
                return steps[j % 2]
            }
            let thread = i.isMultiple(of: 2)
            if thread {
                retry.cancel()
                fan.cancel()
            } else {
                fan.cancel()
                retry.cancel()
            }
        }
        for i in 0..<2_000 { round(i) }  // warm up the allocator
        let before = residentBytes()
        for i in 0..<20_000 { round(i) }
        let after = residentBytes()
        XCTAssertTrue(eventually { alive.alive == 0 }, "buffers kept by cancelled runs: \(alive.alive)")
        // AddressSanitizer's quarantine keeps freed memory resident: the count above is
        // the check there.
        let underAddressSanitizer = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__asan_init") != nil
        if !underAddressSanitizer {
            XCTAssertLessThan(after - before, 64 << 20, "resident memory grew by \((after - before) >> 20) MB over 20,000 rounds")
        }
    }

    // MARK: nested runs: a cancel of the outer run racing the leaves settling

    /// `all(_:maxConcurrent: 2)` whose works are a `sequence` and a `retry` of leaves, all
    /// on `.immediate` or a serial queue: one thread cancels the outer output while the
    /// other settles the leaves made so far (fulfilling some, rejecting others, which
    /// makes the retries and sequences go on). Once all is quiet, the outer output has
    /// settled (cancelled, or rejected by a leaf's error), no leaf and no inner output is left pending, no work or body is called
    /// twice for the same slot, and everything is freed once dropped.
    func testNestedRunsCancelledWhileTheirLeavesSettle() {
        let rounds = 2_000
        let alive = LifeTracker()
        let serial = DispatchQueue(label: "op-race.nested")
        final class Row: @unchecked Sendable {
            let leaves = LockedBox<[Promise<OpRaceFanOutValue>]>([])
            let arrayLeaves = LockedBox<[Promise<[OpRaceFanOutValue]>]>([])
            let inners = LockedBox<[Promise<[OpRaceFanOutValue]>]>([])
            let calls = LockedBox<[String: Int]>([:])
            var output: Promise<[[OpRaceFanOutValue]]>?
            weak var weakOutput: Promise<[[OpRaceFanOutValue]]>?
            func leaf() -> Promise<OpRaceFanOutValue> {
                let p = Promise<OpRaceFanOutValue>()
                leaves.withLock { $0.append(p) }
                return p
            }
            func arrayLeaf() -> Promise<[OpRaceFanOutValue]> {
                let p = Promise<[OpRaceFanOutValue]>()
                arrayLeaves.withLock { $0.append(p) }
                return p
            }
            var allLeaves: [AnyPromise] { leaves.value as [AnyPromise] + arrayLeaves.value as [AnyPromise] }
            func called(_ key: String) { calls.withLock { $0[key, default: 0] += 1 } }
        }
        let rows = (0..<rounds).map { round -> Row in
            let row = Row()
            let token = CaptureToken(alive)
            let context: any ExecutionContext = round.isMultiple(of: 2) ? .immediate : serial
            let output = Promise<[OpRaceFanOutValue]>.all(0..<4, maxConcurrent: 2, on: context) { [unowned row] i -> Promise<[OpRaceFanOutValue]> in
                _ = token
                row.called("outer \(i)")
                let inner: Promise<[OpRaceFanOutValue]>
                if i.isMultiple(of: 2) {
                    inner = Promise<OpRaceFanOutValue>.sequence(on: context, 0..<3) { j in
                        row.called("seq \(i).\(j)")
                        return row.leaf()
                    }
                } else {
                    let attempt = LockedBox(0)
                    inner = Promise<[OpRaceFanOutValue]>.retry(attempts: 3, on: context) {
                        let n = attempt.withLock { $0 += 1; return $0 }
                        row.called("retry \(i).\(n)")
                        return row.arrayLeaf()
                    }
                }
                row.inners.withLock { $0.append(inner) }
                return inner
            }
            row.output = output
            row.weakOutput = output
            return row
        }
        XCTAssertTrue(eventually(timeout: 20) { rows.allSatisfy { $0.allLeaves.count == 2 } }, "setup: two leaves in flight")
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 {
                row.output!.cancel(reason: OperatorError(id: round))
                return
            }
            // Settle what exists, a few passes (each may start more leaves).
            for pass in 0..<3 {
                for (k, leaf) in row.leaves.value.enumerated() where leaf.isPending {
                    if (k + pass).isMultiple(of: 3) { leaf.reject(OperatorError(id: -k)) } else { leaf.fulfill(OpRaceFanOutValue(n: k)) }
                }
                for (k, leaf) in row.arrayLeaves.value.enumerated() where leaf.isPending {
                    if (k + pass).isMultiple(of: 2) { leaf.reject(OperatorError(id: -k)) } else { leaf.fulfill([OpRaceFanOutValue(n: k)]) }
                }
            }
        })
        serial.sync {}
        serial.sync {}
        serial.sync {}
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            // Cancelled, or rejected by a leaf's error that came first (then the run
            // cancelled what was in flight itself).
            if row.output!.isPending || row.output!.isFulfilled { problems.append("round \(round): outer \(row.output!.state)") }
            if !eventually(timeout: 2, { row.allLeaves.allSatisfy { !$0.isPending } }) {
                problems.append("round \(round) ctx \(round.isMultiple(of: 2) ? "imm" : "queue"): \(row.allLeaves.filter(\.isPending).count) leaves left pending, calls \(row.calls.value.keys.sorted())")
            }
            if !eventually(timeout: 2, { row.inners.value.allSatisfy { !$0.isPending } }) {
                problems.append("round \(round): \(row.inners.value.filter(\.isPending).count) inner outputs left pending")
            }
            let twice = row.calls.value.filter { $0.value > 1 }
            if !twice.isEmpty { problems.append("round \(round): called twice: \(twice)") }
            if problems.count > 20 { break }
        }
        for row in rows { row.output = nil; row.inners.withLock { $0 = [] } }
        for (round, row) in rows.enumerated() where problems.count <= 20 {
            if !eventually(timeout: 2, { row.weakOutput == nil }) { problems.append("round \(round): outer output kept") }
        }
        XCTAssertTrue(eventually { alive.alive == 0 }, "captures kept: \(alive.alive)")
        XCTAssertEqual(problems, [], "\(problems.count) problems")
    }

    // MARK: a root's cancel racing its fulfil reaches the operators in flight below

    /// Below a root, an unheld step (`map` or `flatMap`, on `.immediate` or a serial
    /// queue) feeds an operator that stays in flight: a `delay` (Dispatch or a manual
    /// clock), an `after` on a manual clock that a `flatMap` returned, a `retry` whose attempt never settles, a
    /// `sequence` whose step never settles. One thread fulfils the root, the other cancels
    /// it. Whichever wins, the cancel reaches the operator's output (nothing else can
    /// settle it) and, through it, the attempt or step in flight: all end cancelled with
    /// the cancel's reason.
    func testARootsCancelRacingItsFulfilReachesOperatorsInFlightBelowUnheldSteps() {
        let rounds = 4_000
        let serial = DispatchQueue(label: "op-race.below")
        final class Row: @unchecked Sendable {
            let clock = ManualClock()
            var root: Promise<Int>?
            var output: AnyPromise?
            let leaves = LockedBox<[AnyPromise]>([])
            let reason: OperatorError
            let kind: Int
            init(reason: OperatorError, kind: Int) { self.reason = reason; self.kind = kind }
        }
        let rows = (0..<rounds).map { round -> Row in
            let row = Row(reason: OperatorError(id: round), kind: round % 5)
            let root = Promise<Int>()
            let context: any ExecutionContext = (round / 5).isMultiple(of: 2) ? .immediate : serial
            let leaves = row.leaves
            switch row.kind {
            case 0:
                row.output = root.map(on: context) { $0 + 1 }.delay(.seconds(3600))
            case 1:
                row.output = root.map(on: context) { $0 + 1 }.delay(.seconds(3600), clock: row.clock)
            case 2:
                let clock = row.clock
                row.output = root.map(on: context) { $0 + 1 }.flatMap(on: .immediate) { v in
                    Promise<Void>.after(.seconds(3600), clock: clock).map(on: .immediate) { v }
                }
            case 3:
                row.output = root.flatMap(on: context) { _ in
                    Promise<Int>.retry(attempts: 3, on: context) {
                        let p = Promise<Int>()
                        leaves.withLock { $0.append(p) }
                        return p
                    }
                }
            default:
                row.output = root.flatMap(on: context) { _ in
                    Promise<Int>.sequence(on: context, 0..<3) { _ in
                        let p = Promise<Int>()
                        leaves.withLock { $0.append(p) }
                        return p
                    }
                }
            }
            row.root = root
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 0 { row.root!.fulfill(round) } else { row.root!.cancel(reason: row.reason) }
        })
        serial.sync {}
        serial.sync {}
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            let output = row.output!
            if !eventually(timeout: 2, { output.isCancelled }) {
                problems.append("round \(round) kind \(row.kind) ctx \((round / 5).isMultiple(of: 2) ? "imm" : "queue"): output \(output.state), root \(row.root!.state)")
            }
            for leaf in row.leaves.value where !eventually(timeout: 2, { leaf.isCancelled }) {
                problems.append("round \(round) kind \(row.kind): leaf \(leaf.state), root \(row.root!.state)")
            }
            if problems.count > 20 { break }
        }
        XCTAssertEqual(problems, [], "\(problems.count) problems")
        for row in rows { row.output?.cancel(); row.output = nil; row.root = nil }
        // An `after` a handler returned is above the promise it followed: a cancel, which
        // flows down, leaves it sleeping. Its clock wakes it, so that no Task is left
        // suspended for ever on a clock the test drops.
        for row in rows { row.clock.advance(by: .seconds(3600)) }
        XCTAssertTrue(eventually { rows.allSatisfy { $0.clock.sleeperCount == 0 } })
    }

    // MARK: retry: an attempt dropped pending racing a cancel of the output

    /// The attempt in flight is held only by a box: one thread empties the box (the
    /// attempt dies pending, unless the cancel got there first), the other cancels the
    /// output. Each attempt is reported as a broken promise at most once, only on the
    /// thread that dropped it (one the cancel reached first dies cancelled, and is never
    /// reported), and the output ends cancelled with the reason; the second attempt a
    /// broken first one starts is cancelled too.
    func testRetryAttemptDroppedPendingRacingACancelOfTheOutput() {
        let rounds = 10_000
        final class Row: @unchecked Sendable {
            let held = LockedBox<[Promise<OpRaceRetryValue>]>([])
            var output: Promise<OpRaceRetryValue>?
            let reason: OperatorError
            init(reason: OperatorError) { self.reason = reason }
        }
        let reports = LockedBox([String: Int]())
        nonisolated(unsafe) let currentRound = UnsafeMutablePointer<Int>.allocate(capacity: 2)
        currentRound.initialize(repeating: -1, count: 2)
        defer { currentRound.deallocate() }
        PromiseDiagnostics.setHandler { event in
            guard event.promiseType.contains("OpRaceRetryValue"), event.creationSite != nil else { return }
            var place = "elsewhere"
            if let role = Thread.current.threadDictionary["op-race.role"] as? Int {
                place = "\(role == 0 ? "dropper" : "canceller") \(currentRound[role])"
            }
            let kind: String
            switch event.kind {
            case .brokenPromise: kind = "broken"
            case .unhandledRejection: kind = "unhandled"
            case .cycle: kind = "cycle"
            }
            reports.withLock { $0["\(kind) \(place)", default: 0] += 1 }
        }
        let rows = (0..<rounds).map { round -> Row in
            let row = Row(reason: OperatorError(id: round))
            let held = row.held
            row.output = Promise<OpRaceRetryValue>.retry(attempts: 2, on: .immediate) {
                let p = Promise<OpRaceRetryValue>()
                held.withLock { $0.append(p) }
                return p
            }
            return row
        }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            if round == 0 { Thread.current.threadDictionary["op-race.role"] = thread }
            currentRound[thread] = round
            let row = rows[round]
            if thread == 0 {
                spin((round / 2) % 300)
                // Takes the first attempt out of the box, then lets it go here.
                var first: Promise<OpRaceRetryValue>? = row.held.withLock { $0.removeFirst() }
                first = nil
                _ = first
            } else {
                row.output!.cancel(reason: row.reason)
            }
            if round == rounds - 1 { Thread.current.threadDictionary["op-race.role"] = nil }
        })
        var problems: [String] = []
        let seen = reports.value
        for (round, row) in rows.enumerated() {
            if !row.output!.isCancelled { problems.append("round \(round): output \(row.output!.state)") }
            for later in row.held.value where !later.isCancelled { problems.append("round \(round): second attempt \(later.state)") }
            let onDropper = seen["broken dropper \(round)"] ?? 0
            if onDropper > 1 { problems.append("round \(round): attempt reported \(onDropper) times") }
            if problems.count > 20 { break }
        }
        for row in rows { row.output = nil; row.held.withLock { $0 = [] } }
        let stray = reports.value.filter { !$0.key.hasPrefix("broken dropper") }
        XCTAssertEqual(stray, [:], "reports other than the dropper's broken attempts")
        XCTAssertEqual(problems, [], "\(problems.count) problems")
    }

    // MARK: timeout / delay made on a promise while another thread cancels it

    /// One thread makes a `timeout` child (timer never fired) or a `delay` child on a
    /// pending promise while another cancels that promise. The child ends cancelled with
    /// the cancel's reason either way (made before, the cancel flows down to it; made
    /// after, it is made on a cancelled promise), its observer runs once, and nothing is
    /// left scheduled.
    func testTimeoutAndDelayMadeWhileTheirReceiverIsCancelled() {
        let rounds = 8_000
        final class Row: @unchecked Sendable {
            let receiver = Promise<OpRaceTimerValue>()
            var child: Promise<OpRaceTimerValue>?
            let scheduled = LockedBox(0)
            let cancelledTimers = LockedBox(0)
            let observed = Countdown(1)
        }
        let rows = (0..<rounds).map { _ in Row() }
        XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
            let row = rows[round]
            if thread == 1 {
                row.receiver.cancel(reason: OperatorError(id: round))
                return
            }
            let child: Promise<OpRaceTimerValue>
            if round.isMultiple(of: 2) {
                let scheduled = row.scheduled, cancelled = row.cancelledTimers
                child = row.receiver.timeout(.seconds(60), scheduling: { _, _ in
                    scheduled.withLock { $0 += 1 }
                    return { cancelled.withLock { $0 += 1 } }
                })
            } else {
                child = row.receiver.delay(.seconds(3600))
            }
            let observed = row.observed
            child.whenComplete(on: .immediate) { _ in observed.countDown() }
            row.child = child
        })
        var problems: [String] = []
        for (round, row) in rows.enumerated() {
            let child = row.child!
            if !eventually(timeout: 2, { !child.isPending }) { problems.append("round \(round): child pending"); continue }
            var reason: OperatorError?
            if case .failure(let e)? = child.settledResult { reason = e as? OperatorError }
            if !child.isCancelled || reason != OperatorError(id: round) {
                problems.append("round \(round) \(round.isMultiple(of: 2) ? "timeout" : "delay"): child \(child.state) \(String(describing: child.settledResult))")
            }
            if !row.observed.wait(timeout: 2) || row.observed.overshoot != 0 { problems.append("round \(round): observer ran \(row.observed.overshoot + 1)?") }
            if row.scheduled.value != row.cancelledTimers.value { problems.append("round \(round): \(row.scheduled.value) timers set, \(row.cancelledTimers.value) cancelled") }
            if problems.count > 20 { break }
        }
        XCTAssertEqual(problems, [], "\(problems.count) problems")
    }

    // MARK: retry / fan-out of Task-backed attempts, cancelled at once from another thread

    /// The attempts (retry) and works (bounded fan-out) are `Promise { try await ... }`
    /// sleeping an hour; the output is cancelled from another thread as the run starts.
    /// Every Task that started ends promptly (the cancel reached its promise, which
    /// cancels the Task), and the attempts end cancelled.
    func testTaskBackedAttemptsAndWorksEndWhenTheOutputIsCancelled() {
        let started = LockedBox(0), ended = LockedBox(0)
        let made = LockedBox<[Promise<OpRaceRetryValue>]>([])
        @Sendable func sleeper() -> Promise<OpRaceRetryValue> {
            let p = Promise<OpRaceRetryValue> {
                started.withLock { $0 += 1 }
                defer { ended.withLock { $0 += 1 } }
                try await Task.sleep(for: .seconds(3600))
                return OpRaceRetryValue(n: 1)
            }
            made.withLock { $0.append(p) }
            return p
        }
        for round in 0..<400 {
            let output: AnyPromise = round.isMultiple(of: 2)
                ? Promise<OpRaceRetryValue>.retry(attempts: 3, on: .immediate) { sleeper() }
                : Promise<OpRaceRetryValue>.all(0..<5, maxConcurrent: 2, on: .immediate) { _ in sleeper() }
            let done = DispatchSemaphore(value: 0)
            let spins = (round * 31) % 3_000
            Thread {
                spin(spins)
                output.cancel()
                done.signal()
            }.start()
            XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        }
        XCTAssertTrue(eventually(timeout: 20) { started.value == ended.value && made.value.allSatisfy { !$0.isPending } },
                      "Tasks started \(started.value), ended \(ended.value); pending attempts \(made.value.filter(\.isPending).count)")
        XCTAssertEqual(made.value.filter { !$0.isCancelled }.count, 0, "attempts not cancelled")
    }
}
