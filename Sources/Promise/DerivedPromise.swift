import CPromiseCore

// A layout per kind. A root (`Promise()`, a combinator's output) has no parent, so it has
// no link up, no holds on a path, no parent held while a handler reads it and no ancestor
// check to record: those live in `Lineage`, which only a derived promise (`then` and the
// other continuations, `timeout`'s child) has, in the class `DerivedPromise` adds below
// `Promise`; a child whose handler runs on a context other than `.immediate` or `.default`
// is a `ContextDerivedPromise`, which adds that context. Code that does not know the value
// type reaches them through `AnyPromise`'s accessors here, after checking `isRoot` (and
// `handlerPlace`, for the context).
//
// How: `Promise<Value>` has no stored property of its own, so `DerivedPromise`'s `lineage`,
// and `ContextDerivedPromise`'s `context` after it, sit at the same offsets whatever the
// `Value`, right after `AnyPromise`'s fields. `DerivedLayout` computes those offsets from a
// struct that mirrors `AnyPromise`'s stored properties (Swift lays out a class's stored
// properties as it lays out a struct's), and debug builds check every derived promise
// against them (the initialisers of both classes). The accessors reach the fields from the object's
// address, as `corePointer` reaches `core`: no formal access to a whole property (which
// ThreadSanitizer would see as a write by each thread that takes its address).

/// What a derived promise has that a root has not. Plain data (no reference counting):
/// `AnyPromise`'s deinit reads it after `DerivedPromise`'s part of the object was
/// destroyed, which leaves plain data as it was.
@usableFromInline
struct Lineage {
    /// The holds word and the link up (see `pc_lineage`). First: `lineageCore` finds it at
    /// the start.
    @usableFromInline var core: pc_lineage

    /// The parent, held from the moment it fires this child until the child's handler has
    /// run or was dropped: the handler reads the parent's outcome, which lives only as
    /// long as the parent. Never set while the parent is pending (no retain cycle), and
    /// dropped as soon as the handler is done (`runContinuationTakingParent`,
    /// `runDeferred`), so a settled child keeps nothing above it. An `.immediate` child's
    /// is written and taken by one thread at a time, plainly: the firing thread sets it,
    /// then its trampoline takes it. A child on a context has it read, written and taken
    /// atomically (`settledParentOfContextChild`): parked for the context's work, whoever
    /// settles the child otherwise (a cancel, its holder) may take it first
    /// (`parkSettledParentForContext`).
    @usableFromInline var settledParent: ParentHold

    /// The forwarding epoch (see `pc_forwarding_epoch`) at which this promise, having
    /// claimed its outcome from a handler, found no cancel to take from its ancestors;
    /// `AncestorCheck.unverified` if it never checked. Written by the claim winner before
    /// it publishes; read by descendants after they saw it settled.
    @usableFromInline var verifiedEpoch: UInt

    /// The lineage of a child of `parent`, whose memory the link up holds from now on
    /// (see `parentIfAlive`).
    init(parent: Unmanaged<AnyPromise>, settledBesidesParent: Bool = false) {
        let parentIsRoot = parent._withUnsafeGuaranteedRef { $0.isRoot }
        core = pc_lineage(holds: 0, parent: HeldMemory.hold(parent) | (parentIsRoot ? ParentLink.parentIsRoot : 0)
                              | (settledBesidesParent ? ParentLink.settledBesidesParent : 0),
                          link: pc_link(), followee: 0)
        settledParent = ParentHold.none
        verifiedEpoch = AncestorCheck.unverified
    }
}

/// How a child holds the parent its handler reads (`Lineage.settledParent`). Usually a
/// retain of its own (`owning`). An `.immediate` child, whose handler runs later on the
/// firing thread, needs none when someone else already holds the parent until then
/// (`borrowing`): the caller of the settling call that opened this thread's firing scope
/// (`callerHoldsThroughDeferredWork`). Plain data, so that `Lineage` stays plain data: an
/// `Unmanaged` (so that a dying promise can pass the retain on to
/// `releaseOwnedLinksIteratively` without a strong copy that would hide whether the parent
/// is uniquely referenced), in bit 0 whether it is borrowed, and in bit 1 whether it is
/// parked for the work a context will run (`parked`).
@usableFromInline
struct ParentHold {
    @usableFromInline let word: UInt

