import Dispatch
import Foundation
@testable import Promise
import XCTest

// Adversarial tests for the early retirement of `flatMap` steps in `.immediate` chains
// built before their root settled (`freeParentValueOnceAdopted`,
// `retireIfOnlyTheCascadeKeepsIt`): a value somebody can still read must never be
// freed, whoever holds the step and however (strongly, `weak`, `unowned`, captured in a
// later handler, reached through `parent`), and whatever the step's handler returned.

/// Holds a promise `unowned`: the count field that a retirement's snapshot reads.
private final class UnownedSealedBox: @unchecked Sendable {
    unowned let promise: Promise<Sealed>
    let address: UnsafeMutableRawPointer
    init(_ promise: Promise<Sealed>) {
        self.promise = promise
        address = Unmanaged.passUnretained(promise).toOpaque()
    }

    /// `body` with the promise, retained, if it has not begun dying (what reading
    /// `promise` does, without the trap when another thread let go of it meanwhile).
    func ifAlive<Result>(_ body: (Promise<Sealed>) -> Result) -> Result? {
        guard let retained = SwiftRuntime.tryRetain(address) else { return nil }
        return body(Unmanaged<Promise<Sealed>>.fromOpaque(retained).takeRetainedValue())
    }
}

/// Holds a promise `weak`.
private final class WeakSealedBox: @unchecked Sendable {
    weak var promise: Promise<Sealed>?
    init(_ promise: Promise<Sealed>) { self.promise = promise }
}

final class AdversarialFlatMapRetireTests: XCTestCase {
    override func tearDown() {
        // Every test lets go of its promises; values must all be gone.
        XCTAssertTrue(eventually { Sealed.living == 0 }, "\(Sealed.living) values outlived their promises")
        super.tearDown()
    }

    // MARK: What a flatMap handler may return

    /// The kinds of promise a `flatMap` step's handler returns, for `step(after:kind:)`.
    private enum Returned: Int, CaseIterable {
        case settled, pendingSettledLaterInCascade, follower, raceOutput, allOutput
        case nestedFlatMapChild, rejectedThenRecovered, thenStep
    }

    /// A step after `parent` that makes `Sealed(number)` from it, of kind `kind`.
    private func step(after parent: Promise<Sealed>, kind: Returned, number: Int,
                      problems: Recorder<String>) -> Promise<Sealed> {
        let expected = number - 1
        switch kind {
        case .thenStep:
            return parent.then(on: .immediate) { value -> Sealed in
                expectWhole(value, expected, "then step \(number) read its parent", problems)
                return Sealed(number)
            }
        case .rejectedThenRecovered:
            return parent.flatMap(on: .immediate) { value -> Promise<Sealed> in
                expectWhole(value, expected, "flatMap step \(number) read its parent", problems)
                return Promise(error: TestError(number))
            }.recover(on: .immediate) { error -> Promise<Sealed> in
                Promise(value: Sealed((error as? TestError)?.id ?? -99))
            }
        default:
            return parent.flatMap(on: .immediate) { value in
                expectWhole(value, expected, "flatMap step \(number) read its parent", problems)
                return Self.returnedPromise(of: kind, with: Sealed(number))
            }
        }
    }

    /// What a `flatMap` handler of kind `kind` returns, to be fulfilled with `value`.
    private static func returnedPromise(of kind: Returned, with value: Sealed) -> Promise<Sealed> {
        switch kind {
        case .pendingSettledLaterInCascade:
            return settledLaterInTheCascade(with: value)
        case .follower:
            return lockedInFollower(fulfilledWith: value)
        case .raceOutput:
            return Promise.race([Promise(value: value), Promise<Sealed>()])
        case .allOutput:
            return Promise.all([Promise(value: value), Promise(value: Sealed(-1))]).then(on: .immediate) { $0[0] }
        case .nestedFlatMapChild:
            let inner = Promise<Int>()
            let returned = inner.flatMap(on: .immediate) { _ in Promise(value: value) }
            inner.fulfill(0)
            return returned
        case .settled, .rejectedThenRecovered, .thenStep:
            return Promise(value: value)
        }
    }

