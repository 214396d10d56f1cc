// A consumer's own tests, written against the public API only (no @testable import).
import Dispatch
import Foundation
import Promise
import XCTest

private struct TestError: Error, Equatable {
    let code: Int
}

/// Records the order handlers ran in; they run on other threads.
private final class OrderLog: @unchecked Sendable {
    private let lock = NSLock()
    private var storage: [Int] = []

    func append(_ entry: Int) {
        lock.lock()
        storage.append(entry)
        lock.unlock()
    }

    var entries: [Int] {
        lock.lock()
        defer { lock.unlock() }
        return storage
    }
}

final class ConsumerTests: XCTestCase {
    func testTypedChainDeliversTheTransformedValue() async throws {
        let input = Promise<Int>()
        let text = input.then { $0 * 2 }.then { "value \($0)" }
        // While pending, the chain is alive: the middle step links text to its root. (Once
        // settled, nobody holds the middle step, so text keeps nothing above it.)
        XCTAssertTrue(text.root === input)
        XCTAssertTrue(input.fulfill(21))
        XCTAssertFalse(input.fulfill(0), "a promise settles once")
        let value = try await text.value
        XCTAssertEqual(value, "value 42")
    }

    func testRejectionSkipsSuccessHandlersUntilRecovered() throws {
        let result = Promise<Int>(error: TestError(code: 1))
            .then { $0 + 1 }
            .recover { error in (error as? TestError)?.code == 1 ? -1 : 0 }
        XCTAssertEqual(try result.wait(timeout: .seconds(5)), -1)
    }

    func testCancellingABranchLeavesParentAndSiblingAlone() throws {
        let root = Promise<Int>()
        let cancelled = root.then { $0 }
        let sibling = root.then(on: .immediate) { $0 + 1 }
        cancelled.cancel()
        XCTAssertEqual(cancelled.state, .cancelled)
        XCTAssertFalse(cancelled.isRejected)
        XCTAssertTrue(root.isPending)
        root.fulfill(1)
        XCTAssertEqual(try sibling.wait(timeout: .seconds(5)), 2)
        XCTAssertThrowsError(try cancelled.wait(timeout: .seconds(5))) { error in
            XCTAssertTrue(error is CancellationError)
        }
    }

    func testCombinators() async throws {
        let all = try await Promise.all([Promise(value: 1), Promise(value: 2)]).value
        XCTAssertEqual(all, [1, 2])
        let any = try await Promise.any([Promise<Int>(error: TestError(code: 2)), Promise(value: 3)]).value
        XCTAssertEqual(any, 3)
        // Held: a pending promise dropped by everyone would break its dependents instead.
        let never = Promise<Int>()
        do {
            _ = try await never.timeout(.milliseconds(10)).value
            XCTFail("timeout should reject")
        } catch PromiseError.timedOut {
        }
        withExtendedLifetime(never) {}
    }

    func testHandlersOnASerialQueueRunInRegistrationOrder() throws {
        let queue = DispatchQueue(label: "consumer.tests.serial")
        let gate = Promise<Int>()
        let log = OrderLog()
        let children = (0..<20).map { i in gate.then(on: queue) { _ in log.append(i) } }
        gate.fulfill(0)
        _ = try Promise.all(children).wait(timeout: .seconds(5))
        XCTAssertEqual(log.entries, Array(0..<20))
    }
}