    @inlinable init(word: UInt) { self.word = word }

    /// No parent held.
    @inlinable static var none: ParentHold { ParentHold(word: 0) }

    /// A hold that owns one retain of `parent` (taken by the caller, or handed over).
    @inlinable
    static func owning(_ parent: Unmanaged<AnyPromise>) -> ParentHold {
        ParentHold(word: UInt(bitPattern: parent.toOpaque()))
    }

    /// A hold on `parent` that someone else's reference keeps valid for as long as the
    /// hold is used.
    @inlinable
    static func borrowing(_ parent: Unmanaged<AnyPromise>) -> ParentHold {
        ParentHold(word: UInt(bitPattern: parent.toOpaque()) | 1)
    }

    /// A hold that owns one retain of `parent`, parked for the work a context will run:
    /// that work takes it, unless a settle of the child by anyone else takes it first
    /// (`parkSettledParentForContext`).
    static func parked(_ parent: Unmanaged<AnyPromise>) -> ParentHold {
        ParentHold(word: UInt(bitPattern: parent.toOpaque()) | parkedBit)
    }

    /// The bit that marks a parked hold.
    static var parkedBit: UInt { 2 }

    @inlinable var isEmpty: Bool { word == 0 }

    /// Whether ending the hold releases nothing.
    @inlinable var isBorrowed: Bool { word & 1 != 0 }

    /// The parent (the hold must not be empty).
    @inlinable
    var parent: Unmanaged<AnyPromise> {
        Unmanaged.fromOpaque(UnsafeRawPointer(bitPattern: word & ~3).unsafelyUnwrapped)
    }

    /// Ends the hold: releases the parent if the hold owns a retain (which may free it).
    @inlinable
    func end() {
        if !isBorrowed { parent.release() }
    }
}

/// A promise with a parent: made by a continuation (`then`, `recover`...) or as
/// `timeout`'s child. Users see it as the `Promise<Value>` it is; only the layout differs.
/// This class is the child whose handler runs `.immediate` or on `.default` (or that has
/// no handler): it stores no context. A handler on any other context makes a
/// `ContextDerivedPromise`, which adds one (`DerivedPromise.make` picks). Not `final`,
/// for that subclass; every member is.
@usableFromInline
class DerivedPromise<Value: Sendable>: Promise<Value>, @unchecked Sendable {
    @usableFromInline @exclusivity(unchecked) final var lineage: Lineage

    /// A child created by a continuation, on `context`, registered on `parent` at once.
    /// Inlinable, so that the continuation methods, specialised in the caller, allocate a
    /// class whose metadata they know (unspecialised, each `then` would look it up).
    @inlinable
    static func make(parent: __shared AnyPromise, context: any ExecutionContext,
                     continuation: consuming StoredHandler) -> DerivedPromise<Value> {
        // `.immediate` needs nothing stored: such handlers run inline through the core's
        // trampoline (`runsHandlerInline`). Nor does `.default`, whose queue is one for
        // all (`HandlerPlace.defaultQueue`).
        if context.isImmediate {
            return DerivedPromise(parent: parent, handlerPlace: .inline, continuation: continuation)
        }
        if context.isDefault {
            return DerivedPromise(parent: parent, handlerPlace: .defaultQueue, continuation: continuation)
        }
        return ContextDerivedPromise(parent: parent, context: context, continuation: continuation)
    }

    /// A child created by a continuation, registered on `parent` at once; a subclass has
    /// stored what the handler needs before (a parent may fire it as soon as it is in the
    /// parent's list).
    @usableFromInline
    init(parent: __shared AnyPromise, handlerPlace: HandlerPlace, continuation: consuming StoredHandler) {
        lineage = Lineage(parent: Unmanaged.passUnretained(parent))
        super.init(derived: ())
        checkLineageOffset()
        assert((handlerPlace == .storedContext) == (self is ContextDerivedPromise<Value>),
               "only a ContextDerivedPromise has room for a stored context")
        self.handlerPlace = handlerPlace
        // Initialised in place over the fresh nil: an assignment would first destroy the
        // old value through the handler's (opaque) release, and retain and release `self`
        // around that call.
        Self.initialize(&self.continuation, with: continuation)
        observeAsContinuation(of: parent)
    }

