// A handler sent to one of Dispatch's queues goes as a C function and its promise, not as
// a block: the queue it reaches, and that the path is taken where it should be.
import Dispatch
@testable import Promise
import XCTest

final class DispatchBridgeTests: XCTestCase {
    /// On Linux the overlay's queue object is where `DispatchBridge` reads it, so handlers
    /// skip the block; were the check to fail, they would still run, only slower, and
    /// nothing else would say so.
    func testTheQueueBehindADispatchQueueIsFound() throws {
        #if os(Linux)
        XCTAssertTrue(DispatchBridge.queueLayoutAsExpected)
        let queue = DispatchQueue(label: "PromiseTests.bridge")
        XCTAssertNotNil(DispatchBridge.dispatchQueue(of: queue))
        XCTAssertEqual(DispatchBridge.dispatchQueue(of: queue), DispatchBridge.dispatchQueue(of: queue))
        XCTAssertNotEqual(DispatchBridge.dispatchQueue(of: queue), DispatchBridge.dispatchQueue(of: .main))
        #else
        XCTAssertNil(DispatchBridge.dispatchQueue(of: DispatchQueue(label: "PromiseTests.bridge")))
        #endif
    }

    /// Each of Dispatch's contexts runs the handler on its own queue, with the value, once.
    func testAHandlerRunsOnTheQueueItWasGiven() {
        let key = DispatchSpecificKey<String>()
        let serial = DispatchQueue(label: "PromiseTests.bridge.serial")
        let concurrent = DispatchQueue(label: "PromiseTests.bridge.concurrent", attributes: .concurrent)
        serial.setSpecific(key: key, value: "serial")
        concurrent.setSpecific(key: key, value: "concurrent")
        DefaultExecutionContext.queue.setSpecific(key: key, value: "default")
        defer { DefaultExecutionContext.queue.setSpecific(key: key, value: nil) }
        let contexts: [(String, any ExecutionContext)] = [
            ("serial", serial), ("concurrent", concurrent), ("concurrent", .concurrent(concurrent)), ("default", .default),
        ]
        for (name, context) in contexts {
            let parent = Promise<Int>()
            let child = parent.then(on: context) { value in (value, DispatchQueue.getSpecific(key: key)) }
            parent.fulfill(7)
            let ran = value(child)
            XCTAssertEqual(ran?.0, 7, name)
            XCTAssertEqual(ran?.1, name, "the handler ran on \(ran?.1 ?? "no queue of ours"), not \(name)")
        }
    }
}
