import CPromiseCore

// Every call into the C core, and every retain or release that crosses it, is in this
// file (swift-system's Syscalls.swift is the model); calls into the Swift runtime are in
// RuntimeBridge.swift. Ownership rule: a node that is registered (pc_observe) or deferred
// (pc_defer) carries one retain of the object that embeds it; whoever receives the node
// back in a fire callback owns that retain.

extension CoreLayout {
    /// Offset of the promise's own node inside its `pc_promise`.
    @inlinable
    static var nodeOffsetInCore: Int { MemoryLayout<pc_promise>.offset(of: \pc_promise.node)! }
}

extension AnyPromise {
    /// The promise's C state. `core` is the first stored property of the root class, so
    /// its address is the start of the stored properties, and it never moves.
    @inlinable
    final var corePointer: UnsafeMutablePointer<pc_promise> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: pc_promise.self)
    }

    @inlinable
    final var nodePointer: UnsafeMutablePointer<pc_node> {
        (UnsafeMutableRawPointer(corePointer) + CoreLayout.nodeOffsetInCore)
            .assumingMemoryBound(to: pc_node.self)
    }

    /// The object whose `core` is at `core` (not retained).
    @inlinable
    static func owner(ofCore core: UnsafeMutablePointer<pc_promise>) -> Unmanaged<AnyPromise> {
        Unmanaged.fromOpaque(UnsafeRawPointer(core) - CoreLayout.headerSize)
    }

    @inlinable
    static func owner(ofNode node: UnsafeMutablePointer<pc_node>) -> Unmanaged<AnyPromise> {
        Unmanaged.fromOpaque(UnsafeRawPointer(node) - CoreLayout.nodeOffsetInCore - CoreLayout.headerSize)
    }

    /// `PC_PENDING` or the published outcome; acquire, so the outcome's slots are readable.
    @inlinable
    final var publishedTag: UInt { UInt(pc_state(corePointer)) }

    /// `publishedTag` for the in-flight half of the Dekker pairing with the publisher
    /// (`holdPathWhileInFlight`): see `pc_holds_after_publish`.
    final var publishedTagAfterHold: UInt { UInt(pc_state_after_hold(corePointer)) }

    /// Whether observers are queued and not yet handed out (a snapshot, for descriptions).
    final var hasWaitingObservers: Bool { pc_has_waiting_observers(corePointer) }

    /// Takes the observers that gave up off this pending promise (`pc_prune`): each node
    /// is shown to `observerHasGivenUp`, and those it names go to `releaseNodeThatGaveUp`
    /// once the others are back. The number of nodes kept, or nil if the promise had
    /// settled (or another prune was running): then every node fires, or fired, as usual.
    /// Only from a thread that holds the promise.
    final func pruneObserversThatGaveUp() -> Int? {
        var kept = 0
        let context = UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
        return pc_prune(corePointer, observerHasGivenUp, releaseNodeThatGaveUp, context, &kept) ? kept : nil
    }

    /// The number of nodes registered on this pending promise: tests only, and only while
    /// no other thread registers on it or settles it (it walks nodes another thread may be
    /// firing and freeing otherwise).
    final var debugObserverNodeCount: Int {
        var count = 0
        var node = UnsafeMutablePointer<pc_node>(bitPattern: UInt(corePointer.pointee.state) & ~UInt(7))
        while let current = node {
            count += 1
            node = current.pointee.next
        }
        return count
    }

    /// Starts watching whether this promise, settled by the handler this thread runs
    /// next, fires `.immediate` children; returns the watch to restore
    /// (`pc_cascade_watch`).
    @inlinable
    final func watchCascade() -> UInt {
        UInt(pc_cascade_watch(corePointer))
    }

    /// `watchCascade`, from the frame that runs this promise's deferred handler, holding
    /// it with the reference its node carried: offers that reference to the first
    /// `.immediate` child the handler's publish fires (`pc_cascade_watch_offering`).
    @inlinable
    final func watchCascadeOfferingReference() -> UInt {
        UInt(pc_cascade_watch_offering(corePointer))
    }

    /// Whether the watched promise fired an `.immediate` child on this thread; restores
    /// the watch `previous` saved (`pc_cascade_watch_end`).
    @inlinable
    static func endCascadeWatch(_ previous: UInt) -> Bool {
        pc_cascade_watch_end(previous) & UInt(PC_WATCH_FIRED) != 0
    }

    /// `endCascadeWatch` for `watchCascadeOfferingReference`: also whether a child took
    /// the reference on offer (then the frame must not release it).
    @inlinable
    static func endOfferingCascadeWatch(_ previous: UInt) -> (firedInlineChild: Bool, referenceTaken: Bool) {
        let seen = pc_cascade_watch_end(previous)
        return (seen & UInt(PC_WATCH_FIRED) != 0, seen & UInt(PC_WATCH_OFFERED) == 0)
    }

    /// Tells the watch that this promise fired an `.immediate` child on this thread.
    @inlinable
    final func noteInlineChildFired() {
        pc_cascade_fired_inline(corePointer)
    }

    /// `noteInlineChildFired`, for a child that needs a reference to this promise: true if
    /// it took the one this thread's frame offers (`pc_cascade_fired_inline_taking`), which
    /// the caller then owns.
    @inlinable
    final func noteInlineChildFiredTakingReference() -> Bool {
        pc_cascade_fired_inline_taking(corePointer)
    }

    /// The claim word, as a hint (confirmed by `claim` before acting on it).
    @inlinable
    final var claimHint: UInt { UInt(pc_claimed(corePointer)) }

    /// Elects this caller as the one allowed to move the claim from `expected` to `desired`.
    @inlinable
    final func claim(from expected: UInt32, to desired: UInt32) -> Bool {
        pc_claim(corePointer, UInt(expected), UInt(desired))
    }

    /// Publishes the outcome this thread claimed (its slot already written) and fires
    /// the observers in registration order.
    @inlinable
    final func publishClaimedOutcome() {
        // Roots and a root's children never hold anything.
        guard holdsItsParentInFlight else { return pc_publish(corePointer) }
        // A promise in flight lets its path go once its inline children no longer need it.
        if holdsSelfHint { return publishLeavingFlight() }
        pc_publish(corePointer)
        // In flight after all: it went in flight while we published (see
        // `holdPathWhileInFlight`; one of the two drops the hold), or the hint read was
        // stale. Not having watched, keep the path until the cascade ends, to be safe.
        if pc_holds_after_publish(lineageCore) & UInt(PC_HOLDS_SELF) != 0 { leaveFlight(firedInlineChildren: true) }
    }

    /// For whoever holds a derived promise and is about to settle it (`fulfill`, `reject`):
    /// its parent, retained, if it needs keeping (see `publishKeepingParent`); nil for
    /// roots and a root's children, which keep nothing. Taken before the claim: once the
    /// claim is won, the parent's handler may find this promise settled, let the parent
    /// go and free it, before the publish could take it.
    ///
    /// Nil too for a promise already settled (its claim would fail). A promise in flight
    /// takes it all the same: its own hold would keep the path, but the thread putting it
    /// in flight drops that hold at once if it sees the promise settled.
    @inlinable
    final func parentToKeepForSettle() -> Unmanaged<AnyPromise>? {
        guard holdsItsParentInFlight else { return nil }
        let claimed = claimHint
        guard claimed == UInt(PC_CLAIM_FREE) || claimed == UInt(PC_CLAIM_FOLLOWING) else { return nil }
        return retainedParentIfAlive()
    }

    @usableFromInline
    final func retainedParentIfAlive() -> Unmanaged<AnyPromise>? {
        parentIfAlive.map { Unmanaged.passRetained($0) }
    }

    /// `publishClaimedOutcome` for an outcome given by whoever holds the promise, with
    /// the parent `parentToKeepForSettle` returned.
    @inlinable
    final func publishOutcomeFromHolder(keeping parent: Unmanaged<AnyPromise>?) {
        if let parent {
            publishKeepingParent(parent)
        } else {
            publishClaimedOutcome()
            // (A cancel leaves through `leavePendingSources`.)
            if claimHint == UInt(PC_CANCELLED) {
                // `cancel` goes on: it reaches a combinator's pending inputs, then retires
                // its aggregator (which lets those inputs prune their slots).
            } else if isRoot {
                if rareStateWordValue != 0 { settledRootLetsGoOfItsInputs() }
            } else {
                leaveParentIfPending()
            }
        }
        if !isRoot { dropHandlerParkedForContext() }
    }

    /// The rest of `publishOutcomeFromHolder`. A promise settled by its holder while its
    /// parent may still be pending (a side branch settled early, as `timeout`'s timer
    /// settles its child, or by the promise `resolve(with:)` made it follow) has no
    /// handler holding the parent, so nothing would keep the path its children take when
    /// they go in flight: a child queued on a context takes its hold inside this publish,
    /// and an `.immediate` child that locks in to follow a promise takes it later in the
    /// cascade. If the parent died before either, a cancel of a live ancestor would find
    /// the path broken. So the parent is kept across the publish, and, inside a cascade,
    /// until it ends, since `.immediate` children run later in it (outside one, they ran
    /// inside the publish). Unlike a handler's step, this asks no cascade watch: the
    /// publish of a promise in flight watches for itself (`publishLeavingFlight`), and
    /// holder settles are rare enough to keep regardless.
    @usableFromInline
    final func publishKeepingParent(_ parent: Unmanaged<AnyPromise>) {
        publishClaimedOutcome()
        parent._withUnsafeGuaranteedRef { leavePendingParent($0) }
        if keepUntilCascadeEnds(parent, then: releaseKeptPromise) { return }
        parent.release()
    }

    /// `publishClaimedOutcome` for a promise in flight (its path held): the path goes
    /// after the publish, or, if the publish fired `.immediate` children on this thread
    /// inside a cascade, once the cascade ended, since those children run later in it and
    /// may look up through the path (see `keepUntilCascadeEnds`).
    ///
    /// One race is left to the other side: a thread putting this promise in flight while
    /// we publish it (`holdPathWhileInFlight`, which drops the hold itself if it sees the
    /// outcome) lets the path go at once. Only a cancel, or code settling a child by hand
    /// as its parent fires it, can race that way; a cancelled child's own children take
    /// its cancel from it directly, without looking up.
    @usableFromInline
    final func publishLeavingFlight() {
        let previousWatch = watchCascade()
        pc_publish(corePointer)
        leaveFlight(firedInlineChildren: AnyPromise.endCascadeWatch(previousWatch))
    }

    /// Drops this published promise's own hold (its path), or, if its publish fired
    /// `.immediate` children inside a cascade, keeps it until the cascade ends.
    @usableFromInline
    final func leaveFlight(firedInlineChildren: Bool) {
        if firedInlineChildren {
            let retained = Unmanaged.passRetained(self)
            // Before this keep goes on top of the parent's, if any.
            freeParentValueOnceAdopted()
            if keepUntilCascadeEnds(retained, then: dropKeptSelfHold) { return }
            retained.release()  // outside a cascade: its children ran inside the publish
        }
        dropSelfHold()
    }

    /// The published outcome if this promise has settled, nothing fires it now, and this
    /// thread is in no firing: then an immediate observer may run at once without a node,
    /// exactly as registering one would have run it, and the caller must call
    /// `endInlineObservation` after it (which runs the work the observer deferred).
    /// Otherwise nil, and the caller registers as usual.
    @inlinable
    final func beginInlineObservation() -> UInt? {
        let tag = UInt(pc_inline_begin(corePointer))
        return tag == UInt(PC_PENDING) ? nil : tag
    }

    /// Ends the scope `beginInlineObservation` opened, running the work the observer
    /// deferred (which holds what it reads: the scope lends this promise to nobody).
    @inlinable
    final func endInlineObservation() {
        pc_inline_end()
    }

    /// Registers this promise's own node on `source`, transferring one retain of `self`
    /// to the node (balanced in `promiseNodeFire` or in `releaseDetached`).
    @usableFromInline
    final func observe(_ source: AnyPromise, as role: NodeRole) {
        self.role = role
        registerNode(nodePointer, firingThrough: promiseNodeFire, holding: self, on: source)
    }

    /// Runs `promiseNodeFire(node, nil)` after the current firing on this thread; the
    /// retain the node carries goes with it.
    @usableFromInline
    final func deferOnThisThread() {
        pc_defer(nodePointer)
    }

    /// The word holding the rare state's address (see `RareState`), 0 until it is made.
    @usableFromInline
    final var rareStateWord: UnsafeMutablePointer<UInt> {
        (UnsafeMutableRawPointer(corePointer) + MemoryLayout<pc_promise>.offset(of: \pc_promise.rare)!)
            .assumingMemoryBound(to: UInt.self)
    }

    /// The rare state word (acquire: the object it points at is fully initialised).
    @inlinable
    final var rareStateWordValue: UInt { pc_word_load(rareStateWord) }

    /// Publishes the rare state made by this thread; false if another thread's came first.
    final func publishRareState(_ address: UInt) -> Bool {
        pc_word_publish(rareStateWord, address)
    }

    /// The word holding the followed promise's address, whose memory this promise holds
    /// (see `FolloweeLink`), with `FolloweeLink.forwardsCancel` in bit 1: in a derived
    /// promise's lineage; in a root's rare state (a root follows only through
    /// `resolve(with:)`, rarely), so nil for a root that never made it. Only on a live
    /// promise (or a dying one, on itself): a root's rare state goes with it.
    @inline(__always)
    final var followeeWord: UnsafeMutablePointer<UInt>? {
        guard isRoot else { return lineageFolloweeWord }
        return UnsafeMutableRawPointer(bitPattern: rareStateWordValue).map(RareState.followeeWord(ofRareStateAt:))
    }

    /// A derived promise's followee word (see `followeeWord`).
    @inline(__always)
    final var lineageFolloweeWord: UnsafeMutablePointer<UInt> {
        (UnsafeMutableRawPointer(lineageCore) + MemoryLayout<pc_lineage>.offset(of: \pc_lineage.followee)!)
            .assumingMemoryBound(to: UInt.self)
    }
}