    /// A child of `parent` (its `parent` and `root` say so) that registers nothing on it:
    /// the caller settles it (`timeout`, through the parent's waiter list).
    /// `settledBesidesParent`: something else may settle it too (`timeout`'s timer, unless
    /// it never fires), which the cycle check reads (`ParentLink.settledBesidesParent`).
    init(linkedTo parent: __shared AnyPromise, settledBesidesParent: Bool) {
        lineage = Lineage(parent: Unmanaged.passUnretained(parent), settledBesidesParent: settledBesidesParent)
        super.init(derived: ())
        checkLineageOffset()
        handlerPlace = .inline  // no handler, and no context stored
    }

    private static func initialize(_ slot: UnsafeMutablePointer<StoredHandler?>, with continuation: consuming StoredHandler) {
        slot.initialize(to: .some(continuation))
    }

    /// Debug builds: `DerivedLayout` finds `lineage` (and a `ContextDerivedPromise`'s
    /// `context`) where they are, and `Lineage` is plain data (`AnyPromise`'s deinit reads
    /// it after this class's fields were destroyed). Called before the promise is shared:
    /// taking a field's address is a formal access, which must not overlap another
    /// thread's (ThreadSanitizer reports it).
    private func checkLineageOffset() {
        assert(_isPOD(Lineage.self), "Lineage must stay plain data: AnyPromise's deinit reads it last")
        let object = UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
        assert(withUnsafeMutablePointer(to: &lineage) { UnsafeMutableRawPointer($0) } - object == DerivedLayout.lineageOffset,
               "DerivedPromise<\(Value.self)> keeps its lineage at another offset: see AnyPromiseStoredProperties")
        assert((self as? ContextDerivedPromise<Value>)?.contextOffset ?? DerivedLayout.contextOffset == DerivedLayout.contextOffset,
               "ContextDerivedPromise<\(Value.self)> keeps its context at another offset")
    }
}

/// A derived promise whose handler runs on a context other than `.immediate` and
/// `.default`: it keeps that context until the handler is sent to it.
@usableFromInline
final class ContextDerivedPromise<Value: Sendable>: DerivedPromise<Value>, @unchecked Sendable {
    /// Where `continuation` runs. Not in `Lineage`, whose fields `AnyPromise`'s deinit
    /// still reads: this one is destroyed by our own deinit, if it was never sent.
    @exclusivity(unchecked) final var context: StoredContext

    @usableFromInline
    init(parent: __shared AnyPromise, context: __shared any ExecutionContext, continuation: consuming StoredHandler) {
        // Borrowed, not owned: `StoredContext` takes its own reference, so an owned
        // parameter only added a copy of the caller's existential and its destruction
        // here (a retain and a release of the queue per `then`).
        self.context = StoredContext(context)
        super.init(parent: parent, handlerPlace: .storedContext, continuation: continuation)
    }

    /// Where `context` is, from the object's address (debug builds check it against
    /// `DerivedLayout.contextOffset`, before the promise is shared: `checkLineageOffset`).
    fileprivate final var contextOffset: Int {
        let object = UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
        return withUnsafeMutablePointer(to: &context) { UnsafeMutableRawPointer($0) } - object
    }

    deinit {
        context.destroy()  // a handler that never went to its context
    }
}

