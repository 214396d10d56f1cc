// The diagnostics hook: broken promises, unhandled rejections and cycles are reported to
// the application's handler, once, with the creation site in debug builds; observed
// rejections never are.
import Dispatch
import Foundation
import Promise
import XCTest

/// An error that says which check made it, so each test finds its own events among those
/// of promises other tests left dying.
private struct Marker: Error, Equatable, CustomStringConvertible {
    let id: Int
    var description: String { "marker \(id)" }
}

private struct BrokenMarker: Sendable {}
private struct CycleMarker: Sendable {}
private struct OnCancelMarker: Sendable {}
private struct TimeoutMarker: Sendable {}
private struct DroppedReceiverMarker: Sendable {}

/// A promise a handler reaches once it exists.
private final class Slot<T>: @unchecked Sendable {
    var value: T?
}

final class DiagnosticsTests: XCTestCase {
    private let events = Recorder<PromiseDiagnostic>()

    override func setUp() {
        super.setUp()
        let events = self.events
        PromiseDiagnostics.setHandler { events.append($0) }
    }

    override func tearDown() {
        PromiseDiagnostics.setHandler(nil)
        super.tearDown()
    }

    private func unhandled(_ id: Int) -> [PromiseDiagnostic] {
        events.values.filter {
            if case .unhandledRejection(let error) = $0.kind { return (error as? Marker)?.id == id }
            return false
        }
    }

    private func events(about type: String) -> [PromiseDiagnostic] {
        events.values.filter { $0.promiseType == type }
    }

    func testAnUnhandledRejectionIsReportedOnceWithItsErrorAndSite() {
        let line: UInt = #line + 1
        do { let promise = Promise<Int>(); promise.reject(Marker(id: 1)) }
        let reported = unhandled(1)
        XCTAssertEqual(reported.count, 1, "\(events.values)")
        XCTAssertEqual(reported.first?.promiseType, "Promise<Int>")
        #if DEBUG
        XCTAssertEqual(reported.first?.creationSite?.description, "\(#fileID):\(line)")
        XCTAssertEqual(reported.first?.description,
                       "a Promise<Int> made at \(#fileID):\(line) was rejected and freed without any observer seeing its error: marker 1")
        #endif
    }

    /// `timeout`'s own clean-up hook on its child reads nothing: a child that timed out and
    /// whose error nobody read is an unhandled rejection like any other; one read is not.
    func testATimedOutChildNobodyReadsIsReportedAndOneReadIsNot() {
        do {
            let source = Promise<TimeoutMarker>()
            let unread = source.timeout(.milliseconds(1))
            let read = source.timeout(.milliseconds(1))
            XCTAssertThrowsError(try read.wait(timeout: testTimeout))
            XCTAssertTrue(eventually { unread.isRejected })
            source.fulfill(TimeoutMarker())
        }
        XCTAssertTrue(eventually { !events(about: "Promise<TimeoutMarker>").isEmpty })
        let reported = events(about: "Promise<TimeoutMarker>")
        XCTAssertEqual(reported.count, 1, "\(reported)")
        guard case .unhandledRejection(PromiseError.timedOut)? = reported.first?.kind else {
            return XCTFail("reported \(reported)")
        }
    }

