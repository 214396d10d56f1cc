// The promise side of the server: one request fans out to five lookups that run on the
// backend's event loops, is joined with `all` and `and`, bounded with `timeout`, and is
// rendered on the channel's own loop. Nothing here touches NIO's channel API.
import NIOCore
import NIOHTTP1
import Promise
import PromiseNIO

/// The made-up catalogue the lookups read. Deterministic, so that the load test can
/// check every response body (Examples/LoadTest/orders.lua recomputes these).
enum Catalog {
    static let stockShards = 3

    static func userName(_ id: Int) -> String { "user-\(id)" }
    static func price(_ id: Int) -> Int { (id &* 7) % 100 + 1 }
    static func stock(_ id: Int, shard: Int) -> Int { (id + shard) % 4 }
}

/// What the channel handler writes back.
struct Reply: Sendable {
    let status: HTTPResponseStatus
    let body: String
}

/// Answers requests with promises. `Sendable`: it holds only the backend group.
struct OrderService: Sendable {
    /// The loops the lookups run on: stand-ins for a database or cache client, whose
    /// answers arrive on threads of their own.
    let backend: any EventLoopGroup
    /// How long a whole order may take before it is answered with 504.
    let deadline: Duration

    /// One lookup: `work` runs as a task on a backend loop, and its result fulfils the
    /// promise there (a throw would reject it). Cancelled before it ran, it never runs.
    func lookup<T: Sendable>(_ work: @escaping @Sendable () throws -> T) -> Promise<T> {
        Promise(on: .eventLoop(backend.next()), work)
    }

    /// The order page for `id`: user, price and the stock of every shard, in parallel.
    ///
    /// Returns the reply, rendered on `loop`, and the two aggregates it waits for. The
    /// caller holds those until the reply is written (cancelling them stops the lookups
    /// still pending): the library keeps an aggregate's output only weakly from its
    /// inputs, so `Promise.all(...)` whose only reference is a child would be freed
    /// before it settles.
    func order(_ id: Int, replyOn loop: any EventLoop) -> (work: [AnyPromise], reply: Promise<Reply>) {
        let user = lookup { Catalog.userName(id) }
        let price = lookup { Catalog.price(id) }
        let shards = Promise.all((0..<Catalog.stockShards).map { shard in
            lookup { Catalog.stock(id, shard: shard) }
        })
        let stock = shards.map(on: .immediate) { $0.reduce(0, +) }  // cheap: inline, where the last shard lands

        let joined = user.and(price, stock)           // Promise<(String, Int, Int)>
        let reply = joined
            .timeout(deadline)
            .then(on: .eventLoop(loop)) { user, price, stock in
                Reply(status: .ok,
                      body: "id=\(id) user=\(user) price=\(price) stock=\(stock) total=\(price * stock)\n")
            }
            .recover(on: .immediate) { error in
                if case PromiseError.timedOut = error {
                    // Stop the lookups still pending: the leaves, and `shards`, which
                    // cancels its own. Not `joined`: a cancel flows down to every
                    // descendant still pending or running, and this reply is one of
                    // joined's, so the client would get a cancellation, not the 504.
                    user.cancel()
                    price.cancel()
                    shards.cancel()
                    return Reply(status: .gatewayTimeout, body: "timed out\n")
                }
                return Reply(status: .internalServerError, body: "failed: \(error)\n")
            }
        return ([joined, shards], reply)
    }

    /// Routes a request target to a reply.
    func respond(to uri: String, replyOn loop: any EventLoop) -> (work: [AnyPromise], reply: Promise<Reply>) {
        if uri == "/health" {
            return ([], Promise(value: Reply(status: .ok, body: "ok\n")))
        }
        let prefix = "/order/"
        guard uri.hasPrefix(prefix) else {
            return ([], Promise(value: Reply(status: .notFound, body: "not found: \(uri)\n")))
        }
        guard let id = Int(uri.dropFirst(prefix.count)), id >= 0 else {
            return ([], Promise(value: Reply(status: .badRequest, body: "bad order id\n")))
        }
        return order(id, replyOn: loop)
    }
}