extension AnyPromise {
    /// This promise's lineage; only for a derived promise (`!isRoot`). `body` must not
    /// keep the pointer.
    @inlinable @inline(__always)
    final func withLineage<Result>(_ body: (UnsafeMutablePointer<Lineage>) -> Result) -> Result {
        assert(!isRoot, "a root has no lineage")
        return body((UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque()) + DerivedLayout.lineageOffset)
            .assumingMemoryBound(to: Lineage.self))
    }

    /// Hands `work` to this derived promise's context, which it moves out (no copy, so
    /// no retain and release of a queue): a handler is sent to its context once. Only for
    /// a `ContextDerivedPromise`, or a child on `.default` (`!runsHandlerInline`).
    final func sendToContext(_ work: @escaping @Sendable () -> Void) {
        assert(!isRoot && !runsHandlerInline, "only a child on a context has a handler context")
        if handlerPlace == .defaultQueue { return DefaultExecutionContext().execute(work) }
        storedContext.pointee.send(work)
    }

    /// Sends this child's handler to its context, to run with the parent parked for it
    /// (`parkSettledParentForContext`). A context other than Dispatch's queues gets it
    /// watched (`WatchedWork`): dropped unrun, the child breaks, or, settled or locked in
    /// otherwise first, does what the work would have done but run the handler; either
    /// way it lets go of the parked parent and the handler.
    final func sendHandlerToContext() {
        if sendHandlerToDispatchQueue() { return }
        sendToContext({ self.runContinuationTakingParent(once: true) }, ifDropped: {
            // A handler that would only have passed the parent's outcome through runs here
            // (no user code runs): the child takes that outcome, not a broken promise.
            if self.runContinuationIfItOnlyPassesThrough() { return }
            self.rejectAsWorkDropped()  // the parked hold goes with the publish, if it wins
            self.runContinuationTakingParent(once: true)  // the claim is taken: no handler runs
        })
    }

    /// `sendHandlerToContext` for Dispatch's queues (a `DispatchQueue`, `.concurrent(queue)`,
    /// `.default`), which run every work they are given: the handler goes as a C function
    /// and this promise (`DispatchBridge`), without the block a closure costs. False, and
    /// nothing sent, for other contexts, or where `DispatchBridge` cannot reach the queue.
    private final func sendHandlerToDispatchQueue() -> Bool {
        let run: DispatchBridge.Work = { promise in
            Unmanaged<AnyPromise>.fromOpaque(promise.unsafelyUnwrapped).takeRetainedValue()
                .runContinuationTakingParent(once: true)
        }
        guard handlerPlace == .defaultQueue else { return storedContext.pointee.send(retaining: self, run) }
        return DispatchBridge.sendToDefaultQueue(retaining: self, run)
    }

    /// `sendToContext` for work that a context might drop (`WatchedWork`), unless the
    /// context is one of Dispatch's queues; `dropped` runs if it does.
    final func sendToContext(_ work: @escaping @Sendable () -> Void, ifDropped dropped: @escaping @Sendable () -> Void) {
        if handlerPlace == .defaultQueue || storedContext.pointee.runsEveryWork { return sendToContext(work) }
        sendToContext(WatchedWork(work, ifDropped: dropped).work)
    }

    /// A `ContextDerivedPromise`'s context (see `DerivedLayout.contextOffset`).
    private final var storedContext: UnsafeMutablePointer<StoredContext> {
        (UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque()) + DerivedLayout.contextOffset)
            .assumingMemoryBound(to: StoredContext.self)
    }

    /// See `Lineage.settledParent`; only for a derived promise (a root has no parent to
    /// hold: ask `isRoot` first where it may be one).
    @inlinable
    final var settledParent: ParentHold {
        get { withLineage { $0.pointee.settledParent } }
        set { withLineage { $0.pointee.settledParent = newValue } }
    }

    /// Takes `settledParent`, leaving none: the caller ends the hold.
    @inlinable
    final func takeSettledParent() -> ParentHold {
        withLineage { lineage in
            let hold = lineage.pointee.settledParent
            lineage.pointee.settledParent = .none
            return hold
        }
    }

    /// `takeSettledParent` for work a context runs: one atomic exchange, so that a context
    /// that runs the work twice (a broken contract), even both runs at once, gives the hold
    /// to one run, and the other finds none and does nothing.
    final func takeSettledParentOnce() -> ParentHold {
        ParentHold(word: takeWord(settledParentWord))
    }

    /// Takes `settledParent` only if it is parked (`ParentHold.parked`), atomically:
    /// none if the context's work took it first, or if it is not parked (then it is the
    /// settling thread's, which may be reading it).
    final func takeParkedSettledParent() -> ParentHold {
        ParentHold(word: takeWordIfMarked(settledParentWord, mask: ParentHold.parkedBit))
    }

    /// `settledParent` of a child whose handler runs on a context, read and written
    /// atomically: a cancel on another thread may look at it (`takeParkedSettledParent`).
    /// An `.immediate` child's, which no other thread touches, is plain.
    final var settledParentOfContextChild: ParentHold {
        get { ParentHold(word: loadWordAcquiring(settledParentWord)) }
        set { storeWord(settledParentWord, newValue.word) }
    }

    /// `settledParent`'s word, for the atomic accesses above and the park.
    final var settledParentWord: UnsafeMutablePointer<UInt> {
        withLineage { lineage in
            (UnsafeMutableRawPointer(lineage) + MemoryLayout<Lineage>.offset(of: \.settledParent)!)
                .assumingMemoryBound(to: UInt.self)
        }
    }

    /// See `Lineage.verifiedEpoch`; `AncestorCheck.noAncestors` for a root.
    @inlinable
    final var verifiedEpoch: UInt {
        get { isRoot ? AncestorCheck.noAncestors : withLineage { $0.pointee.verifiedEpoch } }
        set { withLineage { $0.pointee.verifiedEpoch = newValue } }
    }

    /// The parent word: the parent's address (its memory held, see `parentIfAlive`) and
    /// `ParentLink.parentIsRoot`; 0 for a root. Written once, before the promise is shared.
    @inlinable
    final var parentWord: UInt {
        isRoot ? 0 : withLineage { $0.pointee.core.parent }
    }

    /// The C part of this derived promise's lineage, for the core's `pc_holds_*`.
    @inlinable
    final var lineageCore: UnsafeMutablePointer<pc_lineage> {
        // The object outlives the call it is used in, and `lineage` never moves.
        withLineage { UnsafeMutableRawPointer($0).assumingMemoryBound(to: pc_lineage.self) }
    }
}