// MARK: Unowned links

/// References to promises that do not keep them alive, without Swift `weak`.
///
/// A `weak` reference gives its target a side table (an allocation) and sends every later
/// retain and release of the target through the runtime's slow path; a child's link to its
/// pending parent would pay that on every `then`. An unowned link is instead a plain
/// pointer in a locked word of the C core (`pc_word_*`, see `pc_overlay.h`):
///
/// - The owner stores it once, before any other thread can read it; the hot paths never
///   touch it again.
/// - A reader (`load`) takes the word's lock, calls `swift_tryRetain`, and unlocks: it gets
///   a strong reference, or nil if the target has begun dying.
/// - Whoever knows that the target is dying or is about to be left unguarded clears the
///   word under the lock (`clear`) before the target's memory can be freed. The one user
///   left is `AggregatorSlot` (a combinator's input), whose link a dying input clears
///   (`breakObservers`). Parents and followees are held by memory instead (`HeldMemory`).
///
/// Why that is safe: the target's memory is freed only after its deinit finishes, and its
/// deinit (or something that outlives the reader's window, as each link explains) clears
/// the word under the lock. A reader that locks first tries while the memory is alive; the
/// try fails if the count already reached zero, because the runtime sets the deiniting
/// flag in the same atomic step as that transition, and succeeds otherwise, in which case
/// the target cannot start dying until we release it. A reader that locks after the clear
/// sees 0. The lock is held for one CAS, and only on cold paths (navigation, cancelling,
/// the death of a pending promise or of an aggregate's input).
enum UnownedLink {
    /// The address stored in a word for `promise` (no retain).
    static func address(of promise: AnyPromise) -> UInt {
        UInt(bitPattern: Unmanaged.passUnretained(promise).toOpaque())
    }