    // MARK: Held in every way while the cascade runs

    /// A chain of every kind of step, each step held by the test in one way (strongly,
    /// `unowned`, `weak`, or not at all) and read by a handler further down through that
    /// reference, and again after the cascade (those still held). No value read may be
    /// freed or wrong.
    func testStepsHeldInEveryWayKeepTheirValuesThroughTheCascade() {
        let problems = Recorder<String>()
        for round in 0..<300 {
            do {
                let kinds = Returned.allCases
                let root = Promise<Sealed>()
                var steps: [Promise<Sealed>] = []
                var strong: [(Promise<Sealed>, Int)] = []
                var unowned: [(UnownedSealedBox, Int)] = []
                var weak: [(WeakSealedBox, Int)] = []
                var step = root
                let depth = 24
                for level in 1...depth {
                    let kind = kinds[(level * 7 + round) % kinds.count]
                    step = self.step(after: step, kind: kind, number: level, problems: problems)
                    steps.append(step)
                    switch (level + round) % 4 {
                    case 0: strong.append((step, level))
                    case 1: unowned.append((UnownedSealedBox(step), level))
                    case 2: weak.append((WeakSealedBox(step), level))
                    default: break
                    }
                }
                // Handlers far down read the unowned and weak steps above them, mid-cascade.
                let unownedNow = unowned, weakNow = weak
                let reader = step.then(on: .immediate) { leafValue -> Int in
                    expectWhole(leafValue, depth, "leaf", problems)
                    for (box, level) in unownedNow where level < depth {
                        // An unowned reference to a step still kept by the cascade.
                        if let value = try? box.promise.wait(timeout: .zero) {
                            expectWhole(value, level, "unowned step \(level) mid-cascade (\(kinds[(level * 7 + round) % kinds.count]))", problems)
                        }
                    }
                    for (box, level) in weakNow {
                        if let promise = box.promise, let value = try? promise.wait(timeout: .zero) {
                            expectWhole(value, level, "weak step \(level) mid-cascade", problems)
                        }
                    }
                    return 0
                }
                let leaf = step
                steps.removeAll()
                step = root
                root.fulfill(Sealed(0))
                XCTAssertEqual(try? reader.wait(timeout: .seconds(10)), 0, "round \(round)")
                expectWhole(try? leaf.wait(timeout: .seconds(10)), depth, "leaf after", problems)
                for (promise, level) in strong {
                    expectWhole(try? promise.wait(timeout: .seconds(10)), level,
                                "strong step \(level) after (\(kinds[(level * 7 + round) % kinds.count]))", problems)
                }
                _ = unowned.count + weak.count
            }
        }
        XCTAssertEqual(Array(problems.values.prefix(20)), [])
    }

    /// The step before a `flatMap` step, held only by an `unowned` capture in a handler
    /// that runs later in the cascade (a sibling of the `flatMap` step, registered after
    /// it), reads whole.
    func testASiblingCapturingTheStepUnownedReadsItWhole() {
        let problems = Recorder<String>()
        for kind in Returned.allCases where kind != .thenStep {
            for order in 0..<2 {
                let root = Promise<Int>()
                let step = root.then(on: .immediate) { $0 }.then(on: .immediate) { Sealed($0) }
                var follower: Promise<Sealed>? = nil
                if order == 0 { follower = self.step(after: step, kind: kind, number: 2, problems: problems) }
                let sibling = step.then(on: .immediate) { [unowned step] _ -> Int in
                    expectWhole(try? step.wait(timeout: .zero), 1, "sibling of \(kind)/\(order)", problems)
                    return 0
                }
                if order == 1 { follower = self.step(after: step, kind: kind, number: 2, problems: problems) }
                let leaf = follower!.then(on: .immediate) { [unowned step] value -> Int in
                    expectWhole(value, 2, "leaf of \(kind)", problems)
                    expectWhole(try? step.wait(timeout: .zero), 1, "unowned step from leaf of \(kind)/\(order)", problems)
                    return 1
                }
                withExtendedLifetime(step) {}
                root.fulfill(1)
                XCTAssertEqual(try? sibling.wait(timeout: .seconds(10)), 0)
                XCTAssertEqual(try? leaf.wait(timeout: .seconds(10)), 1)
            }
        }
        XCTAssertEqual(problems.values, [])
    }

