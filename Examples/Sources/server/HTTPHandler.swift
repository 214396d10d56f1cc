// The NIO side of the server: reads a request, asks OrderService for a promise of the
// reply, and writes it when the promise settles, through PromiseNIO's
// Promise -> EventLoopFuture bridge.
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import Promise
import PromiseNIO

/// Requests answered, by outcome; read when the server stops.
final class Counters: Sendable {
    private let counts = NIOLockedValueBox((ok: 0, failed: 0))

    func record(_ status: HTTPResponseStatus) {
        counts.withLockedValue { counts in
            if status == .ok { counts.ok += 1 } else { counts.failed += 1 }
        }
    }

    var snapshot: (ok: Int, failed: Int) { counts.withLockedValue { $0 } }
}

/// One per connection. HTTPServerPipelineHandler (from configureHTTPServerPipeline) hands
/// it one request at a time, so at most one order is in flight per connection.
final class HTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let service: OrderService
    private let counters: Counters
    private var requestHead: HTTPRequestHead?
    /// The aggregates of the request in flight: held until its reply is written, and
    /// cancelled (with the lookups still pending under them) if the client goes away.
    private var inFlight: [AnyPromise] = []

    init(service: OrderService, counters: Counters) {
        self.service = service
        self.counters = counters
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            requestHead = head
        case .body:
            break  // GET only; a body is ignored
        case .end:
            guard let head = requestHead else { return }
            requestHead = nil
            let (work, reply) = service.respond(to: head.uri, replyOn: context.eventLoop)
            inFlight = work
            // Promise -> EventLoopFuture: the callback runs on this channel's loop, so it
            // may use `context` and `self` (assumeIsolated checks that it does).
            reply.futureResult(on: context.eventLoop).assumeIsolated().whenComplete { result in
                self.inFlight = []
                let reply = (try? result.get()) ?? Reply(status: .internalServerError, body: "no reply\n")
                self.write(reply, for: head, context: context)
            }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        for work in inFlight { work.cancel() }  // flows down to the lookups still pending
        inFlight = []
        context.fireChannelInactive()
    }

    private func write(_ reply: Reply, for head: HTTPRequestHead, context: ChannelHandlerContext) {
        counters.record(reply.status)
        var buffer = context.channel.allocator.buffer(capacity: reply.body.utf8.count)
        buffer.writeString(reply.body)
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        headers.add(name: "Content-Length", value: String(buffer.readableBytes))
        let keepAlive = head.isKeepAlive
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        let responseHead = HTTPResponseHead(version: head.version, status: reply.status, headers: headers)
        context.write(wrapOutboundOut(.head(responseHead)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        let written = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if !keepAlive {
            written.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        }
    }
}
