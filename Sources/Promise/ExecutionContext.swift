import Dispatch

/// Where a handler runs: a queue, an event loop, or the settling thread itself.
///
/// Conform your own executor (an event loop, a thread pool) by forwarding `execute`:
///
/// ```swift
/// struct LoopContext: ExecutionContext {
///     let loop: EventLoop
///     func execute(_ work: @escaping @Sendable () -> Void) { loop.execute(work) }
/// }
/// promise.then(on: LoopContext(loop: loop)) { ... }
/// ```
///
/// Contract: `execute` must run `work` exactly once, later (never inside the call), or
/// handlers would run inside `then` on an already settled promise ("Zalgo"). Only the
/// built-in `.immediate` context runs work inline, and the library treats it specially.
/// A context that drops work unrun (an executor shut down) breaks the contract, and the
/// library answers for it: the child whose handler it dropped, or the promise whose work
/// it dropped (`Promise(on:_:)`), rejects with `PromiseError.brokenPromise` once the
/// context lets go of the work (a moment later, on a queue of the library's own: never
/// inside the context's own call), and so does the output of a run that queues its own
/// steps (`retry`, `sequence`, `all(_:maxConcurrent:)`): nobody waits on it for ever. A
/// dropped handler that would only have passed its parent's outcome through (`then` on a
/// rejected parent, `recover` on a fulfilled one) runs no user code: its child takes that
/// outcome instead. (A context that keeps the work and never runs it cannot be told from
/// a slow one.)
/// Dispatch's queues run every block, so work for them goes as it is; for any other
/// context, the watch costs an allocation per handler sent. A context that runs work
/// twice breaks it too; the library then runs each handler, observer and step once, and
/// ignores the second run. A context that runs work inside `execute` (an executor that
/// runs it at once when called on its own thread, say) breaks it as well, and gets Zalgo;
/// but a long chain of handlers on it cannot overflow the stack: a call to `execute` that
/// would be nested in 16 others on one thread is queued instead, and made, in order, on
/// that thread, once the outermost call returns (so each handler still runs inside its
/// context's `execute`). A handler that blocks that deep waiting for one of those queued
/// handlers waits for ever, as with `.immediate` (see `wait()`).
public protocol ExecutionContext: Sendable {
    /// Schedules `work` to run once, asynchronously.
    func execute(_ work: @escaping @Sendable () -> Void)
}

/// A one-shot flag: `claim` is true for the first caller only (one CAS). For work handed
/// to a context the user gave, which must run it once but may run it twice, one run after
/// the other or both at once (a contract broken), when the work has no one-shot state of
/// its own to take (a handler's hold on its parent, an observer's source); and for two
/// parties that race to be first (a Task settling its promise, and the hook that cancels
/// the Task when the promise settles otherwise).
class RunOnce: @unchecked Sendable {
    // First stored property: `claim` addresses it as the election's word.
    private var claimed: UInt = 0

    private final var claimedWord: UnsafeMutablePointer<UInt> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: UInt.self)
    }

    final func claim() -> Bool {
        electOnce(claimedWord)
    }

    /// Whether a caller claimed it. Acquire: a claim on another thread that happened
    /// before (through the reference count, for a `WatchedWork`'s deinit) is seen, and
    /// the load says so to the sanitizers too.
    final var wasClaimed: Bool { loadWordAcquiring(claimedWord) != 0 }
}