    /// The target, retained, or nil if there is none or it has begun dying.
    static func load(_ word: UnsafeMutablePointer<UInt>) -> AnyPromise? {
        // Balances swift_tryRetain's retain.
        loadRetained(word).map { Unmanaged<AnyPromise>.fromOpaque($0).takeRetainedValue() }
    }

    /// `load` for a word that links to any object (a run, `AnyPromise.recordRun`).
    static func loadObject(_ word: UnsafeMutablePointer<UInt>) -> AnyObject? {
        // Balances swift_tryRetain's retain.
        loadRetained(word).map { Unmanaged<AnyObject>.fromOpaque($0).takeRetainedValue() }
    }

    /// The target's address with a retain the caller owns, or nil.
    private static func loadRetained(_ word: UnsafeMutablePointer<UInt>) -> UnsafeMutableRawPointer? {
        // No target, no lock. A word gets its target once, before any reader that needs it
        // can look (see `follow` for the one that is not set at init), and loses it for good.
        guard pc_word_load(word) & ~UInt(PC_WORD_LOCKED) != 0 else { return nil }
        let seen = pc_word_lock(word)
        // swift_tryRetain (CSwiftRuntime): retains unless the count already reached zero,
        // in one CAS on the count word, which also holds the deiniting flag.
        let retained = UnsafeMutableRawPointer(bitPattern: seen).flatMap { SwiftRuntime.tryRetain($0) }
        pc_word_unlock(word, seen)
        return retained
    }