    /// Children and observers of every kind on the step before a `flatMap` step, some
    /// registered before it and some after, each read the step's value whole.
    func testObserversOfTheStepReadItWhole() {
        let problems = Recorder<String>()
        let queue = DispatchQueue(label: "adversarial.observers")
        for kind in Returned.allCases where kind != .thenStep {
            let done = Countdown(0)
            let root = Promise<Int>()
            let step = root.then(on: .immediate) { $0 }.then(on: .immediate) { Sealed($0) }
            let observe: (String) -> Void = { label in
                done.add(4)
                step.whenComplete(on: .immediate) { result in
                    expectWhole(try? result.get(), 1, "\(label) whenComplete(.immediate) \(kind)", problems); done.countDown()
                }
                step.whenComplete(on: queue) { result in
                    expectWhole(try? result.get(), 1, "\(label) whenComplete(queue) \(kind)", problems); done.countDown()
                }
                step.then(on: queue) { value -> Int in
                    expectWhole(value, 1, "\(label) then(queue) \(kind)", problems); done.countDown(); return 0
                }
                step.timeout(.seconds(30)).then(on: .immediate) { value -> Int in
                    expectWhole(value, 1, "\(label) timeout child \(kind)", problems); done.countDown(); return 0
                }
            }
            observe("before")
            let follower = self.step(after: step, kind: kind, number: 2, problems: problems)
            observe("after")
            let leaf = follower.then(on: .immediate) { $0.intactNumber ?? -1 }
            root.fulfill(1)
            XCTAssertEqual(try? leaf.wait(timeout: .seconds(10)), 2)
            XCTAssertTrue(done.wait(), "\(kind): observers ran")
            expectWhole(try? step.wait(timeout: .seconds(1)), 1, "held step after \(kind)", problems)
        }
        XCTAssertEqual(problems.values, [])
    }

    // MARK: Adopting on other threads

    /// `flatMap` steps whose returned promises another thread settles, while a third
    /// reads steps through `unowned` references and `parent`, and the test holds every
    /// third step strongly: no value read is freed or wrong.
    func testAdoptionsOnAnotherThreadWhileStepsAreReadUnownedAndThroughParent() {
        let problems = Recorder<String>()
        let depth = 16
        for round in 0..<200 {
            let gates = (0..<depth).map { _ in Promise<Int>() }
            let root = Promise<Sealed>()
            var step = root
            var boxes: [(UnownedSealedBox, Int)] = []
            var strong: [(Promise<Sealed>, Int)] = []
            for level in 1...depth {
                let gate = gates[level - 1]
                if (level + round) % 2 == 0 {
                    step = step.flatMap(on: .immediate) { value in
                        expectWhole(value, level - 1, "step \(level) read its parent", problems)
                        return gate.then(on: .immediate) { _ in Sealed(level) }
                    }
                } else {
                    step = self.step(after: step, kind: .settled, number: level, problems: problems)
                    gate.fulfill(0)
                }
                boxes.append((UnownedSealedBox(step), level))
                if level % 3 == 0 { strong.append((step, level)) }
            }
            let leaf = step
            step = root
            let readerBoxes = boxes
            let stop = Flag()
            let started = DispatchSemaphore(value: 0)
            let readerDone = DispatchSemaphore(value: 0)
            let reader = Thread {
                started.signal()
                while !stop.isSet {
                    var node: AnyPromise = leaf
                    var level = depth
                    while let up = node.parent {
                        level -= 1
                        node = up
                        if let promise = up as? Promise<Sealed>, up.isFulfilled, let value = try? promise.wait(timeout: .zero) {
                            expectWhole(value, level, "parent walk level \(level)", problems)
                        }
                        _ = up.debugDescription
                    }
                }
                readerDone.signal()
            }
            reader.start()
            started.wait()
            let settlerDone = DispatchSemaphore(value: 0)
            let settler = Thread {
                for gate in gates { gate.fulfill(0) }
                settlerDone.signal()
            }
            root.fulfill(Sealed(0))
            settler.start()
            expectWhole(try? leaf.wait(timeout: .seconds(10)), depth, "leaf round \(round)", problems)
            XCTAssertEqual(settlerDone.wait(timeout: .now() + 10), .success)
            stop.set()
            XCTAssertEqual(readerDone.wait(timeout: .now() + 10), .success)
            for (promise, level) in strong {
                expectWhole(try? promise.wait(timeout: .seconds(1)), level, "strong step \(level) round \(round)", problems)
            }
            withExtendedLifetime(readerBoxes) {}
        }
        XCTAssertEqual(Array(problems.values.prefix(20)), [])
    }

