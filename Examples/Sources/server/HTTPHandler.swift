// The NIO side of the server: reads a request, asks an order service (OrderService, on
// promises, or FutureOrderService, on NIO futures) for a future of the reply, and writes
// it when that completes. The handler is the same for both, so that a comparison of the
// two measures the services only.
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// An order service as the channel handler sees it.
protocol OrderEngine: Sendable {
    /// What the handler holds while a reply is pending: the work it cancels if the client
    /// goes away.
    associatedtype Work: Sendable

    /// The reply to `uri`, as a future on `loop` (the channel's), whose callbacks may
    /// therefore touch the channel's context.
    func reply(to uri: String, on loop: any EventLoop) -> (work: Work, reply: EventLoopFuture<Reply>)

    /// Stops the lookups of `work` still pending.
    func cancel(_ work: Work)
}

/// Requests answered, by the status of their reply; read when the server stops. A
/// request counts once its reply has been written to the connection's socket in full,
/// not when the reply is ready: a reply to a client that went away, or cut off by a stop,
/// was never delivered.
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
/// it one request at a time, so at most one order is in flight per connection. Generic,
/// not over `any OrderEngine`, so that neither engine pays for an existential.
final class HTTPHandler<Engine: OrderEngine>: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let service: Engine
    private let counters: Counters
    private var requestHead: HTTPRequestHead?
    /// The work of the request in flight: held until its reply is written, and
    /// cancelled (with the lookups still pending under it) if the client goes away.
    private var inFlight: Engine.Work?

    init(service: Engine, counters: Counters) {
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
            let (work, reply) = service.reply(to: head.uri, on: context.eventLoop)
            inFlight = work
            // The callback runs on this channel's loop, so it may use `context` and `self`
            // (assumeIsolated checks that it does).
            reply.assumeIsolated().whenComplete { result in
                self.inFlight = nil
                let reply = (try? result.get()) ?? Reply(status: .internalServerError, body: "no reply\n")
                self.write(reply, for: head, context: context)
            }
        }
    }

    /// Closes the connection on any error that reaches the end of the pipeline. Most are
    /// NIO's HTTP parser's: a request it cannot read (a garbage request line, a header too
    /// long, a bad Content-Length or chunk, an unknown HTTP version) leaves nothing more to
    /// read on the connection. HTTPServerProtocolErrorHandler has written and flushed its
    /// 400 with "Connection: close" by then, but closes nothing itself, and neither does
    /// the decoder: without this close the connection would stay open for good.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let work = inFlight { service.cancel(work) }
        inFlight = nil
        context.fireChannelInactive()
    }

    private func write(_ reply: Reply, for head: HTTPRequestHead, context: ChannelHandlerContext) {
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
        // The end's write succeeds once the whole reply is in the socket (a channel writes
        // in order) and fails if the channel closes first, so a reply counts on success only.
        let written = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        let counters = self.counters
        let status = reply.status
        written.assumeIsolated().whenComplete { result in
            if case .success = result { counters.record(status) }
            if !keepAlive { context.close(promise: nil) }
        }
    }
}
