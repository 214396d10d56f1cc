// An HTTP server on SwiftNIO whose request handler is built from promises (or, to
// compare, from NIO futures only: --engine nio).
//
//   GET /order/<id>   five parallel lookups on the backend loops, joined with all/and,
//                     bounded by a timeout, rendered on the channel's loop:
//                     "id=42 user=user-42 price=95 stock=5 total=475"
//   GET /health       "ok"
//
// Listens on 127.0.0.1 only. `make server-load` builds it, starts it, loads it with wrk
// and checks every response (Examples/LoadTest/). By hand:
//
//   swift run -c release server --port 8080
//   curl http://127.0.0.1:8080/order/42
//
// Options (Options.swift checks each value, and rejects one out of range with a sentence
// that says what is allowed): --port N (0 to 65535; 0 picks a free port; default 8080),
// --port-file PATH (writes the bound port there once listening), --threads N (1 to 1024
// event loops for connections and as many for the backend; default: the number of cores),
// --deadline-ms N (per order, 1 to 3600000; default 1000), --engine promise|nio
// (OrderService or FutureOrderService; default promise).
// SIGTERM or SIGINT stops it and prints "answered N requests: X ok, Y not ok". N counts
// the replies the server wrote to their connection in full (the kernel took every byte;
// whether the client then read them, no server can tell), X those with status 200 and Y
// the rest (404, 400 for a bad id, 504, 500). Not counted: a reply ready only once its
// client had gone, or once the stop had closed its connection, since it was never sent;
// and the 400 that NIO itself writes for a request it cannot parse, before the connection
// closes.
import Dispatch
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// Prints a line and flushes it at once (stdout is a file under `make server-load`).
func say(_ line: String) {
    print(line)
    fflush(nil)
}

let options: Options
do {
    options = try Options(CommandLine.arguments)
} catch {
    FileHandle.standardError.write(Data("server: \(error)\nusage: server [--port N] [--port-file PATH] [--threads N] [--deadline-ms N] [--engine promise|nio]\n".utf8))
    exit(2)
}

let connections = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
let backend = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
let deadline = Duration.milliseconds(options.deadlineMilliseconds)
let engine = options.engine
let promiseService = OrderService(backend: backend, deadline: deadline)
let futureService = FutureOrderService(backend: backend, deadline: TimeAmount(deadline))
let counters = Counters()


let bootstrap = ServerBootstrap(group: connections)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelInitializer { channel in
        channel.eventLoop.makeCompletedFuture {
            // The same HTTPHandler, specialised for the chosen service.
            switch engine {
            case .promise: try configureConnection(channel.pipeline.syncOperations, service: promiseService, counters: counters)
            case .nio: try configureConnection(channel.pipeline.syncOperations, service: futureService, counters: counters)
            }
        }
    }
    .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
    .childChannelOption(.maxMessagesPerRead, value: 16)

let channel: any Channel
do {
    channel = try bootstrap.bind(host: "127.0.0.1", port: options.port).wait()
} catch {
    FileHandle.standardError.write(Data("server: cannot listen on 127.0.0.1:\(options.port): \(error)\n".utf8))
    exit(1)
}
let port = channel.localAddress?.port ?? options.port
say("server: listening on http://127.0.0.1:\(port) (engine \(engine), \(options.threads) connection loops, \(options.threads) backend loops)")
if let portFile = options.portFile {
    try String(port).write(toFile: portFile, atomically: true, encoding: .utf8)
}

// Stop on SIGTERM / SIGINT: close the listening socket; the main thread then shuts down.
var signalSources: [any DispatchSourceSignal] = []
for signalNumber in [SIGTERM, SIGINT] {
    signal(signalNumber, SIG_IGN)
    let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
    // @Sendable: runs on a global queue, not on the main actor of this top-level code.
    source.setEventHandler { @Sendable in channel.close(promise: nil) }
    source.resume()
    signalSources.append(source)
}

try channel.closeFuture.wait()
try connections.syncShutdownGracefully()
try backend.syncShutdownGracefully()
let (ok, failed) = counters.snapshot
say("server: stopped; answered \(ok + failed) requests: \(ok) ok, \(failed) not ok")
