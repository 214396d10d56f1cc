// Races on execution contexts: registration order on serial contexts while
// the promise settles on another thread (through every way a promise can settle), the
// barrier rule on concurrent queues for every form that runs user code, no Zalgo from
// inside the context's own queue, custom contexts that delay, outlive their owners or
// drop a later step of a run.
import Dispatch
import Foundation
import Promise
import XCTest

#if canImport(Glibc)
import Glibc
#endif

// MARK: Contexts

/// A user's context forwarding to a serial queue (a class: stored as one word).
private final class SerialForwardingContext: ExecutionContext, @unchecked Sendable {
    let queue = DispatchQueue(label: "AdversarialContextTests.SerialForwarding")
    func execute(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }
}

/// A user's context forwarding to a serial queue, larger than two words (boxed).
private struct LargeSerialContext: ExecutionContext {
    let queue: DispatchQueue
    let padding: (Int, Int, Int, Int) = (1, 2, 3, 4)
    func execute(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }
}


// MARK: Ordering

/// How the promise under test settles.
private enum SettleMode: String, CaseIterable {
    case fulfil, reject, cancel
    case cancelledThroughAncestor   // P = A.then(.immediate); A.cancel()
    case fulfilledByImmediateHandler // P = A.then(.immediate); A.fulfill()
    case fulfilledByDefaultHandler   // P = A.then(.default); A.fulfill()
    case recovered                   // P = A.recover(.immediate); A.reject()
    case followed                    // P = A.flatMap { Q }; Q.fulfill()
    case followedRejected            // P = A.flatMap { Q }; Q.reject()
    case broken                      // P dropped by every owner while pending
}

/// One round's state.
private final class OrderRound: @unchecked Sendable {
    let promise: Promise<Int>?
    let settle: @Sendable () -> Void
    let holders: [Handoff<Promise<Int>>]
    let records = Recorder<(thread: Int, index: Int, kind: Int)>()
    let registered = Recorder<(thread: Int, index: Int, kind: Int)>()

    init(mode: SettleMode, threads: Int) {
        let p: Promise<Int>
        switch mode {
        case .fulfil:
            p = Promise<Int>()
            settle = { [p] in _ = p.fulfill(1) }
        case .reject:
            p = Promise<Int>()
            settle = { [p] in _ = p.reject(TestError(1)) }
        case .cancel:
            p = Promise<Int>()
            settle = { [p] in p.cancel(reason: TestError(2)) }
        case .cancelledThroughAncestor:
            let a = Promise<Int>()
            p = a.then(on: .immediate) { $0 }
            settle = { a.cancel(reason: TestError(3)) }
        case .fulfilledByImmediateHandler:
            let a = Promise<Int>()
            p = a.then(on: .immediate) { $0 + 1 }
            settle = { _ = a.fulfill(0) }
        case .fulfilledByDefaultHandler:
            let a = Promise<Int>()
            p = a.then(on: .default) { $0 + 1 }
            settle = { _ = a.fulfill(0) }
        case .recovered:
            let a = Promise<Int>()
            p = a.recover(on: .immediate) { _ in 1 }
            settle = { _ = a.reject(TestError(4)) }
        case .followed, .followedRejected:
            let a = Promise<Int>()
            let q = Promise<Int>()
            p = a.flatMap(on: .immediate) { _ in q }
            _ = a.fulfill(0)
            let reject = mode == .followedRejected
            settle = { if reject { _ = q.reject(TestError(5)) } else { _ = q.fulfill(1) } }
        case .broken:
            p = Promise<Int>()
            settle = {}
        }
        if mode == .broken {
            holders = (0..<threads).map { _ in Handoff(p) }
            promise = nil
        } else {
            holders = []
            promise = p
        }
    }
}

/// Which handler kinds run for an outcome: 0 then, 1 whenComplete, 3 always, 5 two-handler
/// then, 6 recover, 7 catch, 9 mapError, 10 validate. The others are noise on other contexts.
private func kindRuns(_ kind: Int, fulfilled: Bool) -> Bool {
    switch kind {
    case 1, 3, 5: return true
    case 0, 10: return fulfilled
    case 6, 7, 9: return !fulfilled
    default: return false
    }
}

private let kindCount = 11