    // MARK: A flatMap step rejected as a cycle inside its handler

    /// A `flatMap` step whose handler returns a promise that follows the step itself is
    /// rejected with `PromiseError.cycle` inside its handler (a publish inside `follow`),
    /// and fires its `.immediate` children there: its parent's value, which the handler
    /// and a later sibling read, stays whole.
    func testAStepRejectedAsACycleKeepsItsParentsValueForItsSiblings() {
        let problems = Recorder<String>()
        for _ in 0..<50 {
            let root = Promise<Int>()
            let parent = root.then(on: .immediate) { $0 }.then(on: .immediate) { Sealed($0) }
            let me = Handoff<Promise<Sealed>>(nil)
            let looping = parent.flatMap(on: .immediate) { [unowned parent] value -> Promise<Sealed> in
                expectWhole(value, 1, "cycle step read its parent", problems)
                let back = Promise<Sealed>()
                back.resolve(with: me.take()!)
                expectWhole(try? parent.wait(timeout: .zero), 1, "unowned parent inside the handler", problems)
                return back
            }
            me.put(looping)
            let recovered = looping.recover(on: .immediate) { [unowned parent] error -> Sealed in
                XCTAssertTrue(error is PromiseError, "\(error)")
                expectWhole(try? parent.wait(timeout: .zero), 1, "unowned parent after the cycle", problems)
                return Sealed(2)
            }
            let sibling = parent.then(on: .immediate) { [unowned parent] value -> Int in
                expectWhole(value, 1, "sibling", problems)
                expectWhole(try? parent.wait(timeout: .zero), 1, "unowned parent in sibling", problems)
                return 0
            }
            let unownedParent = UnownedSealedBox(parent)
            root.fulfill(1)
            XCTAssertEqual(try? recovered.wait(timeout: .seconds(10)).intactNumber, 2)
            XCTAssertEqual(try? sibling.wait(timeout: .seconds(10)), 0)
            expectWhole(try? unownedParent.promise.wait(timeout: .zero), 1, "parent after", problems)
        }
        XCTAssertEqual(problems.values, [])
    }

    // MARK: Nested cascades

    /// A handler in the middle of a `flatMap` chain fulfils another root, whose own
    /// `.immediate` chain reads steps of the first through `unowned` references while
    /// both cascades share the thread's trampoline.
    func testANestedCascadeReadsStepsOfTheOuterChainUnowned() {
        let problems = Recorder<String>()
        for round in 0..<100 {
            let root = Promise<Sealed>()
            let otherRoot = Promise<Int>()
            var step = root
            var boxes: [UnownedSealedBox] = []
            let depth = 12
            for level in 1...depth {
                step = self.step(after: step, kind: Returned.allCases[(level + round) % Returned.allCases.count],
                                 number: level, problems: problems)
                boxes.append(UnownedSealedBox(step))
            }
            let outerBoxes = boxes
            var other: Promise<Int> = otherRoot
            for hop in 0..<8 {
                other = other.flatMap(on: .immediate) { value -> Promise<Int> in
                    for (index, box) in outerBoxes.enumerated() where index < depth - 1 {
                        if let read = try? box.promise.wait(timeout: .zero) {
                            expectWhole(read, index + 1, "nested read of step \(index + 1), hop \(hop)", problems)
                        }
                    }
                    return Promise(value: value + 1)
                }
            }
            let otherLeaf = other
            let trigger = step.flatMap(on: .immediate) { value -> Promise<Sealed> in
                expectWhole(value, depth, "trigger", problems)
                otherRoot.fulfill(0)
                return Promise(value: Sealed(depth + 1))
            }
            let leaf = trigger.then(on: .immediate) { $0.intactNumber ?? -1 }
            root.fulfill(Sealed(0))
            XCTAssertEqual(try? leaf.wait(timeout: .seconds(10)), depth + 1)
            XCTAssertEqual(try? otherLeaf.wait(timeout: .seconds(10)), 8)
        }
        XCTAssertEqual(Array(problems.values.prefix(20)), [])
    }