    func testEveryKindOfObserverCountsAsSeeingTheError() throws {
        // Each makes a rejected promise, observes it one way, and waits for the outcome.
        let observers: [(String, (Promise<Int>) throws -> Void)] = [
            ("catch", { _ = try? $0.catch(on: .immediate) { _ in }.wait(timeout: testTimeout) }),
            ("recover", { _ = try $0.recover(on: .immediate) { _ in 0 }.wait(timeout: testTimeout) }),
            ("whenComplete", { promise in
                let done = Countdown(1)
                promise.whenComplete { _ in done.countDown() }
                XCTAssertTrue(done.wait(timeout: testTimeoutSeconds))
            }),
            ("then, whose child is observed", { promise in
                _ = try? promise.then { $0 + 1 }.recover { _ in 0 }.wait(timeout: testTimeout)
            }),
            ("wait", { _ = try? $0.wait(timeout: testTimeout) }),
            ("all", { _ = try? Promise.all([$0]).recover { _ in [] }.wait(timeout: testTimeout) }),
            ("allSettled", { _ = try Promise.allSettled([$0]).wait(timeout: testTimeout) }),
            ("any", { _ = try? Promise.any([$0]).recover { _ in 0 }.wait(timeout: testTimeout) }),
            ("race", { _ = try? Promise.race([$0]).recover { _ in 0 }.wait(timeout: testTimeout) }),
            ("and", { _ = try? $0.and(Promise(value: 1)).then { $0.0 }.recover { _ in 0 }.wait(timeout: testTimeout) }),
            ("resolve(with:)", { promise in
                let follower = Promise<Int>()
                follower.resolve(with: promise)
                _ = try follower.recover { _ in 0 }.wait(timeout: testTimeout)
            }),
            ("timeout", { _ = try $0.timeout(.seconds(60)).recover { _ in 0 }.wait(timeout: testTimeout) }),
        ]
        for (index, (name, observe)) in observers.enumerated() {
            let id = 100 + index
            let dead = WeakPromise()
            try {
                let promise = Promise<Int>()
                dead.promise = promise
                promise.reject(Marker(id: id))
                try observe(promise)
            }()
            XCTAssertTrue(eventually { dead.promise == nil }, "\(name): the promise was never freed")
            XCTAssertEqual(unhandled(id).count, 0, "\(name) saw the error, yet it was reported: \(unhandled(id))")
        }
        // And one awaited.
        let dead = WeakPromise()
        let awaited = Countdown(1)
        do {
            let promise = Promise<Int>()
            dead.promise = promise
            promise.reject(Marker(id: 199))
            Task { _ = await promise.result; awaited.countDown() }
        }
        XCTAssertTrue(awaited.wait(timeout: testTimeoutSeconds))
        XCTAssertTrue(eventually { dead.promise == nil })
        XCTAssertEqual(unhandled(199).count, 0, "await saw the error, yet it was reported")
    }

    /// A combinator counts as reading every input's error: one its policy never reads
    /// (`any` counting a rejection down), and one that comes after its output settled
    /// (`all`, `and`, `race`), whether the input's slot is still registered or a prune
    /// took it off. (Found by an adversarial pass.)
    func testCombinatorsCountAsReadingEveryInputsError() throws {
        do {
            let a = Promise<Int>(), b = Promise<Int>()
            let any = Promise.any([a, b])
            a.reject(Marker(id: 31))
            b.fulfill(7)
            XCTAssertEqual(try any.wait(timeout: testTimeout), 7)
        }
        do {
            let a = Promise<Int>(), b = Promise<Int>()
            let all = Promise.all([a, b]).recover(on: .immediate) { _ in [] }
            a.reject(Marker(id: 32))
            b.reject(Marker(id: 33))
            XCTAssertEqual(try all.wait(timeout: testTimeout), [])
        }
        do {
            let a = Promise<Int>(), b = Promise<Int>()
            let race = Promise.race([a, b])
            a.fulfill(1)
            XCTAssertEqual(try race.wait(timeout: testTimeout), 1)
            b.reject(Marker(id: 34))
        }
        do {
            let a = Promise<Int>(), b = Promise<String>()
            let both = a.and(b).then { $0.0 }.recover(on: .immediate) { _ in 0 }
            a.reject(Marker(id: 35))
            b.reject(Marker(id: 36))
            XCTAssertEqual(try both.wait(timeout: testTimeout), 0)
        }
        do {  // the slot left its input (pruned) before the input rejected
            let late = Promise<Int>()
            for round in 0..<100 {
                let race = Promise.race([Promise(value: round), late])
                XCTAssertEqual(try race.wait(timeout: testTimeout), round)
            }
            late.reject(Marker(id: 37))
        }
        for id in 31...37 { XCTAssertEqual(unhandled(id).count, 0, "marker \(id): \(events.values)") }
    }

