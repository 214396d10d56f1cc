// State and its flags, parent/root navigation, and blocking with wait().
import Dispatch
import Foundation
import Promise
import XCTest

final class StateTests: XCTestCase {

    // MARK: State and flags

    private func flags(_ p: AnyPromise) -> [Bool] {
        [p.isPending, p.isFulfilled, p.isRejected, p.isCancelled]
    }

    func testStateFlagsOfEachState() {
        let pending = Promise<Int>()
        XCTAssertEqual(pending.state, .pending)
        XCTAssertEqual(flags(pending), [true, false, false, false])

        let fulfilled = Promise<Int>()
        fulfilled.fulfill(1)
        XCTAssertEqual(fulfilled.state, .fulfilled)
        XCTAssertEqual(flags(fulfilled), [false, true, false, false])

        let rejected = Promise<Int>()
        rejected.reject(TestError(1))
        XCTAssertEqual(rejected.state, .rejected)
        XCTAssertEqual(flags(rejected), [false, false, true, false])

        let cancelled = Promise<Int>()
        cancelled.cancel()
        XCTAssertEqual(cancelled.state, .cancelled)
        XCTAssertEqual(flags(cancelled), [false, false, false, true])
    }

    func testStateIsVisibleFromAnotherThreadAfterSettling() {
        let p = Promise<[Int]>()
        let seen = Recorder<[Int]>()
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            // Spin until the state flips, then read the value: the value must be there.
            let deadline = Date(timeIntervalSinceNow: testTimeoutSeconds)
            while p.isPending && Date() < deadline {}
            if let v = try? p.wait(timeout: .zero) { seen.append(v) }
            done.signal()
        }
        p.fulfill([1, 2, 3])
        XCTAssertEqual(done.wait(timeout: .now() + testTimeoutSeconds), .success)
        XCTAssertEqual(seen.values, [[1, 2, 3]])
    }

    func testStateIsReadableThroughAnyPromise() {
        let erased: [AnyPromise] = [Promise<Int>(), Promise(value: "s"), Promise<Data>(error: TestError(1))]
        XCTAssertEqual(erased.map(\.state), [.pending, .fulfilled, .rejected])
        erased[0].cancel()
        XCTAssertEqual(erased[0].state, .cancelled)
    }

    // MARK: parent / root

    func testRootHasNoParentAndIsItsOwnRoot() {
        let p = Promise<Int>()
        XCTAssertNil(p.parent)
        XCTAssertTrue(p.root === p)
        let settled = Promise(value: 1)
        XCTAssertNil(settled.parent)
        XCTAssertTrue(settled.root === settled)
    }

    func testChainNavigatesToParentAndRoot() {
        let p = Promise<Int>()
        let a = p.then { $0 + 1 }
        let b = a.map { "\($0)" }
        let c = b.recover { _ in "" }
        XCTAssertTrue(a.parent === p)
        XCTAssertTrue(b.parent === a)
        XCTAssertTrue(c.parent === b)
        XCTAssertTrue(c.parent?.parent?.parent === p)
        XCTAssertTrue(c.root === p)
        XCTAssertTrue(a.root === p)
        p.fulfill(1)
        XCTAssertEqual(value(c), "2")
        // Navigation still answers once everything has settled.
        XCTAssertTrue(c.parent === b)
        XCTAssertTrue(c.root === p)
    }

    func testFollowedPromiseIsNotAParent() {
        let inner = Promise(value: 2)
        let p = Promise<Int>()
        let child = p.flatMap { _ in inner }
        p.resolve(with: Promise(value: 1))
        XCTAssertEqual(value(child), 2)
        XCTAssertTrue(child.parent === p)
        XCTAssertNil(inner.parent)
        XCTAssertNil(p.parent, "resolve(with:) made the followed promise a parent")
    }

    func testRootOfMixedTypeTree() {
        let download = Promise<Data>()
        let decode = download.then { $0.count }
        let render = decode.then { "\($0) bytes" }
        let tree: [AnyPromise] = [download, decode, render]
        XCTAssertTrue(tree.allSatisfy { $0.root === download })
        download.fulfill(Data([1, 2, 3]))
        XCTAssertEqual(value(render), "3 bytes")
    }

    // MARK: wait

    func testWaitReturnsValueOfSettledPromise() throws {
        XCTAssertEqual(try Promise(value: 5).wait(), 5)
        XCTAssertEqual(try Promise(value: 6).wait(timeout: .seconds(1)), 6)
    }

    func testWaitBlocksUntilFulfilledFromAnotherThread() throws {
        let p = Promise<Int>()
        DispatchQueue.global().async { p.fulfill(7) }
        XCTAssertEqual(try p.wait(), 7)
    }

    func testWaitThrowsTheRejectionError() {
        let p = Promise<Int>()
        DispatchQueue.global().async { p.reject(TestError(8)) }
        XCTAssertThrowsError(try p.wait()) { e in XCTAssertEqual(e as? TestError, TestError(8)) }
        XCTAssertThrowsError(try p.wait(timeout: .seconds(1))) { e in XCTAssertEqual(e as? TestError, TestError(8)) }
    }

    func testWaitThrowsTheCancellationReason() {
        let p = Promise<Int>()
        DispatchQueue.global().async { p.cancel(reason: TestError(9)) }
        XCTAssertThrowsError(try p.wait()) { e in XCTAssertEqual(e as? TestError, TestError(9)) }
        let plain = Promise<Int>()
        plain.cancel()
        XCTAssertThrowsError(try plain.wait()) { e in XCTAssertTrue(e is CancellationError) }
    }

    func testWaitWithTimeoutThrowsTimedOutAndLeavesPromiseUntouched() {
        let p = Promise<Int>()
        let start = DispatchTime.now()
        XCTAssertThrowsError(try p.wait(timeout: .milliseconds(50))) { e in
            guard case .timedOut? = e as? PromiseError else {
                return XCTFail("expected PromiseError.timedOut, got \(e)")
            }
        }
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1e9
        XCTAssertGreaterThanOrEqual(elapsed, 0.045, "wait(timeout:) returned early")
        XCTAssertLessThan(elapsed, testTimeoutSeconds)
        XCTAssertTrue(p.isPending)
        // It can still settle and be waited on afterwards.
        p.fulfill(10)
        XCTAssertEqual(try p.wait(timeout: .seconds(1)), 10)
    }

    func testWaitWithTimeoutReturnsWhenSettledBeforeTheDeadline() throws {
        let p = Promise<Int>()
        let start = DispatchTime.now()
        DispatchQueue.global().async { p.fulfill(11) }
        XCTAssertEqual(try p.wait(timeout: .seconds(10)), 11)
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1e9
        XCTAssertLessThan(elapsed, 5, "wait did not return when the promise settled")
    }

    func testManyThreadsWaitingOnOnePromiseAllWakeUp() {
        let p = Promise<Int>()
        let woke = Recorder<Int>()
        let group = DispatchGroup()
        for _ in 0..<8 {
            group.enter()
            Thread {
                if let v = try? p.wait(timeout: testTimeout) { woke.append(v) }
                group.leave()
            }.start()
        }
        p.fulfill(12)
        XCTAssertEqual(group.wait(timeout: .now() + testTimeoutSeconds * 2), .success)
        XCTAssertEqual(woke.values, Array(repeating: 12, count: 8))
    }
}