// MARK: The link in the parent's registry

extension AnyPromise {
    /// This derived promise's link in its parent's cancellation registry (`pc_lineage.link`).
    final var registryLinkPointer: UnsafeMutablePointer<pc_link> {
        (UnsafeMutableRawPointer(lineageCore) + MemoryLayout<pc_lineage>.offset(of: \pc_lineage.link)!)
            .assumingMemoryBound(to: pc_link.self)
    }

    /// The derived promise whose registry link is `link`, not retained.
    static func owner(ofRegistryLink link: UnsafeMutablePointer<pc_link>) -> Unmanaged<AnyPromise> {
        Unmanaged.fromOpaque(UnsafeRawPointer(link) - DerivedLayout.registryLinkOffset)
    }
}

/// `AnyPromise`'s stored properties, in their order: keep in step with the class (debug
/// builds check, in every `DerivedPromise.init`).
@usableFromInline
struct AnyPromiseStoredProperties: ~Copyable {
    var core: pc_promise
    var continuation: StoredHandler?
    var role: NodeRole
    var errorSideDispatched: Bool
    var storedValueNeedsDestroy: Bool
    var handlerPlace: HandlerPlace
    var isRoot: Bool
    #if DEBUG
    var creationSite: PromiseCreationSite?
    #endif
}

/// Where a derived promise's own fields are in its object: constants (see the top of
/// this file).
@usableFromInline
enum DerivedLayout {
    @inlinable
    static func aligned(_ offset: Int, to alignment: Int) -> Int {
        (offset + alignment - 1) & ~(alignment - 1)
    }

    /// `DerivedPromise.lineage`, from the object's address.
    @inlinable
    static var lineageOffset: Int {
        aligned(CoreLayout.headerSize + MemoryLayout<AnyPromiseStoredProperties>.size, to: MemoryLayout<Lineage>.alignment)
    }

    /// `ContextDerivedPromise.context`, from the object's address.
    @inlinable
    static var contextOffset: Int {
        aligned(lineageOffset + MemoryLayout<Lineage>.size, to: MemoryLayout<StoredContext>.alignment)
    }

    /// `pc_lineage.link` of a derived promise, from the object's address (`core` is the
    /// lineage's first field).
    static var registryLinkOffset: Int {
        lineageOffset + MemoryLayout<pc_lineage>.offset(of: \pc_lineage.link)!
    }
}