/// Registers handler `kind` on `p`, recording `(thread, index, kind)` when a recorded kind
/// runs on `context`.
private func register(_ kind: Int, on p: Promise<Int>, context: any ExecutionContext, noise: DispatchQueue,
                      thread: Int, index: Int, records: Recorder<(thread: Int, index: Int, kind: Int)>) {
    let mark: @Sendable () -> Void = { records.append((thread, index, kind)) }
    switch kind {
    case 0: _ = p.then(on: context) { v -> Int in mark(); return v }
    case 1: p.whenComplete(on: context) { _ in mark() }
    case 2: _ = p.then(on: .immediate) { $0 + 1 }
    case 3: _ = p.always(on: context) { mark() }
    case 4: _ = p.then(on: noise) { $0 + 1 }
    case 5: _ = p.then(on: context, { v -> Int in mark(); return v }, { _ -> Int in mark(); return 0 })
    case 6: _ = p.recover(on: context) { _ -> Int in mark(); return 0 }
    case 7: _ = p.catch(on: context) { _ in mark() }
    case 8: p.whenComplete(on: .default) { _ in }
    case 9: _ = p.mapError(on: context) { e -> any Error in mark(); return e }
    case 10: _ = p.validate(on: context) { _ in mark(); return true }
    default: break
    }
}

final class AdversarialContextTests: XCTestCase {

    /// Serial contexts whose order the documentation promises.
    private func serialContexts() -> [(String, any ExecutionContext)] {
        var list: [(String, any ExecutionContext)] = [
            ("serial DispatchQueue", DispatchQueue(label: "AdversarialContextTests.serial")),
            ("concurrent DispatchQueue (barrier)", DispatchQueue(label: "AdversarialContextTests.concurrent", attributes: .concurrent)),
            ("custom serial context (class)", SerialForwardingContext()),
            ("custom serial context (boxed struct)", LargeSerialContext(queue: DispatchQueue(label: "AdversarialContextTests.large"))),
        ]
        #if Foundation
        let opQueue = OperationQueue()
        opQueue.maxConcurrentOperationCount = 1
        list.append(("OperationQueue, max 1", opQueue))
        #endif
        return list
    }

    /// Runs `rounds` rounds for `mode` on `context`: `threads` threads register handlers
    /// on one promise (one per round) while another thread settles it; each thread's
    /// handlers that run on `context` must run in that thread's registration order.
    private func checkPerThreadOrder(context name: String, _ context: any ExecutionContext, mode: SettleMode,
                                     rounds: Int, threads: Int = 3, perThread: Int = 44,
                                     problems: Recorder<String>, checkedRuns: Counter) {
        let noise = DispatchQueue(label: "AdversarialContextTests.noise")
        let state = (0..<rounds).map { _ in OrderRound(mode: mode, threads: threads) }
        let finished = raceOnThreads(threads: threads + 1, rounds: rounds) { thread, round in
            let r = state[round]
            if thread == threads {
                // The settler: at a different point of the registrations each round.
                busyWork(microseconds: (round * 37) % 150)
                r.settle()
                return
            }
            let p: Promise<Int>
            if let promise = r.promise { p = promise } else {
                guard let held = r.holders[thread].take() else { return }
                p = held
                // Let the last owner drop it at a varying point: sleep-free yield.
                if round % 2 == 0 { sched_yield() }
            }
            for index in 0..<perThread {
                let kind = (index * 7 + thread + round) % kindCount
                r.registered.append((thread, index, kind))
                register(kind, on: p, context: context, noise: noise, thread: thread, index: index, records: r.records)
            }
        }
        guard finished else { return problems.append("\(name)/\(mode): threads did not finish") }
        for (round, r) in state.enumerated() {
            let fulfilled: Bool
            if let p = r.promise {
                guard let result = outcome(p) else {
                    problems.append("\(name)/\(mode) round \(round): promise never settled"); continue
                }
                if case .success = result { fulfilled = true } else { fulfilled = false }
            } else {
                fulfilled = false
            }
            let expected = r.registered.values.filter { kindRuns($0.kind, fulfilled: fulfilled) }.count
            if !eventually(timeout: 10, { r.records.count >= expected }) {
                problems.append("\(name)/\(mode) round \(round): \(r.records.count) of \(expected) handlers ran")
                continue
            }
            let records = r.records.values
            checkedRuns.increment(by: records.count)
            if records.count != expected {
                problems.append("\(name)/\(mode) round \(round): \(records.count) runs, expected \(expected)")
            }
            for thread in 0..<threads {
                let seen = records.filter { $0.thread == thread }.map(\.index)
                if seen != seen.sorted() || Set(seen).count != seen.count {
                    problems.append("\(name)/\(mode) round \(round) thread \(thread): order \(seen)")
                }
            }
        }
    }

