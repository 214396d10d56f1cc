import CPromiseCore

/// The state of a promise: pending until it settles once, for good.
public enum PromiseState: Sendable, Equatable {
    /// Not settled yet.
    case pending
    /// Settled with a value.
    case fulfilled
    /// Settled with an error.
    case rejected
    /// Settled by `cancel()`; the reason is its error, and `isRejected` stays false.
    case cancelled
}

/// What a promise's own node is registered for.
@usableFromInline
enum NodeRole: UInt8 {
    /// Not registered anywhere (roots, and children after they fired).
    case idle
    /// Waiting for the parent: run `continuation` on `context` when it settles.
    case continuation
    /// Locked to another promise (a handler returned it): adopt its outcome.
    case following
}

/// The type-erased handle of a promise: everything that does not need its `Value`.
///
/// `AnyPromise` lets code that does not care about the value inspect, navigate and
/// cancel promises of any type: a cancellation tree mixes `Promise<Data>`,
/// `Promise<Int>` and `Promise<Void>` freely.
///
/// ```swift
/// let tree: [AnyPromise] = [download, decode, render]
/// tree.forEach { $0.cancel() }
/// ```
///
/// Compare handles with `===`. Every member is safe to call from any thread.
public class AnyPromise: @unchecked Sendable {
    // `core` must stay the first stored property: `corePointer` finds it at the start of
    // the stored properties, and the C core addresses it there for the object's life.
    @usableFromInline final var core = pc_promise()

    /// The error of a rejected or cancelled promise. Written once by the claim winner
    /// before it publishes; read only after an acquire load has seen the outcome.
    @usableFromInline @exclusivity(unchecked) final var failure: (any Error)?

    /// True when the parent had already settled when this child was created: then the
    /// child holds it strongly from the start (`settledParentRetain`; no cycle is possible)
    /// and leaves `parentWord` at 0.
    final let parentSettledAtCreation: Bool

    /// The parent, alive or nil. A child created on a pending parent links to it through
    /// `parentWord`, an unowned link (see `UnownedLink`): a pending parent holds its
    /// children in its observer list until it fires them, so a strong link would be a
    /// retain cycle, and a `weak` one would slow down every retain and release of the
    /// parent. The link stays valid because
    ///
    /// - while the parent is pending, this child's node is registered on it (it is
    ///   registered in `Promise.init(parent:context:continuation:)`, at once, and a child's
    ///   node leaves its parent's list only by being fired or by the parent's death), and
    ///   a dying parent clears the word of every child it detaches
    ///   (`releaseOwnedLinksIteratively`) before its memory goes;
    /// - once the parent fires this child, the child retains it (`settledParentRetain`,
    ///   taken in the fire callback, while the settling thread still holds the parent), so
    ///   it cannot die while the child lives; the iterative release, which takes that
    ///   retain from a dying child before the child's own deinit, clears the word first.
    ///
    /// Reads take the word's lock (cold paths: `parent`, `root`, linking up the chain of an
    /// ancestor), never `settledParentRetain`, which is written by the firing thread: code
    /// on that thread or after it (the continuation) reads `settledParent` instead.
    final var parentIfAlive: AnyPromise? {
        parentSettledAtCreation ? settledParent : UnownedLink.load(parentWord)
    }

    /// The parent once it has settled: the continuation reads its outcome through this,
    /// and it keeps `parent` answering for as long as this promise lives. Never set while
    /// the parent is pending, so no retain cycle can form.
    /// Held as `Unmanaged` (one retain, taken in `sourceDidSettle`) so that a dying
    /// promise can pass it on to `releaseOwnedLinksIteratively` without a strong local
    /// copy that would hide whether the parent is uniquely referenced.
    @usableFromInline @exclusivity(unchecked) final var settledParentRetain: Unmanaged<AnyPromise>?

    @usableFromInline
    final var settledParent: AnyPromise? { settledParentRetain?.takeUnretainedValue() }

