// The two order services must be interchangeable: `make server-compare` measures them
// against each other, which means something only if they answer every request alike.
// These tests ask both for the same targets on real event loops, as HTTPHandler does, and
// compare the replies with each other and with replies computed here.
import Dispatch
import NIOCore
import NIOPosix
import Promise
import XCTest

@testable import server

final class OrderEngineTests: XCTestCase {
    /// Targets of every route: orders at the edges of the catalogue (up to the largest
    /// ids, whose arithmetic must not overflow), /health, unknown paths and bad ids.
    static let uris = [
        "/order/0", "/order/1", "/order/7", "/order/42", "/order/999999",
        "/order/\(Int.max / 7)", "/order/\(Int.max / 7 + 1)", "/order/\(Int.max - 2)",
        "/order/\(Int.max - 1)", "/order/\(Int.max)", "/order/\(Int.max)0",
        "/health", "/", "/nope", "/order", "/order/", "/order/x", "/order/-1", "/order/12abc",
    ]

    func testBothEnginesAnswerEveryTargetAlikeAndRightly() throws {
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let backend = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        defer { shutDown(backend, loops) }  // the lookups' loops first: nothing runs on them now
        let loop = loops.next()
        // A deadline no test machine reaches, so that only a timeout test sees a 504.
        let promise = OrderService(backend: backend, deadline: .seconds(60))
        let nio = FutureOrderService(backend: backend, deadline: .seconds(60))

        for uri in Self.uris {
            let byPromise = try ask(promise, uri, on: loop).reply
            let byNIO = try ask(nio, uri, on: loop).reply
            XCTAssertEqual(byPromise, byNIO, uri)
            XCTAssertEqual(byPromise, Self.expected(uri), uri)
        }
        // The expectation's arithmetic, checked once by hand.
        XCTAssertEqual(Self.expected("/order/42").body, "id=42 user=user-42 price=95 stock=5 total=475\n")
    }

    /// The two largest ids, once crashing the server, answered rightly by both engines.
    /// Worked by hand from the ids' last digits: Int.max = 9223372036854775807 is 7 mod
    /// 100 (price 7 * 7 + 1 = 50) and 3 mod 4 (stock 3 + 0 + 1 = 4); Int.max - 1 is 6 mod
    /// 100 (price 43) and 2 mod 4 (stock 2 + 3 + 0 = 5).
    func testBothEnginesAnswerTheLargestIds() throws {
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let backend = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        defer { shutDown(backend, loops) }
        let loop = loops.next()
        let promise = OrderService(backend: backend, deadline: .seconds(60))
        let nio = FutureOrderService(backend: backend, deadline: .seconds(60))
        let expected = [
            Int.max: "id=9223372036854775807 user=user-9223372036854775807 price=50 stock=4 total=200\n",
            Int.max - 1: "id=9223372036854775806 user=user-9223372036854775806 price=43 stock=5 total=215\n",
        ]

        for (id, body) in expected {
            let uri = "/order/\(id)"
            XCTAssertEqual(try ask(promise, uri, on: loop).reply, Reply(status: .ok, body: body), uri)
            XCTAssertEqual(try ask(nio, uri, on: loop).reply, Reply(status: .ok, body: body), uri)
        }
    }

    /// The backend's only loop is held busy until both replies are in, so no lookup can
    /// finish before the deadline, whatever the machine's speed: the timeout must win.
    func testATimeoutAnswers504AndCancelsTheLookupsInBoth() throws {
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let backend = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let gate = DispatchSemaphore(value: 0)
        let loop = loops.next()
        backend.next().execute { gate.wait() }
        defer {
            // Also on a throw. Let the held lookups run out (the NIO engine's fail their
            // promises on `loop`), then the hops they made to `loop`, and only then shut
            // the groups down: a loop shut down first would drop that work.
            gate.signal()
            XCTAssertNoThrow(try backend.next().submit {}.wait())
            XCTAssertNoThrow(try loop.submit {}.wait())
            shutDown(backend, loops)
        }
        let promise = OrderService(backend: backend, deadline: .milliseconds(1))
        let nio = FutureOrderService(backend: backend, deadline: .milliseconds(1))

        let byPromise = try ask(promise, "/order/42", on: loop)
        let byNIO = try ask(nio, "/order/42", on: loop)

        XCTAssertEqual(byPromise.reply, Reply(status: .gatewayTimeout, body: "timed out\n"))
        XCTAssertEqual(byNIO.reply, byPromise.reply)
        // Both stopped their pending lookups before answering: nothing waits for them.
        XCTAssertEqual(byPromise.work.count, 2)
        XCTAssertFalse(byPromise.work.contains(where: \.isPending))
        XCTAssertEqual(byNIO.work?.withLockedValue { $0 }, true)
    }

    // MARK: Helpers

    /// Asks `engine` for `uri` from `loop`, as HTTPHandler does, and waits for the reply,
    /// holding the work until then as the handler does.
    private func ask<Engine: OrderEngine>(
        _ engine: Engine, _ uri: String, on loop: any EventLoop
    ) throws -> (work: Engine.Work, reply: Reply) {
        let asked = try loop.submit { engine.reply(to: uri, on: loop) }.wait()
        return (asked.work, try asked.reply.wait())
    }

    private func shutDown(_ groups: MultiThreadedEventLoopGroup...) {
        for group in groups { XCTAssertNoThrow(try group.syncShutdownGracefully()) }
    }

    /// The reply to `uri`, computed independently of the server (as orders.lua does).
    static func expected(_ uri: String) -> Reply {
        switch uri {
        case "/health":
            return Reply(status: .ok, body: "ok\n")
        case let uri where !uri.hasPrefix("/order/"):
            return Reply(status: .notFound, body: "not found: \(uri)\n")
        case let uri:
            guard let id = Int(uri.dropFirst("/order/".count)), id >= 0 else {
                return Reply(status: .badRequest, body: "bad order id\n")
            }
            // id * 7 % 100 + 1 and (id + shard) % 4, reduced first so that no id overflows.
            let price = id % 100 * 7 % 100 + 1
            let stock = (0..<3).map { (id % 4 + $0) % 4 }.reduce(0, +)
            return Reply(status: .ok, body: "id=\(id) user=user-\(id) price=\(price) stock=\(stock) total=\(price * stock)\n")
        }
    }
}