    /// Handlers on one promise with one serial context run in registration order, per
    /// registering thread, whichever way the promise settles while threads register.
    func testSerialContextsKeepEachThreadsRegistrationOrderWhateverSettlesThePromise() {
        let problems = Recorder<String>()
        let checkedRuns = Counter()
        for (name, context) in serialContexts() {
            for mode in SettleMode.allCases {
                checkPerThreadOrder(context: name, context, mode: mode, rounds: 40, problems: problems, checkedRuns: checkedRuns)
            }
        }
        XCTAssertGreaterThan(checkedRuns.value, 50_000, "the check saw too few runs to mean anything")
        XCTAssertEqual(problems.values.prefix(20).map { $0 }, [])
    }

    /// Registrations serialised by a lock (so that "registration order" is one total
    /// order, the lock's) on three threads, with `.immediate` ones interleaved, while a
    /// fourth thread settles the promise: the serial queue runs them in that order.
    func testSerialQueueKeepsTheTotalOrderOfLockSerialisedRegistrationsAcrossTheSettle() {
        let queue = DispatchQueue(label: "AdversarialContextTests.serial.tickets")
        let problems = Recorder<String>()
        let rounds = 150
        let promises = (0..<rounds).map { _ in Promise<Int>() }
        let orders = (0..<rounds).map { _ in Recorder<Int>() }
        let tickets = (0..<rounds).map { _ in Counter() }
        let lock = NSLock()
        let finished = raceOnThreads(threads: 4, rounds: rounds) { thread, round in
            let p = promises[round], order = orders[round]
            if thread == 3 {
                busyWork(microseconds: (round * 13) % 120)
                _ = p.fulfill(round)
                return
            }
            for index in 0..<50 {
                lock.lock()
                let ticket = tickets[round].increment()
                switch index % 4 {
                case 0: _ = p.then(on: queue) { v -> Int in order.append(ticket); return v }
                case 1: p.whenComplete(on: queue) { _ in order.append(ticket) }
                case 2: _ = p.always(on: queue) { order.append(ticket) }
                default: _ = p.then(on: .immediate) { $0 }; order.append(-1)  // inline marker, ignored
                }
                lock.unlock()
            }
        }
        XCTAssertTrue(finished)
        for round in 0..<rounds {
            let order = orders[round]
            let expected = tickets[round].value  // every ticket, including the inline ones
            if !eventually(timeout: 10, { order.count >= expected }) {
                problems.append("round \(round): \(order.count) of \(expected)"); continue
            }
            let queued = order.values.filter { $0 >= 0 }
            if queued != queued.sorted() { problems.append("round \(round): \(queued)") }
        }
        XCTAssertEqual(Array(problems.values.prefix(5)), [])
    }

    /// A `then` chain on a serial queue: children of one promise run in order also when
    /// the parent is cancelled while handlers of a previous settle are still queued on a
    /// suspended queue (error sides go to the queue at the cancel, the earlier handlers
    /// were queued first).
    func testErrorSidesOfACancelRunAfterHandlersQueuedBeforeOnTheSameSerialQueue() {
        let problems = Recorder<String>()
        for round in 0..<100 {
            let queue = heldQueue()
            let order = Recorder<String>()
            let a = Promise<Int>()
            let b = Promise<Int>()
            // Handlers on `a` queued first (fulfilled), then `b` cancelled: its error sides
            // must come after, in registration order among themselves.
            for i in 0..<5 { a.whenComplete(on: queue) { _ in order.append("a\(i)") } }
            for i in 0..<5 {
                switch i % 3 {
                case 0: _ = b.recover(on: queue) { _ -> Int in order.append("b\(i)"); return 0 }
                case 1: b.whenComplete(on: queue) { _ in order.append("b\(i)") }
                default: _ = b.always(on: queue) { order.append("b\(i)") }
                }
            }
            _ = a.fulfill(1)
            b.cancel(reason: TestError(round))
            for i in 5..<8 { _ = b.catch(on: queue) { _ in order.append("b\(i)") } }
            queue.resume()
            let expected = (0..<5).map { "a\($0)" } + (0..<8).map { "b\($0)" }
            if !eventually(timeout: 10, { order.count >= expected.count }) || order.values != expected {
                problems.append("round \(round): \(order.values)")
            }
        }
        XCTAssertEqual(problems.values.prefix(5).map { $0 }, [])
    }