    /// The handler that will settle this promise from its parent's outcome; consumed
    /// (released) when it runs, or released with the promise if it never does.
    @exclusivity(unchecked) final var continuation: Continuation?
    /// Where `continuation` runs. `.immediate` (also the value of roots, which never run
    /// a continuation) is never called: such handlers run inline through the core's
    /// trampoline. Not an optional with nil for `.immediate`: copying or destroying an
    /// `Optional<any ExecutionContext>` goes through `Optional`'s generic value witnesses
    /// (a metadata lookup and indirect calls, 70 to 140 instructions each time), a plain
    /// existential straight through its contents' own (a retain or release for a queue,
    /// nothing for `.immediate`).
    @usableFromInline @exclusivity(unchecked) final var context: any ExecutionContext = .immediate

    /// Hands `work` to `context` and leaves `.immediate` in its place. A handler is sent
    /// to its context once, and nothing reads the context after that; a call on the
    /// property itself would first copy the existential out (for a queue, a retain and
    /// a release), where moving it out copies nothing.
    final func sendToContext(_ work: @escaping @Sendable () -> Void) {
        let target = withUnsafeMutablePointer(to: &context) { slot in
            let taken = slot.move()
            slot.initialize(to: .immediate)
            return taken
        }
        target.execute(work)
    }
    @usableFromInline @exclusivity(unchecked) final var role: NodeRole = .idle
    /// Set (and read) by the thread firing this child when it sent the handler's error side
    /// to the context because the parent was cancelled.
    @usableFromInline @exclusivity(unchecked) final var errorSideDispatched = false
    /// Set by `storeValue` (specialised, so a constant per type) when the stored value
    /// needs destroying: the deinit, which runs unspecialised, then skips the generic
    /// layout queries for the common trivial values.
    @usableFromInline @exclusivity(unchecked) final var storedValueNeedsDestroy = false

    /// The reason of a cancel forwarded through this promise after it had settled; written
    /// once, by the canceller that set PC_FAMILY_CANCEL_CLAIMED, before it publishes.
    @exclusivity(unchecked) final var forwardedCancelReason: (any Error)?

    /// The forwarding epoch (see `pc_forwarding_epoch`) at which this promise, having
    /// claimed its outcome from a handler, found no cancel to take from its ancestors;
    /// `AncestorCheck.unverified` if it never checked, `.noAncestors` for a root. Written by
    /// the claim winner before it publishes; read by descendants after they saw it settled.
    @usableFromInline @exclusivity(unchecked) final var verifiedEpoch: UInt

    /// No parent: `continuation` and `context` are free for the first `whenComplete`
    /// (see `claimFirstObserverSlot`).
    @usableFromInline final let isRoot: Bool

    /// `parent` is borrowed from the caller, which holds it (`Unmanaged`, so that reading
    /// it costs no retain and release).
    @usableFromInline
    init(parent: Unmanaged<AnyPromise>?) {
        isRoot = parent == nil
        verifiedEpoch = parent == nil ? AncestorCheck.noAncestors : AncestorCheck.unverified
        if let parent, parent._withUnsafeGuaranteedRef({ $0.publishedTag != UInt(PC_PENDING) }) {
            parentSettledAtCreation = true
            settledParentRetain = parent.retain()
        } else {
            parentSettledAtCreation = false
            // A plain store, through the pointer (no exclusivity check on `core`): nothing
            // else can see this promise yet; the release push that registers it on the
            // parent publishes the word with the rest of it.
            if let parent { parentWord.pointee = UInt(bitPattern: parent.toOpaque()) }
        }
    }

    deinit {
        releaseChildLinks()
        // A settled promise has no observers left; without a parent to let go of either,
        // it owns nothing (the common end of a root), and skips the loop's set-up.
        if settledParentRetain != nil || isPending { releaseOwnedLinksIteratively() }
    }

    // MARK: State

    /// The current state. A snapshot: another thread may settle the promise right after.
    public final var state: PromiseState {
        switch publishedTag {
        case UInt(PC_FULFILLED): return .fulfilled
        case UInt(PC_REJECTED): return .rejected
        case UInt(PC_CANCELLED): return .cancelled
        default: return .pending
        }
    }

    /// True until the promise settles.
    public final var isPending: Bool { publishedTag == UInt(PC_PENDING) }
    /// True once the promise is fulfilled with a value.
    public final var isFulfilled: Bool { publishedTag == UInt(PC_FULFILLED) }
    /// True once the promise is rejected with an error (not when it is cancelled).
    public final var isRejected: Bool { publishedTag == UInt(PC_REJECTED) }
    /// True once the promise is cancelled.
    public final var isCancelled: Bool { publishedTag == UInt(PC_CANCELLED) }

