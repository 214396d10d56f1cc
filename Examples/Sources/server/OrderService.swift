// The promise side of the server: one request fans out to five lookups that run on the
// backend's event loops, is joined with `all` and `and`, bounded by a deadline timed on
// the channel's loop (PromiseNIO's `timeout(_:on:)`), and is rendered on that loop.
// FutureOrderService does the same with NIO futures.
import NIOCore
import Promise
import PromiseNIO

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
    /// caller holds those until the reply is written, so that it can cancel them if the
    /// client goes away, which stops the lookups still pending. (The reply alone would
    /// settle as well: an aggregate's inputs hold it until it settles.)
    ///
    /// The deadline is `timeout(_:on: loop)`, not `timeout(_:)`: the latter's timer is a
    /// Dispatch work item on the global queue, which stays in Dispatch's timer heap until
    /// its deadline even once cancelled and then wakes Dispatch's threads for nothing
    /// (about a sixth of the server's CPU time under load, measured with perf). The loop
    /// already keeps a timer heap, and a cancelled task leaves it at once.
    func order(_ id: Int, replyOn loop: any EventLoop) -> (work: [AnyPromise], reply: Promise<Reply>) {
        let user = lookup { Catalog.userName(id) }
        let price = lookup { Catalog.price(id) }
        let shards = Promise.all((0..<Catalog.stockShards).map { shard in
            lookup { Catalog.stock(id, shard: shard) }
        })
        let stock = shards.map(on: .immediate) { $0.reduce(0, +) }  // cheap: inline, where the last shard lands

        let joined = user.and(price, stock)           // Promise<(String, Int, Int)>
        let reply = joined
            .timeout(deadline, on: loop)              // its timer leaves the loop once joined settles
            .then(on: .eventLoop(loop)) { user, price, stock in
                Reply.order(id, user: user, price: price, stock: stock)
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
                    return .timedOut
                }
                return .failed(error)
            }
        return ([joined, shards], reply)
    }

    /// Routes a request target to a reply.
    func respond(to uri: String, replyOn loop: any EventLoop) -> (work: [AnyPromise], reply: Promise<Reply>) {
        switch Route(uri) {
        case .order(let id): order(id, replyOn: loop)
        case .reply(let reply): ([], Promise(value: reply))
        }
    }
}

extension OrderService: OrderEngine {
    /// The promise's reply as a future on `loop`, through PromiseNIO's bridge: its
    /// callbacks then run on the channel's loop, where the handler may touch `context`.
    func reply(to uri: String, on loop: any EventLoop) -> (work: [AnyPromise], reply: EventLoopFuture<Reply>) {
        let (work, reply) = respond(to: uri, replyOn: loop)
        return (work, reply.futureResult(on: loop))
    }

    func cancel(_ work: [AnyPromise]) {
        for promise in work { promise.cancel() }  // flows down to the lookups still pending
    }
}