    // MARK: Barriers

    /// Every form that runs user code on a concurrent queue you created runs it as a
    /// barrier: never alongside another handler, nor alongside plain blocks on the queue
    /// (`async`, and `.concurrent(queue)` handlers), which themselves may overlap.
    func testEveryFormOnAConcurrentQueueRunsAsABarrier() {
        let queue = DispatchQueue(label: "AdversarialContextTests.rw", attributes: .concurrent)
        final class Exclusion: @unchecked Sendable {
            let lock = NSLock()
            var barrierActive = 0, plainActive = 0, plainPeak = 0
            var violations: [String] = []
        }
        let ex = Exclusion()
        let total = Countdown()
        @Sendable func barrier(_ label: String) {
            ex.lock.lock()
            if ex.barrierActive != 0 || ex.plainActive != 0 {
                ex.violations.append("\(label): barrier \(ex.barrierActive), plain \(ex.plainActive)")
            }
            ex.barrierActive += 1
            ex.lock.unlock()
            busyWork(microseconds: 30)
            ex.lock.lock(); ex.barrierActive -= 1; ex.lock.unlock()
            total.countDown()
        }
        @Sendable func plain(_ label: String) {
            ex.lock.lock()
            if ex.barrierActive != 0 { ex.violations.append("\(label) alongside a barrier") }
            ex.plainActive += 1
            ex.plainPeak = max(ex.plainPeak, ex.plainActive)
            ex.lock.unlock()
            busyWork(microseconds: 60)
            ex.lock.lock(); ex.plainActive -= 1; ex.lock.unlock()
            total.countDown()
        }
        let keep = Recorder<AnyPromise>()
        let finished = raceOnThreads(threads: 3, rounds: 40) { thread, round in
            switch thread {
            case 0:
                // Handlers of every form, registered on pending promises settled by the
                // next thread and on settled ones.
                let p = Promise<Int>(), r = Promise<Int>(), c = Promise<Int>()
                total.add(14)
                keep.append(p.then(on: queue) { v -> Int in barrier("then"); return v })
                keep.append(p.flatMap(on: queue) { v -> Promise<Int> in barrier("flatMap"); return Promise(value: v) })
                keep.append(p.validate(on: queue) { _ in barrier("validate"); return true })
                p.whenComplete(on: queue) { _ in barrier("whenComplete") }
                keep.append(p.always(on: queue) { barrier("always") })
                keep.append(r.recover(on: queue) { _ -> Int in barrier("recover"); return 0 })
                keep.append(r.recover(on: queue) { _ -> Promise<Int> in barrier("recover->P"); return Promise(value: 0) })
                keep.append(r.mapError(on: queue) { e -> any Error in barrier("mapError"); return e })
                keep.append(r.catch(on: queue) { _ in barrier("catch") })
                keep.append(c.recover(on: queue) { _ -> Int in barrier("cancel error side"); return 0 })
                keep.append(c.then(on: queue, { v -> Int in v }, { _ -> Int in barrier("cancel two-handler"); return 0 }))
                c.whenComplete(on: queue) { _ in barrier("cancel whenComplete") }
                keep.append(Promise(value: round).then(on: queue) { v -> Int in barrier("then on settled"); return v })
                keep.append(Promise<Int>(on: queue) { barrier("Promise(on:)"); return 1 })
                DispatchQueue.global().async {
                    _ = p.fulfill(round)
                    _ = r.reject(TestError(round))
                    c.cancel(reason: TestError(round))
                }
            case 1:
                // The runs: retry (body and shouldRetry), sequence, all(maxConcurrent:).
                total.add(2 + 1 + 3 + 3)
                let tries = Counter()
                keep.append(Promise<Int>.retry(attempts: 2, backoff: .fixed(.zero), on: queue, shouldRetry: { _ in
                    barrier("shouldRetry"); return true
                }) {
                    barrier("retry body")
                    return tries.increment() == 1 ? Promise(error: TestError(0)) : Promise(value: 1)
                })
                keep.append(Promise<Int>.sequence(0..<3, on: queue) { i in barrier("sequence"); return Promise(value: i) })
                keep.append(Promise<Int>.all(0..<3, maxConcurrent: 2, on: queue) { i in barrier("all(max:)"); return Promise(value: i) })
            default:
                // Plain blocks on the queue, and non-barrier handlers.
                total.add(8)
                let p = Promise<Int>()
                for _ in 0..<4 { queue.async { plain("async") } }
                for _ in 0..<4 { keep.append(p.then(on: .concurrent(queue)) { v -> Int in plain(".concurrent"); return v }) }
                _ = p.fulfill(round)
            }
        }
        XCTAssertTrue(finished)
        XCTAssertTrue(total.wait(timeout: 30), "not every handler ran")
        XCTAssertEqual(total.overshoot, 0, "a handler ran twice")
        ex.lock.lock(); let seen = ex.violations; ex.lock.unlock()
        XCTAssertEqual(Array(seen.prefix(10)), [])
    }