    // MARK: Navigation

    /// The promise this one was derived from with a continuation (`then`, `map`,
    /// `recover`...), or nil for a root.
    ///
    /// The link does not keep a pending parent alive (that would be a retain cycle: a
    /// pending parent holds its children until it fires them); once the parent has
    /// settled, the child holds it, so `parent` keeps answering as long as the child
    /// lives. A pending parent that nobody else holds can never settle and is freed.
    public final var parent: AnyPromise? { parentIfAlive }

    /// The top of the tree this promise belongs to: itself when it has no parent.
    ///
    /// ```swift
    /// let step = download.then { decode($0) }.then { render($0) }
    /// step.root === download  // true
    /// ```
    public final var root: AnyPromise {
        var node: AnyPromise = self
        while let up = node.parentIfAlive { node = up }
        return node
    }

    // MARK: Settling (type-erased part)

    /// Claims the promise for `outcome` (from free, or taking over from following),
    /// stores `error` and publishes. False if it had been claimed already.
    @usableFromInline
    final func settleFailure(_ error: any Error, as outcome: UInt32) -> Bool {
        guard claim(from: PC_FREE, to: outcome)
            || (outcome == PC_CANCELLED && claim(from: PC_FOLLOWING, to: PC_CANCELLED))
        else { return false }
        failure = error
        publishClaimedOutcome()
        return true
    }

    /// Copies the published outcome of `source` (same `Value`) into this promise's slots.
    /// Overridden by `Promise<Value>`, the only subclass.
    @usableFromInline
    func copyOutcome(from source: AnyPromise, tag: UInt) {
        preconditionFailure("AnyPromise is abstract")
    }

    /// Makes this promise follow `source` (same `Value`): it settles as `source` does.
    /// Uses the promise's own node, so only call it when that node is free: from this
    /// promise's continuation, once it ran (the only caller, `settleFollowing`).
    ///
    /// The followed promise is work this promise owns (a cancel reaches it), held through
    /// `followeeWord`, an unowned link (see `UnownedLink`): `source` holds us in its
    /// observer list until it settles. Only the canceller that wins the claim from
    /// FOLLOWING to CANCELLED reads it, and the word is cleared (or dropped) before
    /// `source` can go unguarded: by `source`'s deinit if it dies pending with our node
    /// registered, by the fire callback when it settles, here when the claim fails.
    @usableFromInline
    final func follow(_ source: AnyPromise) {
        // The continuation that calls us read `settledParent` on this thread already.
        let parent = settledParent
        let address = UnownedLink.address(of: source)
        // Stored before the claim, whose CAS publishes it to a canceller that takes over
        // from FOLLOWING (and reads it after its own CAS). A plain atomic store: the word
        // is 0 (a continuation runs once, so a promise follows once), and no reader locks
        // a 0 word.
        pc_word_store(followeeWord, address)
        guard claim(from: PC_FREE, to: PC_FOLLOWING) else {
            // Claimed first by someone else: nothing keeps `source` alive for the word once
            // we return, and a canceller that took over from resolve(with:)'s FOLLOWING may
            // be reading it. Our caller holds `source`, so clearing now is in time.
            UnownedLink.clear(followeeWord, ifPointingAt: address)
            if isCancelled { source.cancel(reason: failure ?? CancellationError()) }
            return
        }
        if let parent { linkIntoParentChain(parent: parent) }
        observe(source, as: .following)
        // Not recording: once observed, `source` may fire on another thread at once, and
        // the adoption there runs the check again and records its epoch.
        if let reason = cancelReasonFromAncestors(recording: false) {
            cancel(reason: reason)  // an ancestor's cancel came first, or while we were linking
        } else if isCancelled {
            source.cancel(reason: failure ?? CancellationError())  // cancelled meanwhile
        }
    }

    /// `source`, on which this promise's node is still registered, is dying pending (its
    /// deinit detached the node): clear the unowned links that point at it, the parent of
    /// a child it never fired or the followed promise of a follower, before its memory goes.
    final func observedPromiseIsDying(at address: UInt) {
        UnownedLink.clear(parentWord, ifPointingAt: address)
        UnownedLink.clear(followeeWord, ifPointingAt: address)
    }

    // MARK: Firing (called from CoreBridge's fire callbacks)