    /// Gives an empty word its target (`address`, whose memory the caller holds for the
    /// link), before anyone reads it.
    static func store(_ word: UnsafeMutablePointer<UInt>, address: UnsafeMutableRawPointer) {
        pc_word_store(word, UInt(bitPattern: address))
    }

    /// Empties the word, waiting out a reader that is trying the target, and returns what
    /// it held (0 if nothing): the caller then drops the link's hold on that memory.
    static func take(_ word: UnsafeMutablePointer<UInt>) -> UInt {
        guard pc_word_load(word) & ~UInt(PC_WORD_LOCKED) != 0 else { return 0 }
        let seen = pc_word_lock(word)
        pc_word_unlock(word, 0)
        return seen
    }

    /// Sets the word to 0 if it points at `address`, waiting out a reader that is trying
    /// the target. After this returns, no thread can reach the target through the word.
    static func clear(_ word: UnsafeMutablePointer<UInt>, ifPointingAt address: UInt) {
        // The word cannot start pointing at `address` concurrently: a quick check suffices.
        guard pc_word_load(word) & ~UInt(PC_WORD_LOCKED) == address else { return }
        let seen = pc_word_lock(word)
        pc_word_unlock(word, seen == address ? 0 : seen)
    }
}

/// A follower's recorded chain end (`WaitWalk`, `AnyPromise.followChainEnd`): three words
/// of its rare state, `end`, `tag` and `firstChild`. `end` is a locked word
/// (`pc_word_lock`) that guards the other two: a walk replaces all three under the lock,
/// and a reader tries the promises under it, so that a replacer lets go of the old ones'
/// memory only once no reader is about to try them. `end` and `firstChild` hold their
/// promises' memory (`HeldMemory`), or are 0.
struct ChainEndRecordWords {
    let end: UnsafeMutablePointer<UInt>
    let tag: UnsafeMutablePointer<UInt>
    let firstChild: UnsafeMutablePointer<UInt>

    /// The promises, retained (nil where none is recorded or it has begun dying), and the
    /// tag; nil if no end is recorded (one load, no lock).
    func load() -> (end: AnyPromise?, tag: UInt, firstChild: AnyPromise?)? {
        guard pc_word_load(end) & ~UInt(PC_WORD_LOCKED) != 0 else { return nil }
        let seen = pc_word_lock(end)
        let tagSeen = tag.pointee
        let endRetained = UnsafeMutableRawPointer(bitPattern: seen).flatMap { SwiftRuntime.tryRetain($0) }
        let childRetained = UnsafeMutableRawPointer(bitPattern: firstChild.pointee).flatMap { SwiftRuntime.tryRetain($0) }
        pc_word_unlock(end, seen)
        // Balance swift_tryRetain's retains.
        return (endRetained.map { Unmanaged<AnyPromise>.fromOpaque($0).takeRetainedValue() }, tagSeen,
                childRetained.map { Unmanaged<AnyPromise>.fromOpaque($0).takeRetainedValue() })
    }

    /// The recorded end's address (0 if none): one load, no lock; a quick look, which a
    /// concurrent `replace` may make stale.
    var endAddress: UInt { pc_word_load(end) & ~UInt(PC_WORD_LOCKED) }

    /// Puts in the three values (addresses whose memory the caller holds for the record,
    /// or 0), waiting out a reader, and returns the two addresses they replace: the caller
    /// then lets go of that memory.
    func replace(end newEnd: UInt, tag newTag: UInt, firstChild newChild: UInt) -> (end: UInt, firstChild: UInt) {
        let oldEnd = pc_word_lock(end)
        let oldChild = firstChild.pointee
        tag.pointee = newTag
        firstChild.pointee = newChild
        pc_word_unlock(end, newEnd)
        return (oldEnd, oldChild)
    }
}

/// Links that hold a promise's memory but not the promise: the runtime's unowned reference
/// count. The promise still dies (its deinit runs, destroying its value and releasing what
/// it holds) when its last strong reference goes; only its bare object stays allocated
/// until the last hold is released, so trying it stays valid. Used by a child's link to
/// its parent (`parentIfAlive`) and by the cancellation registry's links to children.
enum HeldMemory {
    /// Holds `promise`'s memory; returns its address, for `promiseIfAlive` and `release`.
    static func hold(_ promise: Unmanaged<AnyPromise>) -> UInt {
        { SwiftRuntime.unownedRetain(promise.toOpaque()); return UInt(bitPattern: promise.toOpaque()) }()
    }

    /// The promise at `address` (whose memory the caller holds), retained, or nil once it
    /// has begun dying. swift_tryRetain: one CAS on the count word, which also holds the
    /// deiniting flag, so it cannot succeed on a promise whose deinit has started.
    static func promiseIfAlive(at address: UnsafeMutableRawPointer) -> AnyPromise? {
        // Balances swift_tryRetain's retain.
        SwiftRuntime.tryRetain(address).map { Unmanaged<AnyPromise>.fromOpaque($0).takeRetainedValue() }
    }

    /// Whether the promise at `address` (whose memory the caller holds, alive or not)
    /// is pending: one load of its state word, no retain. A promise that died pending
    /// has handed its observers on (`breakObservers`), so a caller that only wants a
    /// pending promise's list may stop at false.
    static func isPendingPromise(at address: UnsafeMutableRawPointer) -> Bool {
        pc_state((address + CoreLayout.headerSize).assumingMemoryBound(to: pc_promise.self)) == PC_PENDING
    }