    // MARK: No Zalgo

    /// Registering from inside the context's own queue on a settled promise: the handler
    /// runs after the registering call, for every Dispatch-backed context, every form, and
    /// every settled state; also `Promise(on:)`, `retry`, `sequence` and
    /// `all(_:maxConcurrent:)` started from inside their queue.
    func testNoHandlerRunsInsideThenCalledFromItsOwnQueue() {
        let serial = DispatchQueue(label: "AdversarialContextTests.self.serial")
        let concurrent = DispatchQueue(label: "AdversarialContextTests.self.concurrent", attributes: .concurrent)
        let contexts: [(String, DispatchQueue, any ExecutionContext)] = [
            ("serial", serial, serial),
            ("concurrent barrier", concurrent, concurrent),
            (".concurrent(queue)", concurrent, .concurrent(concurrent)),
        ]
        let inline = Recorder<String>()
        let runs = Counter()
        let done = Countdown()
        for (name, queue, context) in contexts {
            for state in ["fulfilled", "rejected", "cancelled"] {
                done.add()
                queue.async(flags: .barrier) {
                    let p: Promise<Int>
                    switch state {
                    case "fulfilled": p = Promise(value: 1)
                    case "rejected": p = Promise(error: TestError(1))
                    default: p = Promise<Int>(); p.cancel(reason: TestError(2))
                    }
                    func probe(_ form: String) -> @Sendable () -> Void {
                        { runs.increment(); if ThreadMarker.isInside("register") { inline.append("\(name)/\(state)/\(form)") } }
                    }
                    ThreadMarker.inside("register") {
                        let a = probe("then"), b = probe("whenComplete"), c = probe("recover"),
                            d = probe("always"), e = probe("Promise(on:)"), f = probe("retry"),
                            g = probe("sequence"), h = probe("all(max:)"), i = probe("flatMap"),
                            j = probe("two-handler")
                        _ = p.then(on: context) { v -> Int in a(); return v }
                        p.whenComplete(on: context) { _ in b() }
                        _ = p.recover(on: context) { _ -> Int in c(); return 0 }
                        _ = p.always(on: context) { d() }
                        _ = p.flatMap(on: context) { v -> Promise<Int> in i(); return Promise(value: v) }
                        _ = p.then(on: context, { v -> Int in j(); return v }, { _ -> Int in j(); return 0 })
                        _ = Promise<Int>(on: context) { e(); return 1 }
                        _ = Promise<Int>.retry(attempts: 1, on: context) { f(); return Promise(value: 1) }
                        _ = Promise<Int>.sequence(0..<2, on: context) { v in g(); return Promise(value: v) }
                        _ = Promise<Int>.all(0..<2, maxConcurrent: 1, on: context) { v in h(); return Promise(value: v) }
                    }
                    done.countDown()
                }
            }
        }
        XCTAssertTrue(done.wait())
        // fulfilled: 11 probes run, rejected and cancelled: 10 each; three contexts.
        XCTAssertTrue(eventually { runs.value >= 3 * 31 }, "ran \(runs.value)")
        XCTAssertEqual(inline.values, [])
    }

    /// The first observer of a fresh settled root on `.default` lives in the root's own
    /// slot: it still runs after `whenComplete` returns, off the registering thread.
    func testFirstObserverSlotOnDefaultOfASettledRootIsNotZalgo() {
        let inline = Recorder<String>()
        let done = Countdown()
        for round in 0..<200 {
            let roots: [(String, Promise<Int>)] = [
                ("fulfilled", Promise(value: round)),
                ("rejected", Promise(error: TestError(round))),
                ("cancelled", { let p = Promise<Int>(); p.cancel(reason: TestError(round)); return p }()),
            ]
            for (state, root) in roots {
                done.add()
                ThreadMarker.inside("register") {
                    root.whenComplete(on: .default) { _ in
                        if ThreadMarker.isInside("register") { inline.append(state) }
                        done.countDown()
                    }
                }
            }
        }
        XCTAssertTrue(done.wait())
        XCTAssertEqual(done.overshoot, 0)
        XCTAssertEqual(Array(inline.values.prefix(5)), [])
    }

