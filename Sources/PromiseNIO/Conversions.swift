// Promise <-> EventLoopFuture, both ways, and the NIO-style helpers around them.
//
// What can be cancelled across the bridge: an EventLoopFuture has no cancellation, so a
// promise made from a future stops waiting for it when cancelled (it settles, its
// children are cancelled, the future's later completion is ignored) but the work behind
// the future runs on. The one NIO handle that can be stopped, `Scheduled`, is stopped:
// `Promise(scheduled)` cancels the scheduled task when the promise is cancelled. The
// other way, a future made from a promise cannot cancel the promise (NIO has no way to
// ask); cancel the promise itself.
#if SwiftNIO
import NIOCore
import Promise

extension Promise {
    /// An `EventLoopFuture` on `eventLoop` that completes as this promise settles.
    ///
    /// ```swift
    /// func channelRead(context: ChannelHandlerContext, data: NIOAny) {
    ///     lookup(key).futureResult(on: context.eventLoop)
    ///         .assumeIsolated()
    ///         .whenSuccess { value in context.writeAndFlush(wrapOutboundOut(value), promise: nil) }
    /// }
    /// ```
    ///
    /// A fulfilled promise succeeds the future; a rejected one fails it with the error; a
    /// cancelled one fails it with the cancellation reason (`CancellationError` unless
    /// `cancel(reason:)` gave another). The future's callbacks run on `eventLoop`, as NIO
    /// always does: completing from another thread hops to the loop. If the promise is
    /// freed while still pending, the future fails with `PromiseError.brokenPromise` (what
    /// every observer of a dropped promise gets) rather than leaking (NIO traps on leaked
    /// promises in debug builds). The loop must outlive the promise, as for any NIO
    /// promise completed from another thread: once it has shut down, NIO drops the
    /// completion it hops there, the future never completes, and NIO's debug builds trap
    /// on the leaked promise when it is freed.
    ///
    /// Observing costs one `whenComplete` on `.immediate`: no child promise, no extra hop
    /// beyond the one NIO makes when the promise settles off the loop. The future cannot
    /// cancel the promise: NIO futures have no cancellation.
    public func futureResult(on eventLoop: any EventLoop) -> EventLoopFuture<Value> {
        let nioPromise = eventLoop.makePromise(of: Value.self)
        nioPromise.completeWith(self)
        return nioPromise.futureResult
    }

    /// A promise that settles as `future` completes: fulfilled with its value, rejected
    /// with its error.
    ///
    /// ```swift
    /// let bytes = Promise(channel.writeAndFlush(buffer).map { buffer.readableBytes })
    /// bytes.then { print("wrote \($0) bytes") }
    /// ```
    ///
    /// It settles on the future's event loop, so `.immediate` handlers run there. The
    /// future keeps the promise alive until it completes, as any resolver does. The loop
    /// must not have shut down: NIO drops the callbacks of a future on a loop that has
    /// (completed or not), so the promise never hears of it. What was derived from it
    /// then breaks (`PromiseError.brokenPromise`) once the promise is freed; an `await` or
    /// `wait()` on the promise itself holds it, and waits until its timeout.
    ///
    /// Cancelling the promise stops waiting for the future: the promise settles as
    /// cancelled at once (its children with it) and the future's later completion is
    /// ignored. NIO futures cannot be cancelled, so the work behind the future runs on;
    /// attach `onCancel` to stop it yourself (close the channel), or build the promise
    /// from a `Scheduled` task, which is cancelled for you.
    ///
    /// `file` and `line` name where it was made, as for `Promise()`: leave them to their
    /// defaults.
    public convenience init(_ future: EventLoopFuture<Value>, file: StaticString = #fileID, line: UInt = #line) {
        self.init(file: file, line: line)
        future.whenComplete { [self] result in self.resolve(result) }
    }

    /// A promise for a task scheduled on an event loop (`EventLoop.scheduleTask`):
    /// cancelling the promise cancels the task if it has not run yet.
    ///
    /// ```swift
    /// let reminder = Promise(loop.scheduleTask(in: .seconds(30)) { "time's up" })
    /// reminder.cancel()   // the task will not run
    /// ```
    ///
    /// Otherwise it behaves as `Promise(scheduled.futureResult)`: it settles on the loop
    /// with the task's value or error. (`file` and `line`: as for `init(_:file:line:)`
    /// with a future.)
    public convenience init(_ scheduled: Scheduled<Value>, file: StaticString = #fileID, line: UInt = #line) {
        self.init(scheduled.futureResult, file: file, line: line)
        onCancel { scheduled.cancel() }
    }