/// Work for a context that might let go of it unrun: an `OperationQueue` whose operations
/// were cancelled (`cancelAllOperations()` at shutdown), an event loop or thread pool shut
/// down, a user's context that drops work. The closure the context gets holds this object
/// and nothing else, so a context that releases it without running it frees this object
/// with `body` unrun, and `deinit` then runs `dropped`: for a handler, the child breaks
/// (`PromiseError.brokenPromise`, as the runs that queue their own steps, `retry` and
/// `sequence`, break their output), or takes its parent's outcome if the handler would
/// only have passed it through, and lets go of its parent and the handler, as the work
/// would have; for `Promise(on:_:)`, the promise breaks. So nobody waits on it for ever.
///
/// `dropped` runs on one of the library's own lanes (`TimerHeap.send`), a moment later:
/// not on the thread that let go of the work, which may hold the context's own lock (the
/// break runs the promise's `.immediate` observers and hands its children to their
/// contexts, that one's too), and not on Dispatch's global pool, which handlers blocked
/// in `wait()` may hold (the lanes are serial queues, which Dispatch gives a thread even
/// then, as it does for timeouts).
///
/// Runs `body` at most once, also on a context that runs its work twice (a broken
/// contract). Cost: one allocation per hand-off. Dispatch's queues (`.default`, `.main`,
/// a `DispatchQueue`, `.concurrent(queue)`) run every block they are given, so work for
/// them goes as it is (`StoredContext.runsEveryWork`).
final class WatchedWork: RunOnce, @unchecked Sendable {
    private let body: @Sendable () -> Void
    private let dropped: @Sendable () -> Void

    init(_ body: @escaping @Sendable () -> Void, ifDropped dropped: @escaping @Sendable () -> Void) {
        self.body = body
        self.dropped = dropped
        super.init()
    }

    /// The closure to hand to the context: it holds this object alone.
    var work: @Sendable () -> Void { { self.run() } }

    private func run() {
        if claim() { body() }
    }

    deinit {
        guard !wasClaimed else { return }  // ran, maybe on another thread (see `wasClaimed`)
        TimerHeap.shared.send(dropped)
    }
}

extension ExecutionContext {
    /// Whether this is `.immediate` or one of Dispatch's contexts (`.default`, `.main`, a
    /// `DispatchQueue`, `.concurrent(queue)`), which run every block they are given: work
    /// for it needs no `WatchedWork` (as `StoredContext.runsEveryWork` for a stored one).
    var runsEveryWork: Bool {
        self is ImmediateExecutionContext || self is DispatchQueue || self is DefaultExecutionContext
            || self is ConcurrentQueueContext
    }
}

// MARK: Built-in contexts

/// The default context: a private concurrent queue. Handlers may run in parallel.
public struct DefaultExecutionContext: ExecutionContext {
    @usableFromInline static let queue = DispatchQueue(
        label: "Promise.default", qos: .default, attributes: .concurrent)

    init() {}

    /// Runs `work` on the library's private concurrent queue.
    @inlinable
    public func execute(_ work: @escaping @Sendable () -> Void) {
        Self.queue.async(execute: work)
    }
}

/// Runs handlers on the thread that settles the promise, before that settling call
/// returns (or inline in `then` on an already settled promise). The cheapest context,
/// for short, non-blocking handlers on hot paths.
///
/// Work that an immediate handler triggers (settling or observing further promises) is
/// queued on the same thread and runs right after the handler returns, still before the
/// outermost settling call returns: chains of any length run in constant stack depth.
/// Never block in an immediate handler waiting for work queued behind it.
///
/// Ordering: immediate handlers run on whichever thread settles the promise, or on the
/// registering thread if it had already settled. Handlers registered from one thread
/// before the promise settles run in registration order; but a handler registered while
/// another thread is settling may run at once on the registering thread, ahead of earlier
/// handlers still queued on the settling thread (the spin model shows the interleaving:
/// `make verify-deferred-order`). Use a serial queue where order across threads matters.
public struct ImmediateExecutionContext: ExecutionContext {
    init() {}

    /// Runs `work` at once. The library runs immediate handlers not through this but
    /// through the core's per-thread trampoline, which is what makes long `.immediate`
    /// chains stack-safe; only runs (`retry`, `sequence`, `all(_:maxConcurrent:)`) and
    /// `Promise(on:_:)` call it, to start an attempt or a work on the context they were
    /// given. A run's next step starts
    /// from the handler of the step before, which the trampoline runs once this call has
    /// returned, so a run of steps that settle at once does not grow the stack. Calling it
    /// directly gives neither that nor the no-Zalgo guarantee of the other contexts.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        work()
    }
}

