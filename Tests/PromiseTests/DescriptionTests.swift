import Promise
import XCTest

private struct Refused: Error, CustomStringConvertible {
    var description: String { "the upstream refused" }
}

final class DescriptionTests: XCTestCase {
    func testDescriptionShowsTypeStateAndOutcome() {
        XCTAssertEqual(Promise<Int>().description, "Promise<Int>(pending)")
        XCTAssertEqual(Promise(value: 42).description, "Promise<Int>(fulfilled: 42)")
        XCTAssertEqual(Promise(value: "x").description, "Promise<String>(fulfilled: \"x\")",
                       "values as debugPrint shows them, as Optional does")
        XCTAssertEqual(Promise<Int>(error: Refused()).description,
                       "Promise<Int>(rejected: the upstream refused)")
        XCTAssertEqual(Promise<Int>(error: PromiseError.timedOut).description,
                       "Promise<Int>(rejected: \(PromiseError.timedOut))", "a PromiseError reads as its sentence")

        let cancelled = Promise<[Int]>()
        cancelled.cancel(reason: Refused())
        XCTAssertEqual(cancelled.description, "Promise<Array<Int>>(cancelled: the upstream refused)")
        let plainCancel = Promise<Void>()
        plainCancel.cancel()
        XCTAssertEqual(plainCancel.description, "Promise<()>(cancelled: CancellationError())")
    }

    func testDerivedPromisesDescribeThemselvesAsPromise() {
        // `then`, `recover`, `timeout` and a follower have another layout than a root: the
        // text names the public type all the same.
        let root = Promise<Int>()
        let child = root.then(on: .immediate) { "\($0)" }
        let recovered = root.recover(on: .immediate) { _ in 0 }
        let limited = root.timeout(.seconds(60))
        let follower = Promise<Int>()
        follower.resolve(with: root)
        XCTAssertEqual(child.description, "Promise<String>(pending)")
        XCTAssertEqual(recovered.description, "Promise<Int>(pending)")
        XCTAssertEqual(limited.description, "Promise<Int>(pending)")
        for promise in [child, recovered, limited, follower] as [AnyPromise] {
            XCTAssertTrue(promise.debugDescription.hasPrefix("Promise<"), promise.debugDescription)
        }
        XCTAssertTrue(child.debugDescription.contains("parent Promise<Int>(pending)"), child.debugDescription)
        root.fulfill(12)
        XCTAssertEqual(child.description, "Promise<String>(fulfilled: \"12\")")
        XCTAssertEqual(limited.description, "Promise<Int>(fulfilled: 12)")
        XCTAssertEqual(follower.description, "Promise<Int>(fulfilled: 12)")
    }

    func testPrintAndInterpolationUseTheDescription() {
        let promise = Promise(value: 7)
        var printed = ""
        print(promise, terminator: "", to: &printed)
        XCTAssertEqual(printed, "Promise<Int>(fulfilled: 7)")
        XCTAssertEqual("\(promise)", "Promise<Int>(fulfilled: 7)")
        let erased: AnyPromise = promise
        XCTAssertEqual(erased.description, "Promise<Int>(fulfilled: 7)", "the same through AnyPromise")
    }

    func testDebugDescriptionShowsAddressObserversAndRoot() {
        let root = Promise<Int>()
        let address = String(UInt(bitPattern: ObjectIdentifier(root)), radix: 16)
        XCTAssertEqual(UInt(bitPattern: ObjectIdentifier(root)),
                       UInt(bitPattern: Unmanaged.passUnretained(root).toOpaque()), "the object's address")
        let idle = root.debugDescription
        XCTAssertTrue(idle.hasPrefix("Promise<Int>(pending) at 0x"), idle)
        XCTAssertTrue(idle.contains(address), idle)
        XCTAssertTrue(idle.hasSuffix(", no observers waiting, root"), idle)

        root.whenComplete(on: .immediate) { _ in }
        XCTAssertTrue(root.debugDescription.hasSuffix(", observers waiting, root"), root.debugDescription)

        root.fulfill(1)
        XCTAssertTrue(root.debugDescription.hasPrefix("Promise<Int>(fulfilled: 1) at 0x"))
        XCTAssertTrue(root.debugDescription.hasSuffix(", no observers waiting, root"),
                      "settled: every observer was handed out")
    }