    /// A child promise that settles on `eventLoop`, as the receiver did: NIO's
    /// `hop(to:)`.
    ///
    /// ```swift
    /// lookup(id)                                        // settles on a backend thread
    ///     .hop(to: channel.eventLoop)
    ///     .whenComplete(on: .immediate) { result in     // runs on the channel's loop
    ///         ...
    ///     }
    /// ```
    ///
    /// `.immediate` handlers registered on the returned promise before it settles run on
    /// the loop (one registered later runs inline, as on any settled promise). A fulfilment or
    /// rejection of the receiver always hops, even when it happens on the loop (no
    /// Zalgo); a cancellation flows down at once, on the cancelling thread, as it does
    /// everywhere. Cheaper than `then(on: .eventLoop(loop))` when nothing is transformed:
    /// the empty closure it stores needs no allocation. The loop must outlive the hop: a
    /// loop that has shut down drops it, and the child rejects, off the loop: with
    /// `PromiseError.brokenPromise` if the receiver fulfilled (the value would have
    /// reached the loop), with the receiver's error if it rejected (a dropped handler that
    /// would only have passed an error on passes it; see ``EventLoopContext``).
    public func hop(to eventLoop: any EventLoop) -> Promise<Value> {
        passOn(on: EventLoopContext(eventLoop))
    }
}

extension Promise {
    /// `timeout(_:)` with its timer on `eventLoop`: a child that settles as this promise
    /// does, unless `interval` passes first; then it rejects with
    /// `PromiseError.timedOut`. The receiver itself is untouched.
    ///
    /// ```swift
    /// let reply = lookups
    ///     .timeout(.milliseconds(500), on: context.eventLoop)
    ///     .recover(on: .immediate) { _ in .gatewayTimeout }
    /// ```
    ///
    /// The timer is a task scheduled on the loop (`scheduleTask(in:)`), and the child
    /// settling first cancels it, which takes it off the loop at once. Otherwise the child
    /// is `timeout(_:)`'s: a negative interval means now, one longer than a hundred years
    /// never elapses (no task is scheduled), and a promise may follow its own timeout
    /// child (the timer, not a cycle, settles it). The loop must outlive the deadline: a
    /// loop shut down first drops the task (NIO does), and the child then waits for the
    /// receiver alone (when it settles, the task's cancel reaches the shut-down loop, which
    /// NIO logs as an error). Do not call this on a loop that has shut down already: NIO drops
    /// the task without failing its promise, and its debug builds trap on that leaked
    /// promise. What this saves on a server: the library's own `timeout(_:)` sets its
    /// timer on the library's Dispatch timer heap, guarded by one queue that every loop
    /// shares, and fires it on one of the library's timer queues; here the timer stays on the loop (a request
    /// answered in a millisecond leaves nothing behind either way). The timeout's rejection
    /// runs on the loop, so `.immediate` handlers of the child run there when it times out.
    public func timeout(_ interval: Duration, on eventLoop: any EventLoop) -> Promise<Value> {
        timeout(interval) { interval, fire in
            let task = eventLoop.scheduleTask(in: TimeAmount(interval)) { fire() }
            return { task.cancel() }
        }
    }
}

extension EventLoopFuture where Value: Sendable {
    /// This future as a `Promise` (the same as `Promise(future)`).
    ///
    /// ```swift
    /// let pages = Promise.all(urls.map { client.get($0).promise() })
    /// ```
    ///
    /// `file` and `line` name where it was made, as for `Promise()`: leave them to their
    /// defaults.
    public func promise(file: StaticString = #fileID, line: UInt = #line) -> Promise<Value> {
        Promise(self, file: file, line: line)
    }
}

extension Scheduled where T: Sendable {
    /// This scheduled task as a `Promise` whose cancellation cancels the task (the same
    /// as `Promise(scheduled)`).
    ///
    /// ```swift
    /// let retry = loop.scheduleTask(in: .milliseconds(100)) { attempt() }.promise()
    /// ```
    ///
    /// `file` and `line`: as for `EventLoopFuture.promise(file:line:)`.
    public func promise(file: StaticString = #fileID, line: UInt = #line) -> Promise<T> {
        Promise(self, file: file, line: line)
    }
}

extension EventLoopPromise where Value: Sendable {
    /// Completes this NIO promise with the outcome of `promise`, as NIO's
    /// `completeWith(_ future:)` does for a future.
    ///
    /// ```swift
    /// let reply = context.eventLoop.makePromise(of: Reply.self)
    /// reply.completeWith(render(order))
    /// return reply.futureResult
    /// ```
    ///
    /// A cancelled promise fails it with the cancellation reason; a promise freed while
    /// pending fails it with `PromiseError.brokenPromise`, so NIO never sees a leaked
    /// promise.
    public func completeWith(_ promise: Promise<Value>) {
        let completer = NIOPromiseCompleter(self)
        promise.whenComplete(on: .immediate) { completer.complete($0) }
    }
}

/// Holds a NIO promise until a Promise settles. A Promise freed pending fires its
/// observer with `PromiseError.brokenPromise`; should the observer ever be released unrun,
/// the deinit still fails the NIO promise with that error, so NIO never sees a leak.
///
/// `@unchecked Sendable`: `nioPromise` is written by `complete`, which runs once, and read
/// by `deinit`, which runs after the last release, ordered after `complete` by the
/// reference count's release/acquire.
private final class NIOPromiseCompleter<Value: Sendable>: @unchecked Sendable {
    private var nioPromise: EventLoopPromise<Value>?

    init(_ promise: EventLoopPromise<Value>) {
        nioPromise = promise
    }

    func complete(_ result: Result<Value, any Error>) {
        nioPromise?.completeWith(result)
        nioPromise = nil
    }

    deinit {
        nioPromise?.fail(PromiseError.brokenPromise)
    }
}
#endif