/// A concurrent `DispatchQueue` used without a barrier: handlers on it may overlap.
/// For read-only handlers; plain `then(on: queue)` serialises them instead.
public struct ConcurrentQueueContext: ExecutionContext {
    @usableFromInline let queue: DispatchQueue

    init(_ queue: DispatchQueue) {
        self.queue = queue
    }

    /// Runs `work` on the queue with a plain `async`.
    @inlinable
    public func execute(_ work: @escaping @Sendable () -> Void) {
        queue.async(execute: work)
    }
}

extension ExecutionContext where Self == DefaultExecutionContext {
    /// A private concurrent queue; handlers may run in parallel. The default for every
    /// `on:` parameter.
    public static var `default`: DefaultExecutionContext { DefaultExecutionContext() }
}

extension ExecutionContext where Self == ImmediateExecutionContext {
    /// The settling thread, inline (see `ImmediateExecutionContext`).
    public static var immediate: ImmediateExecutionContext { ImmediateExecutionContext() }
}

extension ExecutionContext where Self == DispatchQueue {
    /// The main queue (RXPromise's `thenOnMain`).
    public static var main: DispatchQueue { DispatchQueue.main }
}

extension ExecutionContext where Self == ConcurrentQueueContext {
    /// `queue` without a barrier: handlers may run in parallel (read-only handlers).
    public static func concurrent(_ queue: DispatchQueue) -> ConcurrentQueueContext {
        ConcurrentQueueContext(queue)
    }
}

// MARK: Queues

/// A `DispatchQueue` runs handlers with a barrier: on a serial queue that is plain FIFO,
/// on a concurrent queue it keeps handlers from overlapping each other and anything
/// else on the queue (RXPromise's rule). Use `.concurrent(queue)` to opt out.
///
/// Not on the global queues: Dispatch ignores barriers on `DispatchQueue.global()`, so
/// handlers there may overlap, in any order. Create a queue for the barrier rule.
extension DispatchQueue: ExecutionContext {
    /// Runs `work` on the queue as a barrier block.
    @inlinable
    public func execute(_ work: @escaping @Sendable () -> Void) {
        async(flags: .barrier, execute: work)
    }
}

extension ExecutionContext {
    /// True for `.immediate`: a metadata pointer comparison, no dynamic cast.
    @inlinable @inline(__always)
    var isImmediate: Bool { Self.self == ImmediateExecutionContext.self }

    /// True for `.default`, the same way.
    @inlinable @inline(__always)
    var isDefault: Bool { Self.self == DefaultExecutionContext.self }
}

// MARK: A context stored in a derived promise

/// A handler's context as a derived promise or a queued `whenComplete` box stores it: 32
/// bytes where an `any ExecutionContext` takes 40. A context of at most two words (a
/// queue, `.concurrent(queue)`, an event loop) sits in `payload` as itself; a larger one
/// in a box there (one allocation, for contexts few use). `type` says which, and is nil
/// once the context was sent. `.immediate` and `.default` are never stored: the first
/// runs inline, the second's queue is one for all.
///
/// Plain data to Swift: whoever holds one moves the context out once (`send`), or
/// destroys it (`destroy`) if it was never sent.
@usableFromInline
struct StoredContext {
    private var payload: (UInt, UInt) = (0, 0)
    private var type: (any ExecutionContext.Type)? = nil

    @usableFromInline
    init() {}

    /// Stores `context` (not `.immediate`).
    @usableFromInline
    init(_ context: __shared any ExecutionContext) {
        store(context)
    }

