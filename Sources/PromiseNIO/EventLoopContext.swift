// SwiftNIO's EventLoop as an ExecutionContext. Built with the package trait SwiftNIO
// (TraitOff.swift says how to enable it when it is off).
#if SwiftNIO
import NIOCore
import Promise

/// Runs promise handlers on a SwiftNIO `EventLoop`.
///
/// A handler registered with `on: .eventLoop(loop)` runs on `loop`'s thread, so it may
/// touch the loop's non-`Sendable` state (a `ChannelHandlerContext` through
/// `NIOLoopBound`, a buffer allocator) like any other task of the loop.
///
/// ```swift
/// let loop = channel.eventLoop
/// lookup(id)                                    // settles on any thread
///     .then(on: .eventLoop(loop)) { render($0) } // runs on the channel's loop
/// ```
///
/// `execute` forwards to `EventLoop.execute`, which always enqueues, even when called on
/// the loop itself: a handler never runs inside the call that registered it (no Zalgo).
/// Shut the loop down only once the promises whose handlers it runs have settled and
/// their handlers have run: a loop that is shut down drops work handed to it (NIO logs
/// it, or stops the program in its strict mode), and a child whose handler is dropped
/// rejects with `PromiseError.brokenPromise` instead of waiting for ever (or, if the
/// handler would only have passed its parent's outcome on, a `then` on a rejected
/// parent, say, takes that outcome).
/// Handlers registered on one promise with one loop run in registration order, as NIO
/// runs a loop's tasks in the order they were enqueued. For work that must run on the
/// loop but is short and already there, `.immediate` saves the hop: a promise settled on
/// the loop's thread runs its `.immediate` handlers inline on that thread.
public struct EventLoopContext: ExecutionContext {
    /// The loop that runs the handlers.
    ///
    /// ```swift
    /// let context = EventLoopContext(channel.eventLoop)
    /// assert(context.eventLoop === channel.eventLoop)
    /// ```
    public let eventLoop: any EventLoop

    /// A context that runs handlers on `eventLoop`.
    ///
    /// ```swift
    /// let context = EventLoopContext(group.next())
    /// ```
    public init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    /// Enqueues `work` on the loop (`EventLoop.execute`): the library calls this for each
    /// handler registered with this context.
    ///
    /// ```swift
    /// EventLoopContext(loop).execute { print("on the loop:", loop.inEventLoop) }
    /// ```
    public func execute(_ work: @escaping @Sendable () -> Void) {
        eventLoop.execute(work)
    }
}

extension ExecutionContext where Self == EventLoopContext {
    /// Runs handlers on `loop`.
    ///
    /// ```swift
    /// promise.then(on: .eventLoop(context.eventLoop)) { reply in render(reply) }
    /// ```
    public static func eventLoop(_ loop: any EventLoop) -> EventLoopContext {
        EventLoopContext(loop)
    }
}

extension EventLoop {
    /// This loop as an execution context for promise handlers.
    ///
    /// ```swift
    /// promise.then(on: context.eventLoop.executionContext) { ... }
    /// ```
    public var executionContext: EventLoopContext {
        EventLoopContext(self)
    }
}
#endif
