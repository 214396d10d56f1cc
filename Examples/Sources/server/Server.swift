// The server's channels: the pipeline every connection gets. Apart from main.swift, so
// that the tests can build the same pipeline on an EmbeddedChannel.
import NIOCore
import NIOHTTP1

/// Sets up a connection's pipeline: HTTP/1.1 parsing and encoding with NIO's error
/// handling (a request it cannot parse is answered 400), then one HTTPHandler on
/// `service`.
func configureConnection<Service: OrderEngine>(
    _ pipeline: ChannelPipeline.SynchronousOperations, service: Service, counters: Counters
) throws {
    try pipeline.configureHTTPServerPipeline(withErrorHandling: true)
    try pipeline.addHandler(HTTPHandler(service: service, counters: counters))
}