    /// A `timeout` child that settled first (timed out, at once for a deadline past, or
    /// cancelled) counts as reading its receiver's later error, as a combinator does its
    /// inputs': a backend that fails after its request timed out is no unhandled
    /// rejection. (Found by an adversarial pass: each was reported.)
    func testATimeoutChildSettledFirstCountsAsReadingItsReceiversLaterError() throws {
        do {
            let fetch = Promise<Int>()
            let answer = fetch.timeout(.milliseconds(1)).recover(on: .immediate) { _ in -1 }
            XCTAssertEqual(try answer.wait(timeout: testTimeout), -1)
            fetch.reject(Marker(id: 41))
        }
        do {
            let fetch = Promise<Int>()
            let answer = fetch.timeout(until: ContinuousClock.now - .seconds(1)).recover(on: .immediate) { _ in -1 }
            XCTAssertEqual(try answer.wait(timeout: testTimeout), -1)
            fetch.reject(Marker(id: 42))
        }
        do {
            let fetch = Promise<Int>()
            let child = fetch.timeout(.seconds(30))
            child.cancel()
            fetch.reject(Marker(id: 43))
        }
        do {  // the receiver's error came first: the child read it, as before
            let fetch = Promise<Int>()
            let answer = fetch.timeout(.seconds(30)).recover(on: .immediate) { _ in -1 }
            fetch.reject(Marker(id: 44))
            XCTAssertEqual(try answer.wait(timeout: testTimeout), -1)
        }
        do {  // the child settled after the error, before it came (inside the handler that
              // rejected the receiver: the waiter list delivers once the handler returned)
            let gate = Promise<Void>()
            let fetch = Promise<Int>()
            let child = fetch.timeout(.seconds(30))
            let step = gate.then(on: .immediate) { () -> Void in
                fetch.reject(Marker(id: 45))
                child.reject(PromiseError.timedOut)
            }
            gate.fulfill(())
            try step.wait(timeout: testTimeout)
            XCTAssertThrowsError(try child.wait(timeout: testTimeout))
        }
        for id in 41...45 { XCTAssertEqual(unhandled(id).count, 0, "marker \(id): \(events.values)") }
    }

    /// A child settled or cancelled before its handler read the parent's error counts as
    /// reading it, as a `timeout` child and a combinator do: a reply cancelled at teardown,
    /// or a `delay` its holder settled, leaves no unhandled rejection behind. A child
    /// fired with the error whose handler, queued on its context, was then cancelled too.
    func testAChildSettledOrCancelledBeforeItsHandlerReadTheErrorCountsAsReadingIt() {
        do { let a = Promise<Int>(); a.then(on: .immediate) { $0 }.fulfill(0); a.reject(Marker(id: 80)) }
        do { let a = Promise<Int>(); a.recover(on: .immediate) { _ in 0 }.cancel(); a.reject(Marker(id: 81)) }
        do { let a = Promise<Int>(); a.delay(.seconds(30)).cancel(); a.reject(Marker(id: 82)) }
        do { let a = Promise<Int>(); a.delay(.seconds(30)).fulfill(0); a.reject(Marker(id: 83)) }
        do { let a = Promise<Int>(); a.then { $0 }.cancel(); a.reject(Marker(id: 84)) }
        for (id, holds) in [(85, false), (86, true)] {  // fired with the error, then cancelled
            let queue = DispatchQueue(label: "PromiseTests.diagnostics.held")
            let gate = DispatchSemaphore(value: 0)
            queue.async { gate.wait() }
            do {
                let a = Promise<Int>()
                let child = holds ? a.recover(on: queue) { _ in 0 } : a.then(on: queue) { $0 }
                a.reject(Marker(id: id))
                child.cancel()
            }
            gate.signal()
            queue.sync {}
        }
        for id in 80...86 { XCTAssertEqual(unhandled(id).count, 0, "marker \(id): \(events.values)") }
        do { let a = Promise<Int>(); a.reject(Marker(id: 87)) }  // nobody observed it: reported
        XCTAssertEqual(unhandled(87).count, 1, "\(events.values)")
    }