    /// `.main` from the main thread on settled promises: never inside the call, for
    /// every form, and in registration order.
    func testMainFromTheMainThreadIsNotZalgoAndKeepsOrder() {
        XCTAssertTrue(Thread.isMainThread)
        let order = Recorder<Int>()
        let inline = Recorder<Int>()
        let done = expectation(description: "main handlers")
        done.expectedFulfillmentCount = 40
        let fulfilled = Promise(value: 1)
        let rejected = Promise<Int>(error: TestError(1))
        ThreadMarker.inside("register") {
            for i in 0..<40 {
                let mark: @Sendable () -> Void = {
                    if ThreadMarker.isInside("register") { inline.append(i) }
                    order.append(i)
                    done.fulfill()
                }
                switch i % 4 {
                case 0: _ = fulfilled.then(on: .main) { v -> Int in mark(); return v }
                case 1: rejected.whenComplete(on: .main) { _ in mark() }
                case 2: _ = rejected.recover(on: .main) { _ -> Int in mark(); return 0 }
                default: _ = fulfilled.always(on: .main) { mark() }
                }
            }
        }
        wait(for: [done], timeout: testTimeoutSeconds)
        XCTAssertEqual(inline.values, [])
        XCTAssertEqual(order.values, Array(0..<40))
    }

    // MARK: Custom contexts

    /// A custom serial context that runs work later on its queue after a hop through
    /// another thread (delayed), for handlers on one promise: registration order kept, no
    /// run inside `then`, each once.
    func testACustomContextThatDelaysOnAnotherThreadKeepsOrderAndRunsEachOnce() {
        final class DelayingContext: ExecutionContext, @unchecked Sendable {
            let queue = DispatchQueue(label: "AdversarialContextTests.delaying")
            let calls = Counter()
            func execute(_ work: @escaping @Sendable () -> Void) {
                calls.increment()
                // Enqueued at once (keeps order), then the queue waits a little before each.
                queue.async { busyWork(microseconds: 50); work() }
            }
        }
        let context = DelayingContext()
        let order = Recorder<Int>()
        let inline = Recorder<Int>()
        let p = Promise<Int>()
        for i in 0..<100 {
            if i == 50 { _ = p.fulfill(0) }
            ThreadMarker.inside("register") {
                if i % 2 == 0 {
                    _ = p.then(on: context) { v -> Int in
                        if ThreadMarker.isInside("register") { inline.append(i) }
                        order.append(i); return v
                    }
                } else {
                    p.whenComplete(on: context) { _ in
                        if ThreadMarker.isInside("register") { inline.append(i) }
                        order.append(i)
                    }
                }
            }
        }
        XCTAssertTrue(eventually { order.count >= 100 })
        XCTAssertEqual(order.values, Array(0..<100))
        XCTAssertEqual(inline.values, [])
        XCTAssertEqual(context.calls.value, 100)
    }

    /// A context (a class, and a boxed struct holding one) whose every outside reference
    /// is dropped before the promise settles: the library keeps it until it has handed
    /// the handler over, then lets go of it.
    func testContextsDroppedByTheirOwnersBeforeTheSettleStillRunAndAreReleased() {
        final class Owned: ExecutionContext, @unchecked Sendable {
            let queue = DispatchQueue(label: "AdversarialContextTests.owned")
            func execute(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }
        }
        struct Boxed: ExecutionContext {
            let owned: Owned
            let padding: (Int, Int, Int) = (0, 0, 0)
            func execute(_ work: @escaping @Sendable () -> Void) { owned.execute(work) }
        }
        weak var weakClass: Owned?
        weak var weakBoxed: Owned?
        let p = Promise<Int>()
        let ran = Counter()
        var children: [Promise<Int>] = []
        do {
            let a = Owned(), b = Owned()
            weakClass = a; weakBoxed = b
            children.append(p.then(on: a) { v -> Int in ran.increment(); return v })
            children.append(p.then(on: Boxed(owned: b)) { v -> Int in ran.increment(); return v })
            p.whenComplete(on: a) { _ in ran.increment() }
            p.whenComplete(on: Boxed(owned: b)) { _ in ran.increment() }
        }
        XCTAssertNotNil(weakClass)
        XCTAssertNotNil(weakBoxed)
        _ = p.fulfill(1)
        for child in children { XCTAssertEqual(value(child), 1) }
        XCTAssertTrue(eventually { ran.value == 4 })
        XCTAssertTrue(eventually { weakClass == nil && weakBoxed == nil }, "a context was kept after its work ran")
    }

