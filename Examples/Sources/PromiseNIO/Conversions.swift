// Promise <-> EventLoopFuture, both ways.
import NIOCore
import Promise

extension Promise {
    /// An `EventLoopFuture` on `eventLoop` that completes as this promise settles.
    ///
    /// ```swift
    /// func channelRead(context: ChannelHandlerContext, data: NIOAny) {
    ///     lookup(key).futureResult(on: context.eventLoop)
    ///         .assumeIsolated()
    ///         .whenSuccess { context.writeAndFlush(...) }
    /// }
    /// ```
    ///
    /// A fulfilled promise succeeds the future; a rejected one fails it with the error; a
    /// cancelled one fails it with the cancellation reason (`CancellationError` unless
    /// `cancel(reason:)` gave another). The future's callbacks run on `eventLoop`, as NIO
    /// always does: completing from another thread hops to the loop. If the promise is
    /// freed while still pending, the future fails with `PromiseError.brokenPromise` (what
    /// every observer of a dropped promise gets) rather than leaking (NIO traps on leaked
    /// promises in debug builds).
    ///
    /// Observing costs one `whenComplete` on `.immediate`: no child promise, no extra hop
    /// beyond the one NIO makes when the promise settles off the loop.
    public func futureResult(on eventLoop: any EventLoop) -> EventLoopFuture<Value> {
        let completer = FutureCompleter(eventLoop.makePromise(of: Value.self))
        whenComplete(on: .immediate) { completer.complete($0) }
        return completer.futureResult
    }

    /// A promise that settles as `future` completes: fulfilled with its value, rejected
    /// with its error.
    ///
    /// ```swift
    /// let bytes = Promise(channel.writeAndFlush(buffer).map { buffer.readableBytes })
    /// bytes.then { print("wrote \($0) bytes") }
    /// ```
    ///
    /// It settles on the future's event loop, so `.immediate` handlers run there. NIO
    /// futures cannot be cancelled: cancelling the promise settles it (and flows down to
    /// its children) but leaves the future's work running, and its later completion is
    /// ignored. Attach `onCancel` to stop that work yourself (close the channel, cancel a
    /// scheduled task).
    public convenience init(_ future: EventLoopFuture<Value>) {
        self.init()
        future.whenComplete { [self] result in self.resolve(result) }
    }
}

extension EventLoopFuture where Value: Sendable {
    /// This future as a `Promise` (the same as `Promise(future)`).
    ///
    /// ```swift
    /// let pages = Promise.all(urls.map { client.get($0).promise() })
    /// ```
    public func promise() -> Promise<Value> {
        Promise(self)
    }
}

/// Holds the NIO promise until the Promise settles. A Promise freed pending fires its
/// observer with `PromiseError.brokenPromise`; should the observer ever be released unrun,
/// the deinit still fails the NIO promise with that error, so NIO never sees a leak.
///
/// `@unchecked Sendable`: `nioPromise` is written twice at most: by `complete`, which
/// runs once, and read by `deinit`, which runs after the last release, ordered after
/// `complete` by the reference count's release/acquire.
private final class FutureCompleter<Value: Sendable>: @unchecked Sendable {
    private var nioPromise: EventLoopPromise<Value>?
    let futureResult: EventLoopFuture<Value>

    init(_ promise: EventLoopPromise<Value>) {
        nioPromise = promise
        futureResult = promise.futureResult
    }

    func complete(_ result: Result<Value, any Error>) {
        nioPromise?.completeWith(result)
        nioPromise = nil
    }

    deinit {
        nioPromise?.fail(PromiseError.brokenPromise)
    }
}