    func testAThenChildNobodyObservesIsReportedAndItsParentIsNot() {
        do {
            let parent = Promise<Int>()
            let child = parent.then(on: .immediate) { $0 + 1 }
            parent.reject(Marker(id: 2))
            XCTAssertTrue(child.isRejected)
        }
        // The parent passed its error on (seen); the child kept it to itself.
        XCTAssertEqual(unhandled(2).count, 1, "\(events.values)")
    }

    func testCancelledAndFulfilledPromisesAreNotReported() {
        let before = events.count
        do {
            let cancelled = Promise<Int>()
            cancelled.cancel(reason: Marker(id: 3))
            _ = Promise(value: 4)
        }
        XCTAssertEqual(unhandled(3).count, 0)
        XCTAssertEqual(events.values.dropFirst(before).filter { $0.promiseType == "Promise<Int>" }.count, 0)
    }

    func testABrokenPromiseIsReportedOnceWithItsSite() throws {
        let line: UInt = #line + 3
        let child: Promise<Int>
        do {
            let dropped = Promise<BrokenMarker>()
            child = dropped.then(on: .immediate) { _ in 1 }
        }
        XCTAssertThrowsError(try child.wait(timeout: testTimeout)) {
            guard case PromiseError.brokenPromise? = $0 as? PromiseError else { return XCTFail("\($0)") }
        }
        let reported = events(about: "Promise<BrokenMarker>")
        XCTAssertEqual(reported.count, 1, "\(events.values)")
        guard case .brokenPromise? = reported.first?.kind else { return XCTFail("\(reported)") }
        #if DEBUG
        XCTAssertEqual(reported.first?.description,
                       "a Promise<BrokenMarker> made at \(#fileID):\(line) was freed while pending, with observers waiting: they receive PromiseError.brokenPromise")
        #endif
    }

    func testAPendingPromiseDroppedWithoutObserversIsNotBroken() {
        do { _ = Promise<BrokenMarker>() }
        // Nor one whose only waiters gave up (a timed-out wait leaves no waiter behind).
        do {
            let polled = Promise<BrokenMarker>()
            XCTAssertThrowsError(try polled.wait(timeout: .milliseconds(1)))
        }
        // Nor one whose only observers are cancelled children, however many (a prune may
        // or may not have taken them off yet).
        for count in [1, 9] {
            let left = Promise<BrokenMarker>()
            for _ in 0..<count { left.then(on: .immediate) { _ in 1 }.cancel() }
        }
        XCTAssertEqual(events(about: "Promise<BrokenMarker>").count, 0, "\(events.values)")
    }

    /// Nor one whose only observers are children with an error side that settled
    /// otherwise (cancelled, or settled by their holder): that side waits for a cancel of
    /// the parent, for clean-up, which freeing is not; nothing receives the broken
    /// promise's error, and `debugDescription` says that no observer waits.
    func testAPendingPromiseWhoseChildrenSettledOtherwiseIsNotBroken() {
        let ran = Counter()
        var descriptions: [String] = []
        for count in [1, 9] {
            do {
                let parent = Promise<BrokenMarker>()
                for _ in 0..<count { parent.catch(on: .immediate) { _ in ran.increment() }.cancel() }
                descriptions.append(parent.debugDescription)
            }
            do {
                let parent = Promise<BrokenMarker>()
                for _ in 0..<count {
                    parent.recover(on: .immediate) { _ -> BrokenMarker in ran.increment(); return BrokenMarker() }
                        .fulfill(BrokenMarker())
                }
                descriptions.append(parent.debugDescription)
            }
        }
        XCTAssertEqual(events(about: "Promise<BrokenMarker>").count, 0, "\(events.values)")
        XCTAssertEqual(ran.value, 0, "an error side ran on a promise that was freed")
        for description in descriptions { XCTAssertTrue(description.contains("no observers waiting"), description) }
    }

