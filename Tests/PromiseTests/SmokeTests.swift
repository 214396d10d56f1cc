import XCTest
import Dispatch
@testable import Promise

final class SmokeTests: XCTestCase {
    func testBasicChain() throws {
        let p = Promise<Int>()
        let c = p.then { $0 + 1 }.then(on: .immediate) { "v\($0)" }
        p.fulfill(1)
        XCTAssertEqual(try c.wait(timeout: .seconds(5)), "v2")
        XCTAssertTrue(c.parent?.parent === p)
    }
    func testImmediateLongChain() throws {
        let root = Promise<Int>()
        var p = root
        for _ in 0..<100_000 { p = p.then(on: .immediate) { $0 + 1 } }
        root.fulfill(0)
        XCTAssertEqual(try p.wait(), 100_000)
    }
    func testWeak() {
        weak var w: Promise<Int>?
        weak var wc: Promise<Int>?
        do {
            let p = Promise<Int>()
            let c = p.then { $0 + 1 }
            w = p; wc = c
        }
        XCTAssertNil(w); XCTAssertNil(wc)
    }
    func testRelease1M() {
        var root: Promise<Int>? = Promise<Int>()
        var p = root!
        for _ in 0..<1_000_000 { p = p.then(on: .immediate) { $0 + 1 } }
        root = nil
        _ = p
    }
    func testReleaseSettled1M() throws {
        var root: Promise<Int>? = Promise<Int>()
        var p = root!
        for _ in 0..<1_000_000 { p = p.then(on: .immediate) { $0 + 1 } }
        root!.fulfill(0)
        root = nil
        XCTAssertEqual(try p.wait(), 1_000_000)
        p = Promise<Int>()
    }
}
