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

let server: Server
do {
    server = try Server(options)
} catch {
    FileHandle.standardError.write(Data("server: cannot listen on 127.0.0.1:\(options.port): \(error)\n".utf8))
    exit(1)
}

// Stop on SIGTERM / SIGINT: close the listening socket; the main thread then stops the
// rest (Server.waitUntilStopped says in which order). Armed before the server says it
// listens (the line below, the port file), and waited for: a signal sent as soon as it
// says so must stop it, not kill it (the default action, before `signal`) nor be lost
// (ignored, between `signal` and the source's registration, which Dispatch makes later).
var signalSources: [any DispatchSourceSignal] = []
let registered = DispatchSemaphore(value: 0)
for signalNumber in [SIGTERM, SIGINT] {
    signal(signalNumber, SIG_IGN)
    let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
    // @Sendable: runs on a global queue, not on the main actor of this top-level code.
    source.setEventHandler { @Sendable in server.close() }
    source.setRegistrationHandler { @Sendable in registered.signal() }
    source.resume()
    signalSources.append(source)
}
for _ in signalSources { registered.wait() }

say("server: listening on http://127.0.0.1:\(server.port) (engine \(options.engine), \(options.threads) connection loops, \(options.threads) backend loops)")
if let portFile = options.portFile {
    do {
        try String(server.port).write(toFile: portFile, atomically: true, encoding: .utf8)
    } catch {
        FileHandle.standardError.write(Data("server: cannot write the port to \(portFile): \(error)\n".utf8))
        server.close()
        try? server.waitUntilStopped()
        exit(1)
    }
}

try server.waitUntilStopped()
let (ok, failed) = server.counters.snapshot
say("server: stopped; answered \(ok + failed) requests: \(ok) ok, \(failed) not ok")