    /// Observers that gave up, and `onCancel` handlers, wait for nothing.
    func testDebugDescriptionCountsOnlyObserversThatStillWait() {
        let polled = Promise<Int>()
        XCTAssertThrowsError(try polled.wait(timeout: .milliseconds(1)))
        XCTAssertTrue(polled.debugDescription.hasSuffix(", no observers waiting, root"), "a timed-out wait: \(polled.debugDescription)")
        polled.onCancel {}
        XCTAssertTrue(polled.debugDescription.hasSuffix(", no observers waiting, root"), "onCancel: \(polled.debugDescription)")
        polled.then(on: .immediate) { $0 }.cancel()
        XCTAssertTrue(polled.debugDescription.hasSuffix(", no observers waiting, root"), "a cancelled child: \(polled.debugDescription)")
        _ = Promise.race([Promise(value: 1), polled])
        XCTAssertTrue(polled.debugDescription.hasSuffix(", no observers waiting, root"), "a settled race: \(polled.debugDescription)")
        polled.whenComplete(on: .immediate) { _ in }
        XCTAssertTrue(polled.debugDescription.hasSuffix(", observers waiting, root"), polled.debugDescription)
    }

    /// A promise locked in by `resolve(with:)` that rejected as a cycle, or was cancelled,
    /// takes nothing from the promise it meant to follow: that one has no observer waiting
    /// (nor is it a broken promise if dropped).
    func testAFollowerThatRejectedAsACycleNoLongerWaits() {
        let follower = Promise<Int>(), other = Promise<Int>()
        let followed = Promise.allSettled([follower, other]).map(on: .immediate) { $0.count }
        follower.resolve(with: followed)
        XCTAssertTrue(isPromiseError(outcome(follower, timeout: 1), .cycle), "\(follower)")
        XCTAssertTrue(followed.debugDescription.contains(", no observers waiting, "), followed.debugDescription)
        let cancelled = Promise<Int>(), pending = Promise<Int>()
        cancelled.resolve(with: pending)
        XCTAssertTrue(pending.debugDescription.contains(", observers waiting, "), pending.debugDescription)
        cancelled.cancel()
        XCTAssertTrue(pending.debugDescription.contains(", no observers waiting, "), pending.debugDescription)
        other.fulfill(0)
    }

    func testDebugDescriptionShowsTheParentWhileItLives() {
        var parent: Promise<String>? = Promise<String>()
        let child = parent!.then(on: .immediate) { $0.count }
        XCTAssertTrue(parent!.debugDescription.contains("observers waiting"), "the child waits on it")
        let whileAlive = child.debugDescription
        XCTAssertTrue(whileAlive.hasPrefix("Promise<Int>(pending) at 0x"), whileAlive)
        XCTAssertTrue(whileAlive.hasSuffix("parent Promise<String>(pending) at 0x"
                                           + String(UInt(bitPattern: Unmanaged.passUnretained(parent!).toOpaque()), radix: 16)
                                               .leftPadded(to: 2 * MemoryLayout<UInt>.size)),
                      whileAlive)

        parent!.fulfill("four")
        parent = nil  // settled, unheld: a settled child keeps nothing above it
        let afterwards = child.debugDescription
        XCTAssertTrue(afterwards.hasPrefix("Promise<Int>(fulfilled: 4) at 0x"), afterwards)
        XCTAssertTrue(afterwards.hasSuffix(", parent released"), afterwards)
    }
}

private extension String {
    func leftPadded(to width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