    func testACycleIsReportedOnce() throws {
        let a = Promise<CycleMarker>(), b = Promise<CycleMarker>()
        a.resolve(with: b)
        b.resolve(with: a)
        for promise in [a, b] {
            XCTAssertThrowsError(try promise.wait(timeout: testTimeout)) {
                guard case PromiseError.cycle? = $0 as? PromiseError else { return XCTFail("\($0)") }
            }
        }
        let cycles = events(about: "Promise<CycleMarker>").filter {
            if case .cycle = $0.kind { return true }
            return false
        }
        XCTAssertEqual(cycles.count, 1, "\(events.values)")
    }

    /// Two lock-ins closing one cycle at the same instant, on two threads, may each see it:
    /// both promises reject themselves and each is reported. Every round reports the
    /// cycle, once or twice, never one promise twice.
    func testACycleClosedFromTwoThreadsAtOnceIsReportedOncePerPromiseThatClosedIt() {
        var reportedTwice = 0
        for round in 0..<300 {
            let before = events(about: "Promise<CycleMarker>").count
            let lineA: UInt = #line + 1
            let a = Promise<CycleMarker>()
            let b = Promise<CycleMarker>()
            XCTAssertTrue(raceOnThreads(threads: 2, rounds: 1) { thread, _ in
                if thread == 0 { a.resolve(with: b) } else { b.resolve(with: a) }
            })
            for promise in [a, b] {
                XCTAssertThrowsError(try promise.wait(timeout: testTimeout)) {
                    guard case PromiseError.cycle? = $0 as? PromiseError else { return XCTFail("round \(round): \($0)") }
                }
            }
            let cycles = events(about: "Promise<CycleMarker>").dropFirst(before).filter {
                if case .cycle = $0.kind { return true }
                return false
            }
            XCTAssertTrue((1...2).contains(cycles.count), "round \(round): \(cycles)")
            if cycles.count == 2 {
                reportedTwice += 1
                #if DEBUG
                let sites = Set(cycles.compactMap { $0.creationSite?.line })
                XCTAssertEqual(sites, [lineA, lineA + 1], "round \(round): one promise reported twice")
                #endif
            }
        }
        print("a cycle closed from two threads reported for both promises in \(reportedTwice) of 300 rounds")
    }

    func testWithoutAHandlerNothingIsReported() {
        PromiseDiagnostics.setHandler(nil)
        do { Promise<Int>().reject(Marker(id: 5)) }
        XCTAssertEqual(unhandled(5).count, 0)
        // A handler set again reports again, to the new handler only.
        let second = Recorder<PromiseDiagnostic>()
        PromiseDiagnostics.setHandler { second.append($0) }
        do { Promise<Int>().reject(Marker(id: 6)) }
        XCTAssertEqual(unhandled(6).count, 0)
        XCTAssertEqual(second.values.filter { "\($0)".hasSuffix("marker 6") }.count, 1)
    }

    func testDebugDescriptionNamesTheCreationSite() {
        let line = #line + 1
        let promise = Promise<Int>()
        #if DEBUG
        XCTAssertTrue(String(reflecting: promise).contains(", made at \(#fileID):\(line),"), String(reflecting: promise))
        #else
        XCTAssertFalse(String(reflecting: promise).contains("made at"))
        #endif
        XCTAssertFalse(String(reflecting: promise.then { $0 }).contains("made at"), "continuations record no site")
    }

