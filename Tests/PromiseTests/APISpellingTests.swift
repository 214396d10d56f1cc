// Every spelling that the public API contract gives for the parts in scope (resolver side, continuations,
// contexts, state, navigation, cancellation, blocking), written exactly as there. It
// mainly has to compile; the results are asserted too. Not here yet: the async
// initialiser, `value`/`result`, combinators.
import Dispatch
import Foundation
import Promise
import XCTest

// The types, as the contract declares them.
private let anyPromiseIsAClass: AnyPromise.Type = Promise<Int>.self
private func isSendable<T: Sendable>(_: T.Type) -> Bool { true }

/// A user's event-loop-like context: `any type conforming to ExecutionContext`.
private struct MyContext: ExecutionContext {
    let queue = DispatchQueue(label: "PromiseTests.MyContext")
    func execute(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }
}

private struct OtherError: Error {
    let wrapped: any Error
    init(_ error: any Error) { wrapped = error }
}

private func fetch(_ v: Int) -> Promise<String> { Promise(value: "fetched \(v)") }
private func compute() throws -> Int { 6 * 7 }
private let logged = Recorder<String>()
private func log(_ error: any Error) { logged.append("\(error)") }
private let cleanUps = Counter()
private func cleanUp() { cleanUps.increment() }
private let stops = Counter()
private func stopWork() { stops.increment() }

/// `on context: any ExecutionContext = .default`, as the continuations declare it.
private func runs(on context: any ExecutionContext = .default) -> Promise<Int> {
    Promise(value: 1).then(on: context) { $0 }
}

/// "...or generically": static members found through `Self ==` constrained extensions.
private func runsGenerically<C: ExecutionContext>(on context: C) -> Promise<Int> {
    Promise(value: 2).then(on: context) { $0 }
}

final class APISpellingTests: XCTestCase {

    func testTypeDeclarations() {
        XCTAssertTrue(anyPromiseIsAClass == Promise<Int>.self)
        XCTAssertTrue(isSendable(AnyPromise.self))
        XCTAssertTrue(isSendable(Promise<Int>.self))
        XCTAssertTrue(isSendable(PromiseState.self))
        XCTAssertTrue(isSendable(PromiseError.self))
        let states: [PromiseState] = [.pending, .fulfilled, .rejected, .cancelled]
        XCTAssertEqual(Set(states.map { "\($0)" }).count, 4)
        let errors: [PromiseError] = [.timedOut, .validationFailure, .allRejected([TestError(1)]),
                                      .brokenPromise, .cycle, .invalidArgument("attempts was 0")]
        for e in errors {
            switch e {
            case .timedOut, .validationFailure, .brokenPromise, .cycle: break
            case .allRejected(let list): XCTAssertEqual(list.count, 1)
            case .invalidArgument(let explanation): XCTAssertEqual(explanation, "attempts was 0")
            }
        }
        // Errors explain themselves to loggers (LocalizedError, CustomStringConvertible).
        XCTAssertEqual(PromiseError.brokenPromise.localizedDescription, "\(PromiseError.brokenPromise)")
        let asError: any Error = PromiseError.timedOut
        XCTAssertTrue(asError is PromiseError)
    }

