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

/// Where a derived promise's handler runs (`AnyPromise.handlerPlace`).
@usableFromInline
enum HandlerPlace: UInt8 {
    /// On the context it stores (a `ContextDerivedPromise`); a root's value, unused.
    case storedContext
    /// `.immediate`: inline, through the core's trampoline; also a child with no handler.
    case inline
    /// `.default`: sent to the library's default queue, which is one for all, so it
    /// stores no context. (`.default` is what every `then` without `on:` uses: most
    /// children on a context are such children, 32 bytes fewer each.)
    case defaultQueue
}

/// What a promise's own node is registered for.
@usableFromInline
enum NodeRole: UInt8 {
    /// Not registered for the promise itself: a root (whose node may hold its first
    /// `whenComplete`, which fires through its own callback), or a child after it fired.
    /// (A cancelled child whose node a prune took off a pending promise keeps the role it
    /// had: nothing reads it again.)
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
    // Keep `AnyPromiseStoredProperties` (DerivedPromise.swift) in step with the stored
    // properties here: a derived promise's own fields are found after them by offset.
    @usableFromInline final var core = pc_promise()

    /// The parent, alive or nil: a strong reference if it is still alive, nil once it has
    /// begun dying.
    ///
    /// A child's link up never keeps its parent alive: a pending parent holds its children
    /// in its observer list (a strong link up would be a cycle), and a settled one must be
    /// free to go once nobody needs it (a held leaf must not keep the values above it).
    /// The link holds the parent's *memory* instead, with the runtime's unowned reference
    /// count (`swift_unownedRetain` at creation, released by our deinit): the parent's
    /// deinit still runs when its last strong reference goes, which destroys its value and
    /// releases what it held, but its object stays allocated, so `swift_tryRetain` on it
    /// stays valid and answers nil from then on. A held leaf thus keeps at most its dead
    /// parent's bare object, never its value nor anything above it.
    ///
    /// Cost: one atomic increment at creation and one decrement at death, on the parent's
    /// reference count word; reading is one CAS (`swift_tryRetain`), on cold paths only
    /// (`parent`, `root`, linking up the chain of an ancestor, the adoption of a followed
    /// promise's outcome).
    final var parentIfAlive: AnyPromise? {
        parentAddress.flatMap(HeldMemory.promiseIfAlive)
    }

    /// The parent's address, its memory held by our unowned count (see `parentIfAlive`);
    /// nil for a root. Set once, before the promise is shared.
    final var parentAddress: UnsafeMutableRawPointer? {
        UnsafeMutableRawPointer(bitPattern: parentWord & ParentLink.addressMask)
    }

    /// Whether this promise keeps its parent alive while a descendant is in flight (see
    /// `holdPathWhileInFlight`): it has a parent, and that parent is not a root.
    /// (Inlinable: every publish asks, `publishClaimedOutcome`.)
    @inlinable
    final var holdsItsParentInFlight: Bool {
        // The parent word is written once, before the promise is shared.
        !isRoot && withLineage { $0.pointee.core.parent } & ParentLink.parentIsRoot == 0
    }

    /// The handler that will settle this promise from its parent's outcome; consumed
    /// (released) when it runs, or released with the promise if it never does.
    @exclusivity(unchecked) final var continuation: StoredHandler?
    // The one-byte fields sit here, in the padding after `continuation` (33 bytes), not
    // after a word-aligned field, where they would cost a word of their own.
    @usableFromInline @exclusivity(unchecked) final var role: NodeRole = .idle
    /// Set (and read) by the thread firing this child when it sent the handler's error side
    /// to the context because the parent was cancelled.
    @usableFromInline @exclusivity(unchecked) final var errorSideDispatched = false
    /// Set by `storeValue` (specialised, so a constant per type) when the stored value
    /// needs destroying: the deinit, which runs unspecialised, then skips the generic
    /// layout queries for the common trivial values.
    @usableFromInline @exclusivity(unchecked) final var storedValueNeedsDestroy = false
    /// Set with an outcome that holds memory a retirement may free early
    /// (`retireIfOnlyTheCascadeKeepsIt`): a value that needs destroying (`storeValue`)
    /// or a rejection's error (`storeRejection`). One byte for the cascade's check on
    /// every step, where reading the claim word too cost a fulfilled `Int` step 15
    /// instructions.
    @usableFromInline @exclusivity(unchecked) final var outcomeFreeableEarly = false
    /// Where a derived promise's handler runs, as its layout says: set once, before the
    /// promise is shared, and not read off a stored context (which moves out when the
    /// handler is sent, and costs more to reach). One byte for the two kinds that store no
    /// context (`ContextDerivedPromise` is the one that does).
    @usableFromInline @exclusivity(unchecked) final var handlerPlace = HandlerPlace.storedContext

    /// A derived promise whose handler runs on `.immediate` (inline, through the
    /// trampoline), or that has no handler: it stores no context.
    final var runsHandlerInline: Bool { handlerPlace == .inline }
    /// No parent (and no `DerivedPromise` lineage): `continuation` is free for the first
    /// `whenComplete` (see `claimFirstObserverSlot`).
    @usableFromInline final let isRoot: Bool
    #if DEBUG
    /// Where the promise was made (`PromiseDiagnostics`): debug builds only, so a release
    /// build's promise has no such field. Written once, before the promise is shared.
    final var creationSite: PromiseCreationSite?