    /// A fire-and-forget `catch` handled the error: the child it returns, which passes the
    /// error on and which nobody keeps, is no unhandled rejection.
    func testAFireAndForgetCatchHandlesTheError() {
        let logged = Counter()
        do {
            let promise = Promise<Int>()
            promise.catch(on: .immediate) { _ in logged.increment() }
            promise.reject(Marker(id: 40))
        }
        XCTAssertEqual(logged.value, 1)
        XCTAssertEqual(unhandled(40).count, 0, "\(events.values)")
        // `always` does not read the error: its child, dropped, still reports it.
        do {
            let promise = Promise<Int>()
            promise.always(on: .immediate) {}
            promise.reject(Marker(id: 41))
        }
        XCTAssertEqual(unhandled(41).count, 1, "\(events.values)")
    }

    /// A `catch` child settled by someone else while the handler ran carries an error the
    /// handler never saw: unread, it is reported.
    func testACatchChildSettledOtherwiseStillReportsItsOwnError() {
        let slot = Slot<Promise<Int>>()
        do {
            let promise = Promise<Int>()
            let child = promise.catch(on: .immediate) { _ in slot.value?.reject(Marker(id: 43)) }
            slot.value = child
            promise.reject(Marker(id: 42))
            slot.value = nil
        }
        XCTAssertEqual(unhandled(42).count, 0, "\(events.values)")
        XCTAssertEqual(unhandled(43).count, 1, "\(events.values)")
    }

    /// A run counts as reading its step's error, also when the step fails after the run's
    /// output settled, as a combinator does for its inputs.
    func testARunReadsItsStepsErrorAfterItsOutputSettled() {
        do {
            let step = Promise<Int>()
            let output = Promise.retry(attempts: 2, on: .immediate) { step }
            output.reject(Marker(id: 51))
            step.reject(Marker(id: 50))
            _ = error(output)
        }
        XCTAssertEqual(unhandled(50).count, 0, "\(events.values)")
    }

    /// A step that outlives many runs, each settled from outside before the step did:
    /// every run stopped watching it, counting as reading its error, so the error it gets
    /// at last is not reported, whichever prune took the runs' observers off (`race`
    /// already behaved so).
    func testALongLivedStepOfRunsSettledFromOutsideIsNotReported() {
        do {
            let shared = Promise<Int>()
            for _ in 0..<40 { Promise.retry(attempts: 1, on: .immediate) { shared }.fulfill(0) }
            shared.reject(Marker(id: 52))
        }
        do {
            let shared = Promise<Int>()
            for _ in 0..<40 { Promise.sequence(on: .immediate, [1]) { _ in shared }.fulfill([]) }
            shared.reject(Marker(id: 53))
        }
        do {
            let shared = Promise<Int>()
            for _ in 0..<40 { Promise.all([1], maxConcurrent: 1, on: .immediate) { _ in shared }.fulfill([]) }
            shared.reject(Marker(id: 54))
        }
        XCTAssertEqual(unhandled(52).count, 0, "retry: \(events.values)")
        XCTAssertEqual(unhandled(53).count, 0, "sequence: \(events.values)")
        XCTAssertEqual(unhandled(54).count, 0, "all(_:maxConcurrent:): \(events.values)")
    }

    /// A step that the work returns after the run stopped (its output cancelled or settled
    /// while the work ran) is taken by the run all the same: its error is read, not
    /// reported, whether it already has one or gets it later.
    func testAStepReturnedAfterTheRunStoppedIsNotReported() {
        for (id, cancels) in [(55, true), (56, false)] {
            let queue = DispatchQueue(label: "diagnostics.run")
            let entered = DispatchSemaphore(value: 0), gate = DispatchSemaphore(value: 0)
            do {
                let output = Promise.all([1], maxConcurrent: 1, on: queue) { _ -> Promise<Int> in
                    entered.signal()
                    gate.wait()
                    return Promise(error: Marker(id: id))
                }
                XCTAssertEqual(entered.wait(timeout: .now() + testTimeoutSeconds), .success)
                if cancels { output.cancel() } else { output.fulfill([]) }
                gate.signal()
                queue.sync {}  // the work returned its step, and the run let go of it
            }
            XCTAssertEqual(unhandled(id).count, 0, "output cancelled: \(cancels): \(events.values)")
        }
    }

