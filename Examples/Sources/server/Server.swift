// The server's channels and loops: the pipeline every connection gets, and the order in
// which a stop takes them down. Apart from main.swift, so that the tests can build the
// same pipeline on an EmbeddedChannel, and start and stop a server.
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix

/// The server: the listening channel on 127.0.0.1, the connections it accepted, and two
/// groups of loops, one for the connections and one for the backend's lookups.
final class Server: Sendable {
    /// The port it listens on: the one the system chose, if asked for port 0.
    let port: Int
    /// Requests answered; final once `waitUntilStopped` has returned.
    let counters: Counters
    private let listener: any Channel
    private let connections: OpenConnections
    private let connectionLoops: MultiThreadedEventLoopGroup
    private let backend: MultiThreadedEventLoopGroup

    /// Starts listening on 127.0.0.1 as `options` say. If it cannot bind, it throws
    /// after shutting its loops down.
    init(_ options: Options) throws {
        let connectionLoops = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
        let backend = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
        let deadline = Duration.milliseconds(options.deadlineMilliseconds)
        let promiseService = OrderService(backend: backend, deadline: deadline)
        let futureService = FutureOrderService(backend: backend, deadline: TimeAmount(deadline))
        let engine = options.engine
        let counters = Counters()
        let connections = OpenConnections()

        let bootstrap = ServerBootstrap(group: connectionLoops)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    // Accepted as the server stops, after it closed the connections it
                    // held: refused (the bootstrap closes it), or it would outlive its loop.
                    guard connections.add(channel) else { throw ChannelError.ioOnClosedChannel }
                    // The same HTTPHandler, specialised for the chosen service.
                    switch engine {
                    case .promise:
                        try configureConnection(channel.pipeline.syncOperations, service: promiseService, counters: counters)
                    case .nio:
                        try configureConnection(channel.pipeline.syncOperations, service: futureService, counters: counters)
                    }
                }
            }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 16)

        do {
            listener = try bootstrap.bind(host: "127.0.0.1", port: options.port).wait()
        } catch {
            try? backend.syncShutdownGracefully()
            try? connectionLoops.syncShutdownGracefully()
            throw error
        }
        self.port = listener.localAddress?.port ?? options.port
        self.counters = counters
        self.connections = connections
        self.connectionLoops = connectionLoops
        self.backend = backend
    }

    /// Closes the listening socket, which starts the stop that `waitUntilStopped` waits
    /// for. Callable from any thread, and more than once (the signal handlers call it).
    func close() {
        listener.close(promise: nil)
    }

    /// Waits until the listening socket is closed (by `close`), then stops the server in
    /// an order that leaves no work for a loop already shut down:
    ///
    /// 1. Every connection is closed, and waited for. Closing one cancels its order in
    ///    flight (HTTPHandler.channelInactive), and its reply is no longer written.
    /// 2. The backend loops shut down, running the lookups already queued on them. With
    ///    --engine nio each lookup completes a NIO promise made on a connection loop,
    ///    which hops there, so those loops must still run.
    /// 3. The connection loops shut down.
    ///
    /// The connection loops used to go first, and the lookups still queued then found
    /// their loops gone: NIO logged "Cannot schedule tasks on an EventLoop that has already
    /// shut down" for each, which is a fatal error when SWIFTNIO_STRICT is set.
    func waitUntilStopped() throws {
        try listener.closeFuture.wait()
        try connections.closeAll(on: connectionLoops.next()).wait()
        try backend.syncShutdownGracefully()
        try connectionLoops.syncShutdownGracefully()
    }
}

/// The connections open now, so that a stop can close them while their loops still run.
/// Keyed by identity: a channel is held from its initializer until its close.
final class OpenConnections: Sendable {
    private struct State {
        var channels: [ObjectIdentifier: any Channel] = [:]
        var closing = false
    }

    private let state = NIOLockedValueBox(State())

    /// Holds `channel` until it closes. Returns false once `closeAll` has run, and then
    /// holds nothing: the caller must close the channel itself.
    func add(_ channel: any Channel) -> Bool {
        let key = ObjectIdentifier(channel)
        let added = state.withLockedValue { state in
            guard !state.closing else { return false }
            state.channels[key] = channel
            return true
        }
        if added {
            // The closure holds the channel until it runs, so its identity cannot be
            // reused by another channel before it is removed.
            channel.closeFuture.whenComplete { _ in
                self.state.withLockedValue { _ = $0.channels.removeValue(forKey: ObjectIdentifier(channel)) }
            }
        }
        return added
    }

    /// Closes every connection held and refuses any added later; the future, on `loop`,
    /// succeeds once all of them have closed.
    func closeAll(on loop: any EventLoop) -> EventLoopFuture<Void> {
        let open = state.withLockedValue { state in
            state.closing = true
            return Array(state.channels.values)
        }
        for channel in open { channel.close(promise: nil) }
        return EventLoopFuture.andAllComplete(open.map(\.closeFuture), on: loop)
    }
}

/// Sets up a connection's pipeline: NIO's BackPressureHandler, HTTP/1.1 parsing and
/// encoding with NIO's error handling (a request it cannot parse is answered 400), then
/// one HTTPHandler on `service`.
///
/// The BackPressureHandler stops reading while the channel is not writable, that is while
/// more replies wait to be sent than the channel's high water mark allows, and reads again
/// once they drain. Without it a client that pipelines requests and never reads the
/// replies makes the server keep every reply in memory: a million of them took it from 22
/// MB to 660 MB. It comes first, at the socket end, because it passes ByteBuffers only.
func configureConnection<Service: OrderEngine>(
    _ pipeline: ChannelPipeline.SynchronousOperations, service: Service, counters: Counters
) throws {
    try pipeline.addHandler(BackPressureHandler())
    try pipeline.configureHTTPServerPipeline(withErrorHandling: true)
    try pipeline.addHandler(HTTPHandler(service: service, counters: counters))
}