    @usableFromInline
    final func recordCreationSite(file: StaticString, line: UInt) {
        creationSite = PromiseCreationSite(file: file, line: line)
    }
    #endif

    /// A root: what `Promise`'s public initialisers call. They are inlinable, so that a
    /// release build passes them nothing for the creation site it does not record
    /// (`noteCreationSite`); this one is not (an inlinable designated initialiser here
    /// crashes Swift 6.3's optimiser), but with nothing to decide it costs the client's
    /// call what the library's own initialiser did.
    @usableFromInline
    init() {
        assert(CoreLayout.headerChecked)  // debug builds: the object layout CoreLayout assumes
        isRoot = true
    }

    /// A derived promise (`DerivedPromise`, which has set up its lineage).
    @usableFromInline
    init(derived: Void) {
        assert(CoreLayout.headerChecked)  // debug builds: the object layout CoreLayout assumes
        isRoot = false
    }

    deinit {
        // Dying in flight (its holder dropped it unsettled): its path needs no holding now.
        if !isRoot && holdsWord & UInt(PC_HOLDS_SELF) != 0 { dropSelfHold() }
        releaseChildLinks()
        // A settled promise has no observers left; without a parent to let go of either,
        // it owns nothing (the common end of a root), and skips the loop's set-up.
        if isPending || (!isRoot && !settledParent.isEmpty) { releaseOwnedLinksIteratively() }
        // Last: the loop above may have read the parent through the link.
        if let parentAddress { HeldMemory.release(parentAddress) }
        // A plain load: nothing else can reach a dying promise's word. Before the rare
        // state goes: a root's word is there.
        if let followeeWord, let followee = UnsafeMutableRawPointer(bitPattern: followeeWord.pointee & FolloweeLink.addressMask) {
            HeldMemory.release(followee)
        }
        releaseRareState()
        destroyFailure()
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
    /// The link never keeps the parent alive: `parent` answers while the parent lives for
    /// another reason (someone holds it, this child's handler has not finished with its
    /// outcome yet, or a descendant is still in flight below it), and nil once it is gone.
    /// So holding a settled promise keeps nothing above it once nothing below is in flight:
    ///
    /// ```swift
    /// let summary = download().then { summarize($0) }
    /// // once `summary` settled, the downloaded value is freed: only `summary` is kept,
    /// // and `summary.parent` is nil unless someone else holds the download.
    /// ```
    ///
    /// A pending parent that nobody else holds can never settle and is freed too. Inside
    /// a chain settling inline (`.immediate` handlers run by one settling call), a step
    /// that only the cascade still keeps, for its own bookkeeping, counts as gone: its
    /// value is freed once its child ran, and `parent` answers nil, as it will once the
    /// cascade ends (also if a descendant in flight below it keeps it past the cascade,
    /// for a cancel from above: its value is gone; `root` still walks past it).
    public final var parent: AnyPromise? { parentIfReachable }

    /// The top of the tree this promise belongs to: itself when it has no parent.
    ///
    /// ```swift
    /// let step = download.then { decode($0) }.then { render($0) }
    /// step.root === download  // true
    /// ```
    ///
    /// The walk passes the steps of a chain settling inline whose values were freed early
    /// (see `parent`), which `parent` does not show, and answers the topmost promise above
    /// them that nothing made unreachable.
    public final var root: AnyPromise {
        var top: AnyPromise = self
        var node: AnyPromise = self
        while let up = node.parentIfAlive {
            node = up
            if !up.isRetiredSeenAfterTakingIt { top = up }
        }
        return top
    }

    // MARK: What the typed subclass provides

    /// Destroys the fulfilled value now, for a promise that nobody can read any more
    /// (`retireIfOnlyTheCascadeKeepsIt`); its deinit then destroys nothing. Overridden
    /// by `Promise<Value>` (final there).
    func freeStoredValueEarly() {
        preconditionFailure("AnyPromise is abstract")
    }

    /// A promise of the same type as this one, already rejected with
    /// `PromiseError.brokenPromise`: what the observers of a promise that dies pending
    /// fire on (`breakObservers`). Overridden by `Promise<Value>` (final there).
    func makeBrokenStandIn() -> AnyPromise {
        preconditionFailure("AnyPromise is abstract")
    }

    /// The type as users know it, `Promise<Value>`, whichever layout it has (a derived
    /// promise is a `DerivedPromise`, see DerivedPromise.swift). Overridden by
    /// `Promise<Value>` (final there).
    var typeName: String {
        preconditionFailure("AnyPromise is abstract")
    }

    /// The value of this fulfilled promise, as `debugPrint` shows it (for descriptions;
    /// only called after an acquire load has seen PC_FULFILLED). Overridden by
    /// `Promise<Value>` (final there).
    func describeFulfilledValue() -> String {
        preconditionFailure("AnyPromise is abstract")
    }

    /// Copies the published outcome of `source` (same `Value`) into this promise's slots.
    /// Overridden by `Promise<Value>` (final there).
    @usableFromInline
    func copyOutcome(from source: AnyPromise, tag: UInt) {
        preconditionFailure("AnyPromise is abstract")
    }
}