    /// Whether the promise whose memory is held at `address` is unclaimed: no settle has
    /// begun and it follows nothing. A hint (relaxed): the claim never goes back to free.
    static func isFreeToSettlePromise(at address: UnsafeMutableRawPointer) -> Bool {
        pc_claimed((address + CoreLayout.headerSize).assumingMemoryBound(to: pc_promise.self)) == UInt(PC_CLAIM_FREE)
    }

    /// Drops a hold; the last one frees the memory of a promise that has died.
    static func release(_ address: UnsafeMutableRawPointer) {
        SwiftRuntime.unownedRelease(address)
    }
}

/// The parent word: the parent's address (its memory held, see `parentIfAlive`), with
/// `parentIsRoot` in bit 0, so that a child knows without touching the parent whether it
/// ever holds it (`holdsItsParentInFlight`).
@usableFromInline
enum ParentLink {
    @usableFromInline static let parentIsRoot: UInt = 1
    /// A child that something besides its parent settles (`timeout`'s, which its timer
    /// rejects): for the cycle check, it does not wait only on its parent.
    static let settledBesidesParent: UInt = 2
    static let addressMask: UInt = ~UInt(7)
}

// MARK: The first observer, inline in a root

extension AnyPromise {
    /// Elects the caller to keep its observer in this promise's first-observer slot: only
    /// a root's (a root never uses `continuation`, which holds it), and only one caller,
    /// ever (a tree_flags bit: the losers see it set with one load, no CAS). The
    /// caller must then call `fillFirstObserverSlot`.
    @inlinable
    final func claimFirstObserverSlot() -> Bool {
        isRoot && pc_tree_flags_set(corePointer, UInt(PC_TREE_FIRST_OBSERVER))
    }

    /// Stores the observer of the caller that claimed the slot and registers the slot's
    /// node on this promise. The slot has no room for a context: it takes observers on
    /// `.immediate` or `.default` only (`whenComplete` boxes the others), and the fire
    /// callback says which. The node carries no retain:
    /// a promise does not keep itself alive (it would never be freed while pending).
    /// Firing takes one for as long as the observer waits for its context or the
    /// trampoline, unless the settling call opened the firing scope (then its caller holds
    /// the promise until the observer has run: `callerHoldsThroughDeferredWork`); a
    /// promise that dies pending moves the unrun observer to a box on a broken stand-in
    /// (`breakObservers`), which runs it with `PromiseError.brokenPromise`.
    ///
    /// `immediate` true for `.immediate`, false for `.default`.
    @usableFromInline
    final func fillFirstObserverSlot(_ observer: consuming StoredHandler, immediate: Bool) {
        continuation = consume observer
        if immediate {
            nodePointer.pointee.fire = firstObserverFireImmediate
        } else {
            nodePointer.pointee.fire = firstObserverFireDefault
        }
        pc_observe(corePointer, nodePointer)  // the release push publishes both
    }

    /// Runs the observer in the first-observer slot, once.
    final func runFirstObserver() {
        guard let observer = continuation.take() else { return }
        observer.run(self, self)
    }
}

/// The fire callback of a root's first-observer slot on `.default` (see
/// `fillFirstObserverSlot`).
func firstObserverFireDefault(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    // Borrowed: whoever publishes the promise holds it until this returns; the work sent
    // to the context holds it from then on.
    AnyPromise.owner(ofNode: node)._withUnsafeGuaranteedRef { promise in
        DefaultExecutionContext().execute { promise.runFirstObserver() }
    }
}

/// The fire callback of a root's first-observer slot on `.immediate`: deferred to the
/// trampoline, then run.
func firstObserverFireImmediate(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let owner = AnyPromise.owner(ofNode: node)
    if let source {
        if callerHoldsThroughDeferredWork(source) {
            node.pointee.fire = firstObserverRunBorrowed  // the settling call's caller holds it
        } else {
            _ = owner.retain()  // for the trampoline: the settler may let the promise go before it runs
        }
        pc_defer(node)
    } else {
        owner.takeRetainedValue().runFirstObserver()  // deferred: the retain taken above
    }
}

/// The deferred half of `firstObserverFireImmediate` when the promise's settling call
/// opened the firing scope (its caller holds the promise until this has run).
func firstObserverRunBorrowed(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    AnyPromise.owner(ofNode: node)._withUnsafeGuaranteedRef { $0.runFirstObserver() }
}

/// Whether the call on `source` that fires its observers (its settling call, or a
/// registration on it once settled) opened this thread's outermost firing scope: then its
/// caller holds `source` until all the work deferred in that scope has run
/// (`pc_scope_opened_by`), and deferred work on it needs no reference of its own.
@inline(__always)
func callerHoldsThroughDeferredWork(_ source: UnsafeMutablePointer<pc_promise>) -> Bool {
    pc_scope_opened_by(source)
}

extension ObserverBox {
    @inlinable
    final var nodePointer: UnsafeMutablePointer<pc_node> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: pc_node.self)
    }

    /// Registers the box on `source`, handing the caller's reference to its node
    /// (`consuming`: a fresh box moves its one reference there, with no retain and release).
    @usableFromInline
    final consuming func register(on source: AnyPromise) {
        registerNode(nodePointer, firingThrough: observerBoxFire, holding: self, on: source)
    }
}

/// Registers `node` on `source` to fire through `fire`, the node carrying one retain of
/// `owner`, the object that embeds it (`consuming`: a caller's last reference moves there
/// instead of being retained and released).
@inline(__always)
func registerNode(_ node: UnsafeMutablePointer<pc_node>, firingThrough fire: pc_fire_fn,
                  holding owner: consuming AnyObject, on source: AnyPromise) {
    node.pointee.fire = fire
    _ = Unmanaged.passRetained(owner)
    pc_observe(source.corePointer, node)
}

