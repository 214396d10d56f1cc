// OrderService's twin written with SwiftNIO futures only: the same five lookups on the
// backend loops, the same join, deadline and rendering on the channel's loop, and the
// same replies, so that `server --engine nio` measures NIO doing what `--engine promise`
// does (make server-compare).
import NIOConcurrencyHelpers
import NIOCore

/// Answers requests with `EventLoopFuture`s only. Where it differs from OrderService, it
/// is because NIO futures differ, and each difference is the cheapest careful NIO code:
///
/// - A future cannot be cancelled. The lookups of one order share a flag instead, set on
///   timeout or when the client goes away: a lookup that has not started by then does not
///   run (its future fails), as a cancelled promise's task does not run. It costs a lock
///   per lookup and an allocation per order, where Promise reads the promise's own state.
/// - A future belongs to one loop, and a callback registered on it from another loop
///   costs a hop. So each lookup's future is made on the channel's loop and completed
///   from the backend task (one hop back per lookup, NIO's own `succeed` off the loop),
///   and the join runs on the channel's loop; the promise version joins on the backend
///   threads, where the last lookup lands, and hops once to render.
/// - The deadline is a task scheduled on the channel's loop, as in OrderService; here it
///   is cancelled where the join completes, which is on that loop too.
struct FutureOrderService: Sendable {
    /// The loops the lookups run on, as in OrderService.
    let backend: any EventLoopGroup
    /// How long a whole order may take before it is answered with 504.
    let deadline: TimeAmount

    /// Set once the order's reply no longer needs the lookups still pending.
    typealias Cancellation = NIOLockedValueBox<Bool>

    /// One lookup: `work` runs as a task on a backend loop; the future is on `loop`.
    func lookup<T: Sendable>(
        replyOn loop: any EventLoop, _ cancelled: Cancellation,
        _ work: @escaping @Sendable () throws -> T
    ) -> EventLoopFuture<T> {
        let promise = loop.makePromise(of: T.self)
        backend.next().execute {
            if cancelled.withLockedValue({ $0 }) {
                promise.fail(CancellationError())  // NIO asserts that every promise completes
            } else {
                promise.completeWith(Result(catching: work))
            }
        }
        return promise.futureResult
    }

    /// The order page for `id`, rendered on `loop`, and the flag that cancels its lookups.
    func order(_ id: Int, replyOn loop: any EventLoop) -> (work: Cancellation, reply: EventLoopFuture<Reply>) {
        let cancelled = Cancellation(false)
        let user = lookup(replyOn: loop, cancelled) { Catalog.userName(id) }
        let price = lookup(replyOn: loop, cancelled) { Catalog.price(id) }
        let shards = (0..<Catalog.stockShards).map { shard in
            lookup(replyOn: loop, cancelled) { Catalog.stock(id, shard: shard) }
        }
        let stock = EventLoopFuture.whenAllSucceed(shards, on: loop).map { $0.reduce(0, +) }
        let joined = user.and(price).and(stock)       // EventLoopFuture<((String, Int), Int)>

        // Whichever answers first wins: a NIO promise completes once and ignores the
        // later completion. Both run on `loop`, so they cannot interleave.
        let reply = loop.makePromise(of: Reply.self)
        let timer = loop.scheduleTask(in: deadline) {
            cancelled.withLockedValue { $0 = true }   // the lookups not started yet: skipped
            reply.succeed(.timedOut)
        }
        joined.whenComplete { result in
            timer.cancel()
            switch result {
            case .success(let ((user, price), stock)):
                reply.succeed(.order(id, user: user, price: price, stock: stock))
            case .failure(let error):
                reply.succeed(.failed(error))
            }
        }
        return (cancelled, reply.futureResult)
    }
}

extension FutureOrderService: OrderEngine {
    func reply(to uri: String, on loop: any EventLoop) -> (work: Cancellation?, reply: EventLoopFuture<Reply>) {
        switch Route(uri) {
        case .order(let id):
            let (work, reply) = order(id, replyOn: loop)
            return (work, reply)
        case .reply(let reply):
            return (nil, loop.makeSucceededFuture(reply))
        }
    }

    func cancel(_ work: Cancellation?) {
        work?.withLockedValue { $0 = true }
    }
}