    // MARK: Errors

    /// A `recover` step that returns a promise (it follows it) retires the rejected step
    /// above it; the error was read, so no unhandled rejection is reported, and a
    /// rejected step nobody recovered is reported once.
    func testAdoptingRecoverReportsOnlyUnreadErrors() {
        let reports = Recorder<String>()
        PromiseDiagnostics.setHandler { event in
            if case .unhandledRejection(let error) = event.kind, error is TestError { reports.append("\(error)") }
        }
        defer { PromiseDiagnostics.setHandler(nil) }
        do {
            let root = Promise<Int>()
            var step: Promise<Int> = root
            for level in 1...50 {
                step = step.flatMap(on: .immediate) { _ -> Promise<Int> in Promise(error: TestError(level)) }
                    .recover(on: .immediate) { error -> Promise<Int> in
                        settledLaterInTheCascade(with: (error as? TestError)?.id ?? -1)
                    }
            }
            let unread = step.flatMap(on: .immediate) { _ -> Promise<Int> in Promise(error: TestError(999)) }
            let leaf = unread.then(on: .immediate) { $0 }.then(on: .immediate) { $0 }
            root.fulfill(0)
            XCTAssertTrue(eventually { leaf.isRejected })  // not read: `state` does not count
        }
        // The leaf (whose error nobody read) is the one report.
        XCTAssertTrue(eventually { reports.count >= 1 })
        XCTAssertEqual(reports.values, ["TestError(999)"])
    }
}

// MARK: A holder's settle racing the fire that puts the step in flight

/// A value whose deinit fulfils a promise: code the cascade runs when it lets go of the
/// last reference to the promise holding it.
private final class FulfilsOnDeinit: @unchecked Sendable {
    let promise: Promise<Int>
    init(_ promise: Promise<Int>) { self.promise = promise }
    deinit { promise.fulfill(0) }
}

/// Spins for about `iterations` loop turns: a delay finer than a microsecond.
@inline(never)
private func spinFor(_ iterations: Int) {
    var sink = 0
    for index in 0..<iterations { sink &+= index }
    withExtendedLifetime(sink) {}
}

/// Root, A (`root.then`, whose value fulfils `signal` when freed) and B (`A.then` on a
/// context that drops its work, with `observers` observers), of which the caller gets
/// only the root and B handed over, nothing else holding A or B.
private func makeRacingChain(signal: Promise<Int>, observers: Int) -> (Promise<Int>, Handoff<Promise<Sealed>>, UnownedSealedBox) {
    let root = Promise<Int>()
    let b = root.then(on: .immediate) { _ in FulfilsOnDeinit(signal) }
        .then(on: DroppingContext()) { _ in Sealed(-1) }
    for _ in 0..<observers { b.whenComplete(on: DroppingContext()) { _ in } }
    return (root, Handoff(b), UnownedSealedBox(b))
}