/// The fire callback of an `ObserverBox` (whenComplete on a context, onCancel,
/// resolve(with:), wait).
@usableFromInline
func observerBoxFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let box = CoreLayout.owner(ofFirstField: node, as: ObserverBox.self)
    if let source {
        // The box is borrowed from the node's retain, which goes to the trampoline with the
        // node or is released last.
        let queued = box._withUnsafeGuaranteedRef { observer in
            let queued = observer.queued
            if !queued && callerHoldsThroughDeferredWork(source) {
                // Runs before the settling call returns, whose caller holds the source.
                observer.heldSource = AnyPromise.owner(ofCore: source)
                node.pointee.fire = observerBoxRunBorrowingSource
                return false
            }
            observer.heldSource = AnyPromise.owner(ofCore: source).retain()
            if queued { observer.scheduleFire() }  // the work holds the box from here
            return queued
        }
        if queued {
            box.release()
        } else {
            pc_defer(node)  // the node's retain goes with it
        }
    } else {
        box.takeRetainedValue().fire()
    }
}

extension AnyPromise {
    /// Registers `node` (a fresh `CompletionNode`, which the list then owns) on this
    /// promise.
    @usableFromInline
    final func registerCompletionNode(_ node: UnsafeMutablePointer<CompletionNode>) {
        let core = UnsafeMutableRawPointer(node).assumingMemoryBound(to: pc_node.self)
        core.pointee.fire = completionNodeFire
        pc_observe(corePointer, core)
    }
}

/// The fire callback of a `CompletionNode`: deferred to the trampoline with its source,
/// then run (as `observerBoxFire` does for a box on `.immediate`).
func completionNodeFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let completion = UnsafeMutableRawPointer(node).assumingMemoryBound(to: CompletionNode.self)
    if let source {
        let settled = AnyPromise.owner(ofCore: source)
        if callerHoldsThroughDeferredWork(source) {
            // Runs before the settling call returns, whose caller holds the source.
            completion.pointee.source = UInt(bitPattern: settled.toOpaque())
            node.pointee.fire = completionNodeRunBorrowingSource
        } else {
            completion.pointee.source = UInt(bitPattern: settled.retain().toOpaque())
        }
        pc_defer(node)
    } else {
        let settled = Unmanaged<AnyPromise>.fromOpaque(UnsafeRawPointer(bitPattern: completion.pointee.source).unsafelyUnwrapped)
        CompletionNode.run(completion, source: settled.takeRetainedValue())
    }
}

/// The deferred half of `completionNodeFire` when the source's settling call opened the
/// firing scope: `source` holds the source unretained.
func completionNodeRunBorrowingSource(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let completion = UnsafeMutableRawPointer(node).assumingMemoryBound(to: CompletionNode.self)
    Unmanaged<AnyPromise>.fromOpaque(UnsafeRawPointer(bitPattern: completion.pointee.source).unsafelyUnwrapped)
        ._withUnsafeGuaranteedRef { CompletionNode.run(completion, source: $0) }
}

/// The deferred half of `observerBoxFire` when the source's settling call opened the
/// firing scope: `heldSource` holds the source unretained.
func observerBoxRunBorrowingSource(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    CoreLayout.owner(ofFirstField: node, as: ObserverBox.self).takeRetainedValue().fireBorrowingSource()
}

// MARK: The tree flags, the registry, the forwarding epoch and the holds word

/// The bits of a promise's `tree_flags` word (see `pc_registry.h`).
@usableFromInline
enum TreeFlag {
    @inlinable static var linked: UInt { UInt(PC_TREE_LINKED) }
    @inlinable static var cancelClaimed: UInt { UInt(PC_TREE_CANCEL_CLAIMED) }
    @inlinable static var cancelPublished: UInt { UInt(PC_TREE_CANCEL_PUBLISHED) }
    @inlinable static var errorSeen: UInt { UInt(PC_TREE_ERROR_SEEN) }
    static var leftParent: UInt { UInt(PC_TREE_LEFT_PARENT) }
    static var retired: UInt { UInt(PC_TREE_RETIRED) }
    static var retiring: UInt { UInt(PC_TREE_RETIRING) }
    static var walkedThrough: UInt { UInt(PC_TREE_WALKED_THROUGH) }
    /// Derived promises only (a root's is `PC_TREE_FIRST_OBSERVER`, the same bit).
    static var adopted: UInt { UInt(PC_TREE_ADOPTED) }
}

/// The walk epoch (`pc_walk_epoch`): moves when a pending child that a cycle check's walk
/// went through to its parent locks in to follow another promise, which ends the skips
/// recorded over it (`WaitWalk`).
enum WalkEpoch {
    /// Acquire.
    static var current: UInt { pc_walk_epoch() }
    /// Full (seq_cst).
    static func advance() { pc_walk_epoch_advance() }
}

extension AnyPromise {
    /// The tree_flags word (acquire: a `cancelPublished` seen makes the stored reason visible).
    @inlinable
    final var treeFlags: UInt { pc_tree_flags(corePointer) }

    /// The tree_flags word after a full fence, with no retirement being decided in it, for
    /// a reader that has just taken a strong reference through a link that does not hold
    /// this promise (`pc_tree_flags_after_fence`).
    final var treeFlagsAfterFence: UInt { pc_tree_flags_after_fence(corePointer) }

    /// Clears the flags of `clear` and sets those of `set` in one step (a full, acq_rel,
    /// CAS: see `pc_tree_flags_update`).
    final func updateTreeFlags(clearing clear: UInt, setting set: UInt) {
        pc_tree_flags_update(corePointer, clear, set)
    }

    /// Sets `flag`; true for the one call that set it (a full, acq_rel, CAS: no StoreLoad
    /// barrier; see `pc_tree_flags_set`).
    final func setTreeFlag(_ flag: UInt) -> Bool {
        pc_tree_flags_set(corePointer, flag)
    }