    func testCreatingAndResolving() throws {
        let error = TestError(1)
        let other = Promise<Int>()

        let p = Promise<Int>()                       // pending
        XCTAssertTrue(p.isPending)
        p.fulfill(42)                                // -> Bool, @discardableResult
        let again: Bool = p.reject(error)            // -> Bool
        XCTAssertFalse(again)
        XCTAssertFalse(p.resolve(.success(1)))       // Result<Value, any Error> -> Bool
        p.resolve(with: other)                       // follow another Promise<Value>; returns Void
        XCTAssertEqual(try p.wait(), 42)

        let q = Promise<Int>()
        q.resolve(with: other)
        let nothing: Void = q.resolve(with: other)
        _ = nothing
        other.fulfill(5)
        XCTAssertEqual(try q.wait(timeout: testTimeout), 5)

        let e = error
        let r: Result<Int, any Error> = .success(3)
        let a = Promise(value: 1); let b = Promise<Int>(error: e); let c = Promise(result: r)  // already settled
        XCTAssertEqual(try a.wait(), 1)
        XCTAssertThrowsError(try b.wait())
        XCTAssertEqual(try c.wait(), 3)

        let d = Promise<Int> { fulfill, reject in fulfill(4) }      // body runs synchronously, once
        XCTAssertEqual(try d.wait(), 4)
        let f = Promise<Int> { fulfill, reject in reject(error) }
        XCTAssertThrowsError(try f.wait())

        let context: any ExecutionContext = .default
        let g = Promise<Int>(on: context) { try compute() }        // work runs on the context
        XCTAssertEqual(try g.wait(timeout: testTimeout), 42)

        // The creation site is the initialisers' last parameters, closure ones too (a
        // wrapper passes its own caller's).
        let h = Promise<Int>({ fulfill, _ in fulfill(6) }, file: "Site.swift", line: 7)
        let i = Promise<Int>(on: context, { 8 }, file: "Site.swift", line: 9)
        let j = Promise<Int>({ 10 }, file: "Site.swift", line: 11)
        XCTAssertEqual(try h.wait(), 6)
        XCTAssertEqual(try i.wait(timeout: testTimeout), 8)
        XCTAssertEqual(try j.wait(timeout: testTimeout), 10)
        #if DEBUG
        XCTAssertTrue(h.debugDescription.contains("Site.swift:7"), h.debugDescription)
        XCTAssertTrue(i.debugDescription.contains("Site.swift:9"), i.debugDescription)
        XCTAssertTrue(j.debugDescription.contains("Site.swift:11"), j.debugDescription)
        #endif
    }

    func testContinuations() throws {
        let p = Promise(value: 1)
        let fallback = 0
        let error = TestError(2)

        let a = p.then { v in v + 1 }                                      // map
        let b = p.then { v in fetch(v) }                                   // flatMap
        let c = p.then({ v in "ok \(v)" }, { error in "handled" })        // two handlers
        let d = p.map { $0 * 10 }; let e = p.flatMap { fetch($0) }         // unambiguous spellings
        let f = p.recover { error in fallback }                            // -> Value
        let g = p.recover { error in Promise(value: fallback) }            // -> Promise<Value>
        let failed = Promise<Int>(error: error)
        let h = failed.mapError { error in OtherError(error) }             // -> Promise<Value>
        let i = failed.catch { error in log(error) }                       // passes the outcome on
        let j = p.always { cleanUp() }                                     // either outcome
        let k = p.validate { v in v > 0 }                                  // false: validationFailure
        let done = expectation(description: "whenComplete")
        p.whenComplete { result in                                         // no child promise
            XCTAssertEqual(try? result.get(), 1)
            done.fulfill()
        }

        XCTAssertEqual(try a.wait(timeout: testTimeout), 2)
        XCTAssertEqual(try b.wait(timeout: testTimeout), "fetched 1")
        XCTAssertEqual(try c.wait(timeout: testTimeout), "ok 1")
        XCTAssertEqual(try d.wait(timeout: testTimeout), 10)
        XCTAssertEqual(try e.wait(timeout: testTimeout), "fetched 1")
        XCTAssertEqual(try f.wait(timeout: testTimeout), 1)
        XCTAssertEqual(try g.wait(timeout: testTimeout), 1)
        XCTAssertThrowsError(try h.wait(timeout: testTimeout)) { XCTAssertTrue($0 is OtherError) }
        XCTAssertThrowsError(try i.wait(timeout: testTimeout)) { XCTAssertEqual($0 as? TestError, error) }
        XCTAssertEqual(logged.values.last, "\(error)")
        XCTAssertEqual(try j.wait(timeout: testTimeout), 1)
        XCTAssertGreaterThanOrEqual(cleanUps.value, 1)
        XCTAssertEqual(try k.wait(timeout: testTimeout), 1)
        wait(for: [done], timeout: testTimeoutSeconds)

        // Each continuation returns a child whose parent is the receiver.
        for child in [a, d, f, g, j, k] as [AnyPromise] { XCTAssertTrue(child.parent === p) }
        XCTAssertTrue(b.parent === p && c.parent === p && e.parent === p)
        XCTAssertTrue(h.parent === failed && i.parent === failed)
    }