final class AdversarialHolderSettleRaceTests: XCTestCase {
    /// B, a queued child of A (a step below the root), is fulfilled by its holder inside a
    /// cascade on thread Y while thread X fires it (A's publish puts B in flight). When both
    /// sides of the Dekker pairing see each other (`holdPathWhileInFlight`,
    /// `publishClaimedOutcome`'s second look), Y's cascade keeps B "with its path"
    /// (`leaveFlight`, `dropKeptSelfHold`) while X drops B's own hold, so B no longer holds
    /// A. Y's keep of A goes first (newest first); A dies there, its registry's hold on
    /// B's memory with it, and A's value's deinit runs code that adds a `then` child C
    /// (with a child of its own) on B, which the test holds only `unowned`. When C has run,
    /// B's own keep is the newest, but B's path is not held: the retirement must not count
    /// B's link in A's registry, which is gone, or the test's `unowned` reference takes its
    /// place in the count and B's value is freed while the test can still read it.
    func testAHolderSettleRacingTheFireKeepsAnUnownedStepsValue() {
        let problems = Recorder<String>()
        let racedRounds = Counter()
        let retired = Counter()
        let diagnostics = Recorder<String>()
        let rounds = Int(ProcessInfo.processInfo.environment["PROMISE_SETTLE_RACE_ROUNDS"] ?? "") ?? 20_000
        let spread = Int(ProcessInfo.processInfo.environment["PROMISE_SETTLE_RACE_SPREAD"] ?? "") ?? 400
        let batch = 500
        var done = 0
        while done < rounds && problems.count == 0 {
            let count = min(batch, rounds - done)
            var roots: [Promise<Int>] = [], triggers: [Promise<Int>] = [], xDone: [Flag] = []
            for index in 0..<count {
                let signal = Promise<Int>()
                let (root, handoff, unownedB) = makeRacingChain(signal: signal, observers: 0)
                let finished = Flag()
                let settler = Handoff<pthread_t>(nil)
                let round = done + index
                signal.whenComplete(on: .immediate) { _ in
                    // Only in the cascade of the thread that settled B, once X is done.
                    guard finished.isSet, let thread = settler.peek, pthread_equal(thread, pthread_self()) != 0 else { return }
                    // A died. If B is still alive (the race: this thread's cascade keeps it),
                    // the test, which holds it only `unowned`, reads it through that
                    // reference, after a `then` child of B ran.
                    let made = unownedB.ifAlive { b in
                        b.then(on: .immediate) { value -> Int in
                            expectWhole(value, 7, "C read B", problems)
                            return 0
                        }
                    }
                    guard let child = made else { return diagnostics.append("B died before A") }
                    racedRounds.increment()
                    child.then(on: .immediate) { _ -> Int in
                        // Still kept by this cascade in the race (else it may have died).
                        if let value = unownedB.ifAlive({ try? $0.wait(timeout: .zero) }) ?? nil {
                            if value.intactNumber != 7 { retired.increment() }
                            expectWhole(value, 7, "B read unowned after C ran (round \(round))", problems)
                        }
                        return 0
                    }
                }
                let trigger = Promise<Int>()
                trigger.whenComplete(on: .immediate) { _ in
                    settler.put(pthread_self())
                    let b = handoff.take()!
                    b.fulfill(Sealed(7))
                    while !finished.isSet { sched_yield() }
                }
                roots.append(root); triggers.append(trigger); xDone.append(finished)
            }
            let delays = (0..<count).map { _ in (Int.random(in: 0..<spread), Int.random(in: 0..<spread)) }
            let rootsNow = roots, triggersNow = triggers, xDoneNow = xDone
            roots = []; triggers = []
            let started = raceOnThreads(threads: 2, rounds: count, timeout: 120) { thread, round in
                if thread == 0 {
                    spinFor(delays[round].0)
                    rootsNow[round].fulfill(1)
                    xDoneNow[round].set()
                } else {
                    spinFor(delays[round].1)
                    triggersNow[round].fulfill(0)
                }
            }
            XCTAssertTrue(started)
            done += count
        }
        print("rounds where B outlived A: \(racedRounds.value) of \(done); values read freed: \(retired.value); "
              + "\(diagnostics.count) rounds where B died before A")
        XCTAssertEqual(Array(problems.values.prefix(10)), [])
    }
}
