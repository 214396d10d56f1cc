// A connection's pipeline as the server sets it up (configureConnection), on NIO's
// EmbeddedChannel: the test hands it bytes and reads what it writes back, with no socket
// and no other thread, so that every step is deterministic.
import NIOCore
import NIOEmbedded
import XCTest

@testable import server

final class ConnectionTests: XCTestCase {
    /// Requests NIO's parser rejects, one kind each.
    static let unparseable: [(name: String, bytes: String)] = [
        ("a garbage request line", "GARBAGE\r\n\r\n"),
        ("a header longer than NIO allows", "GET / HTTP/1.1\r\nX: \(String(repeating: "a", count: 200_000))\r\n\r\n"),
        ("a bad Content-Length", "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n"),
        ("an unknown HTTP version", "GET / HTTP/9.9\r\n\r\n"),
        ("a bad chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    ]

    /// Each request NIO cannot parse is answered 400 with "Connection: close", and then
    /// the connection is closed, not left open for good.
    func testAnUnparseableRequestIsAnswered400AndTheConnectionClosed() throws {
        for (name, bytes) in Self.unparseable {
            let engine = HeldEngine()
            let channel = try connection(engine)
            try channel.writeInbound(ByteBuffer(string: bytes))

            let text = try written(channel).lowercased()
            XCTAssert(text.hasPrefix("http/1.1 400 bad request\r\n"), "\(name): \(text)")
            XCTAssert(text.contains("\r\nconnection: close\r\n"), "\(name): \(text)")
            XCTAssertFalse(channel.isActive, name)
            XCTAssertEqual(engine.asked, 0, name)
        }
    }

    /// The connection stops reading while it cannot write (replies pile up unsent), and
    /// reads again once it can: the BackPressureHandler at the head of the pipeline holds
    /// the reads back. A request read then is still parsed and answered, so the handler
    /// sits before the HTTP decoder, where it gets the ByteBuffers it expects.
    func testReadsStopWhileTheConnectionCannotWrite() throws {
        let engine = HeldEngine()
        let channel = try connection(engine)
        let reads = ReadCounter()  // first, at the socket end: counts the reads that get there
        try channel.pipeline.syncOperations.addHandler(reads, position: .first)

        channel.read()
        XCTAssertEqual(reads.count, 1)

        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        channel.read()
        channel.read()
        XCTAssertEqual(reads.count, 1, "a read got through while the channel was not writable")

        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        XCTAssertEqual(reads.count, 2, "the held read goes through, once, when writable again")

        try channel.writeInbound(ByteBuffer(string: "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
        XCTAssertEqual(engine.asked, 1)
        engine.answer(.health)
        XCTAssert(try written(channel).hasPrefix("HTTP/1.1 200 OK\r\n"))
        XCTAssertEqual(try channel.finish().isClean, true)
    }

    /// A reply written on an open connection counts; one that is ready only once the client
    /// has gone (the 500 of a cancelled order, say) is not written, and does not count.
    func testOnlyRepliesWrittenCount() throws {
        let counters = Counters()
        let engine = HeldEngine()
        let open = try connection(engine, counters: counters)
        try open.writeInbound(ByteBuffer(string: "GET /order/42 HTTP/1.1\r\nHost: x\r\n\r\n"))
        engine.answer(OrderEngineTests.expected("/order/42"))
        XCTAssert(try written(open).hasPrefix("HTTP/1.1 200 OK\r\n"))
        XCTAssertEqual(counters.snapshot.ok, 1)
        XCTAssertEqual(counters.snapshot.failed, 0)

        let closed = try connection(engine, counters: counters)
        try closed.writeInbound(ByteBuffer(string: "GET /order/43 HTTP/1.1\r\nHost: x\r\n\r\n"))
        try closed.close().wait()
        // The rest of the close, queued on the loop: the pipeline's handlers are removed, so
        // that a write from one fails, as a closed socket's does. (An EmbeddedChannel itself
        // would take a write after its close.)
        closed.embeddedEventLoop.run()
        XCTAssertEqual(engine.cancelled, 1, "the order in flight is cancelled when the client goes")
        engine.answer(.failed(CancellationError()))
        XCTAssertEqual(try written(closed), "")
        XCTAssertEqual(counters.snapshot.ok, 1)
        XCTAssertEqual(counters.snapshot.failed, 0, "a reply never written was counted")
    }

    // MARK: Helpers

    /// A connected EmbeddedChannel set up as the server sets up a connection.
    func connection<Service: OrderEngine>(_ service: Service, counters: Counters = Counters()) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try configureConnection(channel.pipeline.syncOperations, service: service, counters: counters)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    /// Everything the channel has written so far, as text.
    func written(_ channel: EmbeddedChannel) throws -> String {
        var text = ""
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) {
            text += String(buffer: buffer)
        }
        return text
    }
}

/// Counts the reads that reach it, and passes them on.
final class ReadCounter: ChannelOutboundHandler {
    typealias OutboundIn = NIOAny
    private(set) var count = 0

    func read(context: ChannelHandlerContext) {
        count += 1
        context.read()
    }
}

/// An order service whose replies the test completes by hand: `reply(to:on:)` hands out
/// a promise made on the channel's loop, the EmbeddedChannel's, which runs only when the
/// test runs it. Not Sendable in fact, but only ever used on the test's thread.
final class HeldEngine: OrderEngine, @unchecked Sendable {
    /// The replies asked for, in order, not yet completed by the test.
    private(set) var pending: [EventLoopPromise<Reply>] = []
    /// How many replies were asked for.
    private(set) var asked = 0
    /// How many were cancelled because the client went away.
    private(set) var cancelled = 0

    func reply(to uri: String, on loop: any EventLoop) -> (work: Int, reply: EventLoopFuture<Reply>) {
        let promise = loop.makePromise(of: Reply.self)
        pending.append(promise)
        asked += 1
        return (asked, promise.futureResult)
    }

    func cancel(_ work: Int) {
        cancelled += 1
    }

    /// Completes the oldest pending reply with `reply`.
    func answer(_ reply: Reply) {
        pending.removeFirst().succeed(reply)
    }
}