    /// Pushes `child`'s registry link onto this promise's registry; the number of links
    /// pushed so far (approximate, for pruning).
    final func registryPush(_ link: UnsafeMutablePointer<pc_link>) -> UInt {
        pc_children_push(corePointer, link)
    }

    /// Takes the whole registry (newest first); the caller owns the links.
    final func registryTake() -> UnsafeMutablePointer<pc_link>? {
        pc_children_take(corePointer)
    }

    /// Lowers the registry's link count after `count` links were dropped.
    final func registryForget(_ count: UInt) {
        pc_children_forget(corePointer, count)
    }

    /// The holds word (see `holdPathWhileInFlight`); only for a derived promise.
    @usableFromInline
    final var holdsWord: UInt { pc_holds(lineageCore) }
    final func holdsAddIfHolding(_ delta: UInt) -> Bool { pc_holds_add_if_holding(lineageCore, delta) }
    final func holdsAdd(_ delta: UInt) -> UInt { pc_holds_add(lineageCore, delta) }
    final func holdsRemoveOne() -> UInt { pc_holds_remove_one(lineageCore) }
    final func holdsClearSelf() -> UInt { pc_holds_clear_self(lineageCore) }
    final func holdsMarkGone() { pc_holds_mark_gone(lineageCore) }

    /// Whether the holds word has `PC_HOLDS_SELF`, as a hint (`pc_holds_self_hint`); only
    /// for a derived promise.
    @inlinable
    final var holdsSelfHint: Bool { pc_holds_self_hint(lineageCore) }

    /// Takes the observers still registered on a promise that dies pending (deinit only).
    final func detachObservers() -> UnsafeMutablePointer<pc_node>? {
        pc_detach(corePointer)
    }

    /// The followee word (see `FolloweeLink`), read with acquire; 0 if there is none.
    final var followeeWordValue: UInt {
        followeeWord.map { pc_word_load($0) } ?? 0
    }

    /// `followeeWordValue` of a promise known to be derived.
    @inline(__always)
    final var lineageFolloweeWordValue: UInt { pc_word_load(lineageFolloweeWord) }

    /// Stores the followee word (release: the followee's memory hold is in place first),
    /// making a root's rare state for it.
    final func storeFolloweeWord(_ value: UInt) {
        pc_word_store(followeeWord ?? rareState.followeeWord, value)
    }

}

/// Keeps `retained` until the cascade this thread is in has ended, then calls `then` with
/// it (`pc_keep_until_cascade_end`); false, doing nothing, outside a cascade (the caller
/// lets go itself).
func keepUntilCascadeEnds(_ retained: Unmanaged<AnyPromise>, then: pc_release_fn) -> Bool {
    pc_keep_until_cascade_end(retained.toOpaque(), then)
}

/// Whether the newest item this thread's cascade keeps is `promise`, kept with `release`
/// (`pc_cascade_keeps_last`): then that keep's reference stays until the cascade ends.
func cascadeKeepsLast(_ promise: AnyPromise, then release: pc_release_fn) -> Bool {
    pc_cascade_keeps_last(Unmanaged.passUnretained(promise).toOpaque(), release)
}

/// The end of a cascade for a promise kept by `keepUntilCascadeEnds`: lets it go.
func releaseKeptPromise(_ item: UnsafeMutableRawPointer) {
    Unmanaged<AnyPromise>.fromOpaque(item).release()
}

/// The end of a cascade for a promise that left flight inside it
/// (`publishLeavingFlight`): drops its path, then lets it go.
func dropKeptSelfHold(_ item: UnsafeMutableRawPointer) {
    let promise = Unmanaged<AnyPromise>.fromOpaque(item)
    promise._withUnsafeGuaranteedRef { $0.dropSelfHold() }
    promise.release()
}

/// The process-wide forwarding epoch (see `pc_forwarding_epoch`).
enum ForwardingEpoch {
    static func begin() { pc_forwarding_begin() }
    static func end() { pc_forwarding_end() }
    /// Read after the claim CAS (acquire).
    static var current: UInt { pc_forwarding_epoch() }
    /// No forward in progress (never again once the epoch reached its end): see
    /// `pc_forwarding_is_quiet`.
    static func isQuiet(_ word: UInt) -> Bool { pc_forwarding_is_quiet(word) }
}

/// The locked word of the diagnostics handler (`pc_diagnostics_word`): 0, or a retained
/// handler box.
enum DiagnosticsHandlerWord {
    /// Whether a handler is set: one acquire load, no lock.
    static var isSet: Bool { pc_word_load(pc_diagnostics_word()) != 0 }

    /// Under the word's lock: `body` gets the current value and returns the one to store.
    static func update(_ body: (UInt) -> UInt) {
        let word = pc_diagnostics_word()
        pc_word_unlock(word, body(pc_word_lock(word)))
    }
}

/// Runs `body` holding the spin lock of `word`, a locked word used as a plain lock (its
/// value stays 0: `pc_word_lock`, `pc_word_unlock`). Cold paths only: a waiter list,
/// `SpinLocked` state.
func withWordLock<T>(_ word: UnsafeMutablePointer<UInt>, _ body: () -> T) -> T {
    _ = pc_word_lock(word)
    defer { pc_word_unlock(word, 0) }
    return body()
}

#if DEBUG
/// Locks `word` (`pc_word_lock`), hands `body` its value, stores what `body` returns and
/// unlocks: a word that holds a pointer, read and replaced under its lock (the debug-only
/// `FollowWindowHook`'s closure, which a reader retains before the writer may release it).
func updateLockedWord(_ word: UnsafeMutablePointer<UInt>, _ body: (UInt) -> UInt) {
    pc_word_unlock(word, body(pc_word_lock(word)))
}
#endif