    /// An `onCancel` handler waits for a cancel, which freeing is not: a promise with only
    /// that, dropped pending, is no broken promise (and its handler does not run).
    func testAPromiseWithOnlyAnOnCancelHandlerDroppedPendingIsNotBroken() {
        let ran = Counter()
        do {
            let promise = Promise<OnCancelMarker>()
            promise.onCancel { ran.increment() }
        }
        XCTAssertEqual(events(about: "Promise<OnCancelMarker>").count, 0, "\(events.values)")
        XCTAssertEqual(ran.value, 0)
        // With another observer it is.
        do {
            let promise = Promise<OnCancelMarker>()
            promise.onCancel { ran.increment() }
            promise.whenComplete(on: .immediate) { _ in }
        }
        XCTAssertEqual(events(about: "Promise<OnCancelMarker>").count, 1, "\(events.values)")
    }

    /// Promises the library makes for the caller (combinators' outputs, timers) record no
    /// creation site: the library's own source would name nothing useful.
    func testPromisesTheLibraryMakesRecordNoSite() {
        let outputs: [(String, AnyPromise)] = [
            ("all", Promise.all([Promise<Int>()])),
            ("allSettled", Promise.allSettled([Promise<Int>()])),
            ("any", Promise.any([Promise<Int>()])),
            ("race", Promise.race([Promise<Int>()])),
            ("and", Promise<Int>().and(Promise<Int>())),
            ("all(maxConcurrent:)", Promise<Int>.all([1], maxConcurrent: 1, on: .immediate) { _ in Promise<Int>() }),
            ("sequence", Promise<Int>.sequence(on: .immediate, [1]) { _ in Promise<Int>() }),
            ("retry", Promise<Int>.retry(attempts: 1, on: .immediate) { Promise<Int>() }),
            ("retry(attempts: 0)", Promise<Int>.retry(attempts: 0) { Promise<Int>() }),
            ("after", Promise<Void>.after(.seconds(100))),
            ("wrap", Promise<Int>.wrap { (_: @escaping @Sendable (Result<Int, any Error>) -> Void) in }),
        ]
        for (name, output) in outputs {
            XCTAssertFalse(String(reflecting: output).contains("made at"), "\(name): \(String(reflecting: output))")
            output.cancel()
        }
    }

    /// Work a context let go of unrun is reported once, as a broken promise whose work
    /// was dropped, with the site where it was made: not as a promise freed pending (it
    /// was not), and not again as an unhandled rejection once freed unread. Before, a
    /// fire-and-forget child so broken was reported as an unhandled rejection saying the
    /// promise had been dropped, and `Promise(on:)`'s work not at all.
    func testWorkADroppingContextLetGoOfIsReportedOnceAsLost() {
        struct LostWorkMarker: Sendable {}
        let line: UInt = #line + 1
        do { _ = Promise(value: 1).then(on: DroppingContext()) { _ in LostWorkMarker() } }
        let work = Promise<LostWorkMarker>(on: DroppingContext()) { LostWorkMarker() }
        XCTAssertNotNil(error(work))
        XCTAssertTrue(eventually { self.events(about: "Promise<LostWorkMarker>").count >= 2 })
        _ = try? Promise<Void>.after(.milliseconds(50)).wait(timeout: testTimeout)  // a second report, had it come
        let reported = events(about: "Promise<LostWorkMarker>")
        XCTAssertEqual(reported.count, 2, "\(reported)")
        for event in reported {
            guard case .brokenPromise = event.kind else { return XCTFail("\(event)") }
            XCTAssertTrue(event.description.contains("lost its work: the context it was handed to let go of it unrun"), "\(event)")
        }
        #if DEBUG
        XCTAssertTrue(reported.contains { $0.creationSite?.line == line + 1 }, "\(reported)")
        #endif
    }
}