    // MARK: More ordering: prunes racing registrations and the settle

    /// Children of a long-lived pending promise are cancelled (they give up, and the
    /// promise prunes its observer list) and its description is read (a prune that keeps
    /// everything) while three threads register handlers on a serial queue and a fifth
    /// thread settles it: each thread's handlers still run in its registration order.
    func testSerialQueueKeepsPerThreadOrderWhilePrunesRace() {
        let queue = DispatchQueue(label: "AdversarialContextTests.prune")
        let problems = Recorder<String>()
        let checked = Counter()
        let rounds = 60
        let promises = (0..<rounds).map { _ in Promise<Int>() }
        let records = (0..<rounds).map { _ in Recorder<(Int, Int)>() }
        let expected = (0..<rounds).map { _ in Counter() }
        let finished = raceOnThreads(threads: 5, rounds: rounds) { thread, round in
            let p = promises[round], r = records[round]
            switch thread {
            case 3:
                // The pruner: children that give up, and descriptions.
                for i in 0..<60 {
                    let child = p.then(on: .immediate) { $0 }
                    child.cancel(reason: TestError(i))
                    if i % 10 == 0 { _ = p.debugDescription; _ = String(describing: p) }
                }
            case 4:
                busyWork(microseconds: (round * 29) % 300)
                _ = p.fulfill(round)
            default:
                for index in 0..<60 {
                    expected[round].increment()
                    if index % 2 == 0 {
                        p.whenComplete(on: queue) { _ in r.append((thread, index)) }
                    } else {
                        _ = p.then(on: queue) { v -> Int in r.append((thread, index)); return v }
                    }
                    if index % 5 == 0 {
                        // One that gives up at once, between them.
                        p.then(on: queue) { $0 }.cancel(reason: TestError(0))
                    }
                }
            }
        }
        XCTAssertTrue(finished)
        for round in 0..<rounds {
            let r = records[round]
            let want = expected[round].value
            if !eventually(timeout: 10, { r.count >= want }) {
                problems.append("round \(round): \(r.count) of \(want)"); continue
            }
            let values = r.values
            checked.increment(by: values.count)
            if values.count != want { problems.append("round \(round): \(values.count) runs, want \(want)") }
            for thread in 0..<3 {
                let seq = values.filter { $0.0 == thread }.map(\.1)
                if seq != seq.sorted() { problems.append("round \(round) thread \(thread): \(seq)") }
            }
        }
        XCTAssertGreaterThan(checked.value, 1_000)
        XCTAssertEqual(Array(problems.values.prefix(10)), [])
    }

    // MARK: Runs on a context that drops a later piece of work

    /// The documentation: "the output of a run that queues its own steps (`retry`,
    /// `sequence`, `all(_:maxConcurrent:)`)" rejects with `brokenPromise` when the context
    /// drops its work: nobody waits on it for ever. Here the context drops a later step
    /// (not the first): a later attempt, the `shouldRetry` call, a later input's work.
    func testRunsBreakWhenTheirContextDropsALaterStep() {
        var cases: [(String, Promise<Int>)] = []
        cases.append(("retry, 2nd attempt dropped", Promise<Int>.retry(attempts: 3, backoff: .fixed(.zero), on: DropsNth(2)) {
            Promise(error: TestError(1))
        }))
        cases.append(("retry, shouldRetry dropped", Promise<Int>.retry(attempts: 3, backoff: .fixed(.zero), on: DropsNth(2),
                                                                       shouldRetry: { _ in true }) {
            Promise(error: TestError(1))
        }))
        cases.append(("retry with a pause, 2nd attempt dropped",
                      Promise<Int>.retry(attempts: 3, backoff: .fixed(.milliseconds(1)), on: DropsNth(2)) {
            Promise(error: TestError(1))
        }))
        let seq = Promise<Int>.sequence(0..<4, on: DropsNth(2)) { Promise(value: $0) }.map(on: .immediate) { $0.count }
        cases.append(("sequence, 2nd step dropped", seq))
        let fan = Promise<Int>.all(0..<6, maxConcurrent: 2, on: DropsNth(4)) { Promise(value: $0) }.map(on: .immediate) { $0.count }
        cases.append(("all(max: 2), 4th step dropped", fan))
        var results: [String] = []
        for (name, output) in cases {
            guard let result = outcome(output, timeout: 5) else { results.append("\(name): still pending"); continue }
            if !isPromiseError(result, .brokenPromise) { results.append("\(name): \(result)") }
        }
        XCTAssertEqual(results, [])
    }