/// State guarded by a spin lock in one word (`withWordLock`), held for a few field updates
/// and never around a call into user code: the step of a `retry`, a bounded fan-out, the
/// timer heap (one heap operation, and re-arming its Dispatch source). The lock word is
/// the object's first stored property, so its address needs no lookup; subclasses keep
/// their fields behind it.
class SpinLocked: @unchecked Sendable {
    private final var lockWord: UInt = 0

    final func withLock<T>(_ body: () -> T) -> T {
        withWordLock(_getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: UInt.self), body)
    }
}

/// Runs `node`'s fire callback with no source after the current firing on this thread
/// (`pc_defer`); the retain the node carries goes with it.
func deferNode(_ node: UnsafeMutablePointer<pc_node>) {
    pc_defer(node)
}

/// Combinator slots' runs on this thread, counted (`pc_slot_run_begin`, pc_overlay.h): a
/// slot inside `PC_SLOT_NESTING` others is queued (`later`) instead of running, and the
/// outermost run's `end` runs it.
enum SlotRuns {
    @inline(__always) static var tooDeep: Bool { pc_slot_runs_too_deep() }
    @inline(__always) static func begin() { pc_slot_run_begin() }
    @inline(__always) static func end() { pc_slot_run_end() }
    /// Queues `node`'s fire callback, with no source, for the outermost run's `end`.
    static func later(_ node: UnsafeMutablePointer<pc_node>) { pc_slot_run_later(node) }
}

/// Calls into an execution context the user gave (`pc_context_call_begin`, pc_overlay.h).
/// A context must run work later, never inside `execute`; one that runs it there anyway
/// would nest each handler's settle inside the one before, and a long chain of them would
/// overflow the stack. Each call is counted, and a call made inside 16 others on the same
/// thread (a context running work inline, that deep) is not made then: it is queued, and
/// made, in order, once the outermost call returns. So every piece of work still runs
/// inside its own context's `execute` (a context that runs it under a lock keeps that
/// exclusion), only later. Thread-local counts: no atomics.
enum ContextCalls {
    /// `context.execute(work)`, counted as a call into a context; queued if this thread is
    /// too deep in such calls already.
    @inline(__always)
    static func execute<Context: ExecutionContext>(_ work: @escaping @Sendable () -> Void, on context: Context) {
        if pc_context_calls_too_deep() { return later(work, on: context) }
        pc_context_call_begin()
        context.execute(work)
        pc_context_call_end()
    }

    @inline(never)
    private static func later<Context: ExecutionContext>(_ work: @escaping @Sendable () -> Void, on context: Context) {
        let call = QueuedContextCall { execute(work, on: context) }
        pc_context_run_later(Unmanaged.passRetained(call).toOpaque(), makeQueuedContextCall)
    }
}

/// A call `ContextCalls` queued (a box: the core queues one pointer per call).
private final class QueuedContextCall {
    let make: @Sendable () -> Void
    init(_ make: @escaping @Sendable () -> Void) { self.make = make }
}

/// The outermost call's end makes the calls that were queued (`pc_context_call_end`).
private func makeQueuedContextCall(_ item: UnsafeMutableRawPointer) {
    Unmanaged<QueuedContextCall>.fromOpaque(item).takeRetainedValue().make()
}

/// The word at `word`, with an acquire load (`pc_word_load`): for a word some other code
/// changes atomically (the Swift runtime's reference counts, read by `RuntimeBridge`).
func loadWordAcquiring(_ word: UnsafeMutablePointer<UInt>) -> UInt {
    pc_word_load(word)
}

/// A full memory fence, StoreLoad included (`pc_fence`).
func fullFence() {
    pc_fence()
}

// MARK: The combinators' and waiters' helpers

/// Lowers a countdown word; true for the call that reaches zero (`pc_count_down`).
func countDownReachesZero(_ counter: UnsafeMutablePointer<UInt>) -> Bool {
    pc_count_down(counter) == 0
}

/// Enters an aggregate's retirement gate; false once it retired (`pc_gate_enter`).
/// A word's value, read after a read-modify-write of this thread's that the word's
/// writer, having stored and fenced, may be looking for (`pc_word_load_after_rmw`).
func wordAfterReadModifyWrite(_ word: UnsafeMutablePointer<UInt>) -> UInt {
    pc_word_load_after_rmw(word)
}

/// Stores `value` in a word no thread locks (release).
func storeWord(_ word: UnsafeMutablePointer<UInt>, _ value: UInt) {
    pc_word_store(word, value)
}

func gateEnter(_ gate: UnsafeMutablePointer<UInt>) -> Bool {
    pc_gate_enter(gate)
}

/// Leaves the gate, asking for retirement if `request`; true for the one caller that
/// must retire (`pc_gate_leave`).
func gateLeave(_ gate: UnsafeMutablePointer<UInt>, request: Bool) -> Bool {
    pc_gate_leave(gate, request)
}

/// What `word` (never locked) held, leaving 0 there: of callers racing for one value,
/// exactly one gets it (`pc_word_take`).
func takeWord(_ word: UnsafeMutablePointer<UInt>) -> UInt {
    pc_word_take(word)
}

/// `takeWord`, but only a value with a bit of `mask` set; 0, taking nothing, for any
/// other (`pc_word_take_marked`).
func takeWordIfMarked(_ word: UnsafeMutablePointer<UInt>, mask: UInt) -> UInt {
    pc_word_take_marked(word, mask)
}

/// A one-shot election (`pc_once`): true for the one caller that set the flag.
func electOnce(_ flag: UnsafeMutablePointer<UInt>) -> Bool {
    pc_once(flag)
}

/// Registers a raw node (an aggregator slot's) on `promise`; the caller set its fire
/// callback and transferred whatever the node carries.
func registerRawNode(_ node: UnsafeMutablePointer<pc_node>, on promise: AnyPromise) {
    pc_observe(promise.corePointer, node)
}
