// The server's channels: the pipeline every connection gets. Apart from main.swift, so
// that the tests can build the same pipeline on an EmbeddedChannel.
import NIOCore
import NIOHTTP1

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