    /// The spelling the rules give for a handler of several statements that returns
    /// nothing where the child must be a `Promise<Void>`: `-> Void` said in the closure.
    /// (Without it, `then` reads the body as a `flatMap` missing its `return`, and
    /// `recover` on a `Promise<Void>` is ambiguous: compile errors, not behaviour.)
    func testSeveralStatementHandlersReturningNothing() throws {
        let seen = Recorder<String>()
        let counted: Promise<Void> = Promise(value: 3).then { value -> Void in
            seen.append("value \(value)")
            seen.append("counted")
        }
        let recovered: Promise<Void> = Promise<Void>(error: TestError(4)).recover { error -> Void in
            seen.append("error \(error)")
            seen.append("recovered")
        }
        var all: [Promise<Void>] = []
        all.append(Promise(value: 5).map { value in
            seen.append("mapped \(value)")
            seen.append("appended")
        })
        try counted.wait(timeout: testTimeout)
        try recovered.wait(timeout: testTimeout)
        try all[0].wait(timeout: testTimeout)
        XCTAssertEqual(Set(seen.values), ["value 3", "counted", "error \(TestError(4))", "recovered",
                                          "mapped 5", "appended"])
    }

    /// The rules' other two spellings: a two-handler `then` whose handlers return promises
    /// followed by `.flatMap { $0 }`, and the type spelled for a closure that does not
    /// await.
    func testTwoHandlerThenFlattenedAndATypedNonAwaitingInitialiser() throws {
        let nested = Promise(value: 2).then({ v in Promise(value: "ok \(v)") }, { _ in Promise(value: "handled") })
        let followed: Promise<String> = nested.flatMap { $0 }
        XCTAssertEqual(try followed.wait(timeout: testTimeout), "ok 2")
        @Sendable func compute() -> Int { 6 * 7 }
        let computed = Promise<Int> { compute() }
        XCTAssertEqual(try computed.wait(timeout: testTimeout), 42)
    }

    func testExecutionContexts() throws {
        let p = Promise(value: 1)
        let queue = DispatchQueue(label: "PromiseTests.spelling", attributes: .concurrent)
        #if Foundation  // the package trait, on by default
        let operationQueue = OperationQueue()
        #else
        let operationQueue = DispatchQueue(label: "PromiseTests.no-operation-queue")  // stand-in
        #endif
        let myContext = MyContext()

        let a = p.then(on: .default) { $0 + 1 }
        let b = p.then(on: .main) { $0 + 2 }
        let c = p.then(on: queue) { $0 + 3 }
        let d = p.then(on: .concurrent(queue)) { $0 + 4 }
        let e = p.then(on: operationQueue) { $0 + 5 }
        let f = p.then(on: .immediate) { $0 + 6 }
        let g = p.then(on: myContext) { $0 + 7 }

        XCTAssertEqual(f.state, .fulfilled)  // .immediate: inline on a settled promise
        let mainDone = expectation(description: ".main")
        b.whenComplete(on: .immediate) { _ in mainDone.fulfill() }
        wait(for: [mainDone], timeout: testTimeoutSeconds)  // spins the main run loop
        XCTAssertEqual(try b.wait(timeout: testTimeout), 3)
        XCTAssertEqual(try a.wait(timeout: testTimeout), 2)
        XCTAssertEqual(try c.wait(timeout: testTimeout), 4)
        XCTAssertEqual(try d.wait(timeout: testTimeout), 5)
        XCTAssertEqual(try e.wait(timeout: testTimeout), 6)
        XCTAssertEqual(try f.wait(timeout: testTimeout), 7)
        XCTAssertEqual(try g.wait(timeout: testTimeout), 8)

        // `on context: any ExecutionContext = .default`, or generically.
        XCTAssertEqual(try runs().wait(timeout: testTimeout), 1)
        XCTAssertEqual(try runs(on: .immediate).wait(timeout: testTimeout), 1)
        XCTAssertEqual(try runsGenerically(on: .immediate).wait(timeout: testTimeout), 2)
        XCTAssertEqual(try runsGenerically(on: .default).wait(timeout: testTimeout), 2)
        XCTAssertEqual(try runsGenerically(on: .concurrent(queue)).wait(timeout: testTimeout), 2)
        XCTAssertEqual(try runsGenerically(on: queue).wait(timeout: testTimeout), 2)
        let contexts: [any ExecutionContext] = [
            .default, .main, .immediate, .concurrent(queue), queue, operationQueue, myContext,
        ]
        XCTAssertEqual(contexts.count, 7)
    }