    // MARK: .immediate order among handlers registered before the settle

    /// `.immediate` handlers registered from several threads (serialised by a lock, so
    /// their registration order is one total order) all before the settle: they run on
    /// the settling thread, inside the settling call, one after another, in that order.
    func testImmediateHandlersRegisteredBeforeTheSettleFromManyThreadsRunInOrderOnTheSettler() {
        let problems = Recorder<String>()
        for round in 0..<100 {
            let p = Promise<Int>()
            let lock = NSLock()
            let tickets = Counter()
            let order = Recorder<Int>()
            let overlapping = Counter(), active = Counter(), left = Counter(), outsideTheSettle = Counter()
            let finished = raceOnThreads(threads: 3, rounds: 1) { _, _ in
                for _ in 0..<40 {
                    lock.lock()
                    let ticket = tickets.increment()
                    p.whenComplete(on: .immediate) { _ in
                        if !ThreadMarker.isInside("settle") { outsideTheSettle.increment() }
                        if active.increment() - left.value > 1 { overlapping.increment() }
                        order.append(ticket)
                        left.increment()
                    }
                    lock.unlock()
                }
            }
            XCTAssertTrue(finished)
            ThreadMarker.inside("settle") { _ = p.fulfill(round) }
            if outsideTheSettle.value != 0 { problems.append("round \(round): \(outsideTheSettle.value) ran outside the settling call") }
            if order.values != Array(1...120) { problems.append("round \(round): \(order.values.prefix(20))...") }
            if overlapping.value != 0 { problems.append("round \(round): overlapped") }
        }
        XCTAssertEqual(Array(problems.values.prefix(5)), [])
    }

    /// A one-word context holding a weak reference, and one holding an existential of
    /// another context (boxed): their handlers run through them, once, and they are let
    /// go of afterwards.
    func testContextsWithWeakAndExistentialFieldsRunAndAreReleased() {
        final class Target: @unchecked Sendable {
            let queue = DispatchQueue(label: "AdversarialContextTests.weakTarget")
        }
        struct WeakContext: ExecutionContext {
            weak var target: Target?
            let fallback: DispatchQueue
            func execute(_ work: @escaping @Sendable () -> Void) { (target?.queue ?? fallback).async(execute: work) }
        }
        struct Wrapping: ExecutionContext {
            let inner: any ExecutionContext
            func execute(_ work: @escaping @Sendable () -> Void) { inner.execute(work) }
        }
        let target = Target()
        let fallback = DispatchQueue(label: "AdversarialContextTests.fallback")
        weak var weakQueue: DispatchQueue?
        let ran = Counter()
        let p = Promise<Int>()
        var children: [Promise<Int>] = []
        do {
            let wrappedQueue = DispatchQueue(label: "AdversarialContextTests.wrapped")
            weakQueue = wrappedQueue
            children.append(p.then(on: WeakContext(target: target, fallback: fallback)) { v -> Int in ran.increment(); return v })
            children.append(p.then(on: Wrapping(inner: wrappedQueue)) { v -> Int in ran.increment(); return v })
            children.append(p.then(on: Wrapping(inner: WeakContext(target: target, fallback: fallback))) { v -> Int in ran.increment(); return v })
            p.whenComplete(on: Wrapping(inner: wrappedQueue)) { _ in ran.increment() }
        }
        _ = p.fulfill(3)
        for child in children { XCTAssertEqual(value(child), 3) }
        XCTAssertTrue(eventually { ran.value == 4 })
        XCTAssertEqual(ran.value, 4)
        XCTAssertTrue(eventually { weakQueue == nil }, "a wrapped context was kept after its work ran")
    }
}