    /// The observed promise (parent or followee) settled; `retained` is the retain the
    /// node carried, which this keeps (deferring the node) or releases. The caller borrows
    /// `self` from that retain: nothing may touch `self` after releasing it.
    @usableFromInline
    final func sourceDidSettle(_ source: AnyPromise, retained: Unmanaged<AnyPromise>) {
        switch role {
        case .continuation:
            if !parentSettledAtCreation { settledParentRetain = Unmanaged.passRetained(source) }
            if context.isImmediate {
                deferOnThisThread()  // runs right after the current firing, no recursion
                return
            }
            if source.carriesCancelForDescendants {
                // The error side goes to the context now, in registration order with the
                // other observers on it; cancelling this child itself is deferred (stack
                // safety) but still happens before the settling call returns.
                if source.isCancelled, continuation?.hasErrorSide == true {
                    errorSideDispatched = true
                    sendToContext { self.runContinuation() }
                }
                deferOnThisThread()
                return
            }
            // In flight after the parent settled: a later cancel must still reach us.
            linkIntoParentChain(parent: source)
            if source.carriesCancelForDescendants {
                deferOnThisThread()  // a cancel arrived while we linked: take the cancel path
            } else {
                sendToContext { self.runContinuation() }
                retained.release()
            }
        case .following:
            let tag = source.publishedTag
            if claim(from: PC_FOLLOWING, to: UInt32(tag)) {
                // Only the canceller that wins FOLLOWING -> CANCELLED reads the followee
                // link, and now none can: drop it without the lock, before `source` may go.
                pc_word_store(followeeWord, 0)
                if tag != UInt(PC_CANCELLED), let reason = cancelReasonFromAncestors() {
                    turnClaimIntoCancel(from: UInt32(tag), reason: reason)
                } else {
                    copyOutcome(from: source, tag: tag)
                }
                deferOnThisThread()  // publishes right after the current firing
            } else {
                // Cancelled while following: that canceller may be reading the followee
                // link; clear it under the lock while `source` (firing) is surely alive.
                UnownedLink.clear(followeeWord, ifPointingAt: UnownedLink.address(of: source))
                retained.release()  // nothing to adopt
            }
        case .idle:
            preconditionFailure("CPromiseCore fired an idle node")
        }
    }

    /// The deferred half of `sourceDidSettle`, on the same thread, after the firing that
    /// triggered it returned.
    @usableFromInline
    final func runDeferred() {
        switch role {
        case .continuation:
            // The common case first, without a strong copy of the parent (a retain and a
            // release) or building an optional error: no cancel to pass down.
            let cancelToPassDown = settledParentRetain?._withUnsafeGuaranteedRef { $0.carriesCancelForDescendants } ?? false
            guard cancelToPassDown, let parent = settledParent, let reason = parent.cancelReasonForDescendants else {
                runContinuation()
                return
            }
            // Cancellation flows down at once, whatever context the handler runs on. A
            // cancelled parent still gives the handler its error side, for clean-up; a
            // settled parent whose cancel is being forwarded gives it nothing to run.
            cancel(reason: reason)
            if errorSideDispatched { return }  // already on its context: do not touch it here
            guard context.isImmediate, parent.isCancelled, continuation?.hasErrorSide == true else {
                continuation = nil  // releases the handler unrun
                return
            }
            runContinuation()  // immediate: the error side inline
        case .following:
            role = .idle
            publishClaimedOutcome()
        case .idle:
            preconditionFailure("CPromiseCore deferred an idle node")
        }
    }

    /// Runs the continuation once, unless this promise was settled by someone else first
    /// (then only a cancelled parent still gets the handler's error side).
    @usableFromInline
    final func runContinuation() {
        // The parent borrowed, not retained: `settledParentRetain` holds it until our deinit.
        settledParentRetain?._withUnsafeGuaranteedRef { parent in
            guard let handler = continuation.take() else { return }
            // `role` stays `.continuation` (the settling thread may still read it in
            // `runDeferred` while this runs on the context); `follow` moves it on.
            let parentCancelled = parent.publishedTag == UInt(PC_CANCELLED)
            if !parentCancelled && claimHint != UInt(PC_FREE) { return }  // `handler` is released unrun
            handler.run(parent, self)
        }
    }
}