extension DiagnosticsTests {
    /// A receiver dropped pending on one thread while another settles its only child
    /// (the `timeout` timer firing, a `delay` or `then` child's holder rejecting it): the
    /// child's settle looks above for a cancel through a brief strong reference, and when
    /// that is the receiver's last, the receiver dies inside the settle, its child claimed
    /// but still listed. Such a receiver is no broken promise anyone receives: no order of
    /// the two calls reports it (the drop first breaks the child, and the settle then
    /// loses; the settle first takes the child off). Both orders must occur for the rounds
    /// to mean anything.
    func testAReceiverDyingInsideItsChildsSettleIsNotReportedBroken() {
        let rounds = 4_000
        let settlerReports = Counter(), dropperReports = Counter()
        PromiseDiagnostics.setHandler { event in
            guard event.promiseType == "Promise<DroppedReceiverMarker>", case .brokenPromise = event.kind else { return }
            _ = Thread.current.threadDictionary["settler"] != nil ? settlerReports.increment() : dropperReports.increment()
        }
        final class Row: @unchecked Sendable {
            var receiver: Promise<DroppedReceiverMarker>?
            var child: Promise<DroppedReceiverMarker>?
            var settle: (@Sendable () -> Void)?
        }
        for shape in ["timeout", "delay", "then"] {
            // Batches until both orders occurred. The drop is the slower call, so it wins
            // only when the settle waits long enough, and how long is enough differs by
            // machine: the sweep delays either side, doubling its reach each batch.
            var sawBroken = false, sawKept = false
            for batch in 0..<8 where !(sawBroken && sawKept) {
                let settlerBefore = settlerReports.value, dropperBefore = dropperReports.value
                let rows = (0..<rounds).map { _ -> Row in
                    let row = Row()
                    let receiver = Promise<DroppedReceiverMarker>()
                    switch shape {
                    case "timeout":
                        row.child = receiver.timeout(.seconds(60), scheduling: { _, fire in
                            row.settle = fire
                            return {}
                        })
                    case "delay":
                        row.child = receiver.delay(.seconds(3600))
                    default:
                        row.child = receiver.then(on: .immediate) { $0 }
                    }
                    if row.settle == nil { row.settle = { [unowned row] in _ = row.child?.reject(Marker(id: 9)) } }
                    row.receiver = receiver
                    return row
                }
                XCTAssertTrue(raceOnThreads(threads: 2, rounds: rounds) { thread, round in
                    if thread == 1 && round == 0 { Thread.current.threadDictionary["settler"] = true }
                    let delaysTheDrop = round % 800 < 400
                    if delaysTheDrop == (thread == 0) {
                        var spin = 0
                        for i in 0..<((round % 400) << batch) { spin &+= i }
                        _ = spin
                    }
                    if thread == 0 {
                        rows[round].receiver = nil
                    } else {
                        rows[round].settle?()
                    }
                    if thread == 1 && round == rounds - 1 { Thread.current.threadDictionary["settler"] = nil }
                })
                let broken = rows.filter { isPromiseError($0.child.map { outcome($0, timeout: 1) } ?? nil, .brokenPromise) }.count
                XCTAssertEqual(settlerReports.value - settlerBefore, 0, "\(shape): reported from inside the child's settle")
                // A child that received the broken promise's error was reported (from the
                // dropping thread, where the receiver died).
                XCTAssertGreaterThanOrEqual(dropperReports.value - dropperBefore, broken, shape)
                sawBroken = sawBroken || broken > 0
                sawKept = sawKept || broken < rounds
                for row in rows { row.child = nil; row.settle = nil }
            }
            XCTAssertTrue(sawBroken && sawKept, "\(shape): one order never occurred in eight batches (broken: \(sawBroken), kept: \(sawKept))")
        }
    }
}