    func testCancellation() {
        let error = TestError(3)
        let p = Promise<Int>()
        p.onCancel { stopWork() }                    // resolver side
        let child = p.then { $0 + 1 }
        XCTAssertTrue(child.parent === p)            // navigation
        XCTAssertTrue(child.root === p)
        p.cancel()                                   // pending: settles as .cancelled
        XCTAssertTrue(p.isCancelled)                 // state == .cancelled; isRejected stays false
        XCTAssertEqual(p.state, .cancelled)
        XCTAssertFalse(p.isRejected)
        XCTAssertTrue(eventually { stops.value == 1 })

        let q = Promise<Int>()
        let grandchild = q.then { $0 }.then { $0 }
        grandchild.root.cancel()                     // cancels the whole tree under the root
        XCTAssertTrue(q.isCancelled)
        XCTAssertTrue(grandchild.isCancelled)

        let r = Promise<Int>()
        r.cancel(reason: error)                      // with that error as the reason
        XCTAssertThrowsError(try r.wait()) { XCTAssertEqual($0 as? TestError, error) }

        let erased: AnyPromise = Promise<String>()
        erased.onCancel {}
        erased.cancel()
        XCTAssertEqual(erased.state, .cancelled)
        XCTAssertTrue(erased.parent == nil)
        XCTAssertTrue(erased.root === erased)
    }

    func testBlocking() throws {
        let p = Promise<Int>(on: .default) { 42 }
        let v = try p.wait()                          // blocks until settled
        XCTAssertEqual(v, 42)
        let w = try p.wait(timeout: .seconds(1))      // throws PromiseError.timedOut
        XCTAssertEqual(w, 42)
        XCTAssertThrowsError(try Promise<Int>().wait(timeout: .milliseconds(5))) { e in
            guard case .timedOut? = e as? PromiseError else { return XCTFail("\(e)") }
        }
    }

    func testStateMembers() {
        let p = Promise<Int>()
        let erased: AnyPromise = p
        let snapshot: (PromiseState, Bool, Bool, Bool, Bool) =
            (erased.state, erased.isPending, erased.isFulfilled, erased.isRejected, erased.isCancelled)
        XCTAssertEqual(snapshot.0, .pending)
        XCTAssertTrue(snapshot.1 && !snapshot.2 && !snapshot.3 && !snapshot.4)
        let parent: AnyPromise? = erased.parent
        let root: AnyPromise = erased.root
        XCTAssertNil(parent)
        XCTAssertTrue(root === p)
        p.fulfill(1)
        XCTAssertTrue(erased.isFulfilled)
    }
}
