// A whole server on a real socket: started, asked once over a connection that stays open,
// and stopped with that connection still open, for each engine.
import NIOCore
import NIOPosix
import XCTest

@testable import server

final class ServerTests: XCTestCase {
    /// The stop closes the connection it holds open before the loops go (the client sees
    /// the close), returns, and counts the one reply written.
    func testAStopClosesTheOpenConnectionsAndCountsTheRepliesWritten() throws {
        let clients = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { XCTAssertNoThrow(try clients.syncShutdownGracefully()) }

        for engine in ["promise", "nio"] {
            let server = try Server(Options(["server", "--port", "0", "--threads", "1", "--engine", engine]))
            let reply = clients.next().makePromise(of: String.self)
            let client = try ClientBootstrap(group: clients)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ReplyReader(reply))
                    }
                }
                .connect(host: "127.0.0.1", port: server.port).wait()
            client.writeAndFlush(ByteBuffer(string: "GET /order/42 HTTP/1.1\r\nHost: x\r\n\r\n"), promise: nil)
            XCTAssert(try reply.futureResult.wait().hasSuffix("\r\n\r\n" + OrderEngineTests.expected("/order/42").body), engine)

            server.close()
            try server.waitUntilStopped()
            try client.closeFuture.wait()  // closed by the server's stop, not by this client
            XCTAssertEqual(server.counters.snapshot.ok, 1, engine)
            XCTAssertEqual(server.counters.snapshot.failed, 0, engine)
        }
    }
}

/// Reads one HTTP reply whose body ends with a newline, and hands it over as text.
final class ReplyReader: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let reply: EventLoopPromise<String>
    private var text = ""

    init(_ reply: EventLoopPromise<String>) {
        self.reply = reply
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        text += String(buffer: unwrapInboundIn(data))
        if let headEnd = text.range(of: "\r\n\r\n"), text[headEnd.upperBound...].hasSuffix("\n") {
            reply.succeed(text)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        reply.fail(ChannelError.eof)  // ignored if the reply came first
        context.fireChannelInactive()
    }
}