    private mutating func store<C: ExecutionContext>(_ context: C) {
        // The common queue first, without the generic value witnesses (a queue hop's cost).
        if ObjectIdentifier(C.self) == ObjectIdentifier(DispatchQueue.self) {
            let reference = withUnsafeBytes(of: context) { $0.load(as: UnsafeRawPointer.self) }
            _ = Unmanaged<DispatchQueue>.fromOpaque(reference).retain()  // the payload's
            payload.0 = UInt(bitPattern: reference)
            type = DispatchQueue.self
            return
        }
        if MemoryLayout<C>.size <= MemoryLayout<(UInt, UInt)>.size,
           MemoryLayout<C>.alignment <= MemoryLayout<(UInt, UInt)>.alignment,
           _isBitwiseTakable(C.self) {
            withUnsafeMutableBytes(of: &payload) { _ = $0.baseAddress.unsafelyUnwrapped.initializeMemory(as: C.self, to: context) }
            type = C.self
        } else {
            let box = ContextBox(context)
            withUnsafeMutableBytes(of: &payload) { _ = $0.baseAddress.unsafelyUnwrapped.initializeMemory(as: ContextBox<C>.self, to: box) }
            type = ContextBox<C>.self
        }
    }

    /// Whether the stored context is one of Dispatch's queues (a `DispatchQueue`,
    /// `.concurrent(queue)`), which run every block they are given: work for it needs no
    /// `WatchedWork`. Two comparisons of metadata pointers.
    var runsEveryWork: Bool {
        guard let stored = type else { return true }
        return ObjectIdentifier(stored) == ObjectIdentifier(DispatchQueue.self)
            || ObjectIdentifier(stored) == ObjectIdentifier(ConcurrentQueueContext.self)
    }

    /// Moves the context out and hands it `work`; nothing if none is stored.
    mutating func send(_ work: @escaping @Sendable () -> Void) {
        guard let stored = type else { return }
        type = nil
        if ObjectIdentifier(stored) == ObjectIdentifier(DispatchQueue.self) {
            let queue = Unmanaged<DispatchQueue>.fromOpaque(UnsafeRawPointer(bitPattern: payload.0).unsafelyUnwrapped).takeRetainedValue()
            return queue.execute(work)
        }
        func execute<C: ExecutionContext>(_: C.Type) {
            let context = withUnsafeMutableBytes(of: &payload) { $0.baseAddress.unsafelyUnwrapped.assumingMemoryBound(to: C.self).move() }
            ContextCalls.execute(work, on: context)  // it may run the work inline
        }
        execute(stored)
    }

    /// Moves the context out and runs `work(object)` on it, `object` retained for `work`,
    /// when it is a `DispatchQueue` or `.concurrent(queue)` that `DispatchBridge` reaches
    /// (without a block: see there); false, with nothing moved or sent, otherwise.
    mutating func send(retaining object: AnyObject, _ work: DispatchBridge.Work) -> Bool {
        guard let stored = type else { return false }
        let barrier = ObjectIdentifier(stored) == ObjectIdentifier(DispatchQueue.self)
        // `.concurrent(queue)` is its queue alone: the reference is the payload's first word.
        guard barrier || ObjectIdentifier(stored) == ObjectIdentifier(ConcurrentQueueContext.self) else { return false }
        let queue = Unmanaged<DispatchQueue>.fromOpaque(UnsafeRawPointer(bitPattern: payload.0).unsafelyUnwrapped)
        guard let dispatchQueue = queue._withUnsafeGuaranteedRef({ DispatchBridge.dispatchQueue(of: $0) }) else { return false }
        type = nil
        DispatchBridge.async(on: dispatchQueue, barrier: barrier, Unmanaged.passRetained(object).toOpaque(), work)
        queue.release()  // the payload's; Dispatch keeps a queue while it has work
        return true
    }

    /// Destroys a context that was never sent.
    mutating func destroy() {
        guard let stored = type else { return }
        type = nil
        func destroy<C: ExecutionContext>(_: C.Type) {
            _ = withUnsafeMutableBytes(of: &payload) { $0.baseAddress.unsafelyUnwrapped.assumingMemoryBound(to: C.self).deinitialize(count: 1) }
        }
        destroy(stored)
    }
}

/// A context too large for `StoredContext`'s two words.
private final class ContextBox<Base: ExecutionContext>: ExecutionContext {
    let base: Base
    init(_ base: Base) { self.base = base }
    func execute(_ work: @escaping @Sendable () -> Void) { base.execute(work) }
}
