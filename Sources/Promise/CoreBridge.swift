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
        pc_publish(corePointer)
        // A promise that was in flight lets its path go (see `holdPathWhileInFlight`).
        if pc_holds(corePointer) & UInt(PC_HOLDS_SELF) != 0 { dropSelfHold() }
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

    /// The word holding the parent's address, whose memory this promise holds (see
    /// `parentIfAlive`); written once, before the promise is shared.
    final var parentWord: UnsafeMutablePointer<UInt> {
        (UnsafeMutableRawPointer(corePointer) + MemoryLayout<pc_promise>.offset(of: \pc_promise.parent)!)
            .assumingMemoryBound(to: UInt.self)
    }

    /// The word holding the followed promise's address, whose memory this promise holds
    /// (see `FolloweeLink`), with `FolloweeLink.forwardsCancel` in bit 1.
    final var followeeWord: UnsafeMutablePointer<UInt> {
        (UnsafeMutableRawPointer(corePointer) + MemoryLayout<pc_promise>.offset(of: \pc_promise.followee)!)
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
        // No target, no lock. A word gets its target once, before any reader that needs it
        // can look (see `follow` for the one that is not set at init), and loses it for good.
        guard pc_word_load(word) & ~UInt(PC_WORD_LOCKED) != 0 else { return nil }
        let seen = pc_word_lock(word)
        // swift_tryRetain (CSwiftRuntime): retains unless the count already reached zero,
        // in one CAS on the count word, which also holds the deiniting flag.
        let retained = UnsafeMutableRawPointer(bitPattern: seen).flatMap { SwiftRuntime.tryRetain($0) }
        pc_word_unlock(word, seen)
        // Balances swift_tryRetain's retain.
        return retained.map { Unmanaged<AnyPromise>.fromOpaque($0).takeRetainedValue() }
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

    /// Drops a hold; the last one frees the memory of a promise that has died.
    static func release(_ address: UnsafeMutableRawPointer) {
        SwiftRuntime.unownedRelease(address)
    }
}

/// The parent word: the parent's address (its memory held, see `parentIfAlive`), with
/// `parentIsRoot` in bit 0, so that a child knows without touching the parent whether it
/// ever holds it (`holdsItsParentInFlight`).
enum ParentLink {
    static let parentIsRoot: UInt = 1
    static let addressMask: UInt = ~UInt(7)
}

/// The link from a promise to the one it follows (`resolve(with:)`, or a handler that
/// returned a promise): it holds the followee's memory, not the followee (a followee holds
/// its followers in its observer list: a strong link back would be a cycle), from the
/// moment the follower locks in until the follower dies. So it never dangles: reading it
/// tries the followee (`swift_tryRetain`) without a lock, and a follower that outlives its
/// followee keeps only the followee's bare object.
///
/// Written once, by the thread that won the claim to FOLLOWING, after that claim; read by
/// a canceller that took the claim over from FOLLOWING (to forward its cancel, when the
/// followee is work the follower owns) and by cycle detection (`wouldWaitOnItself`).
enum FolloweeLink {
    /// Bit 1 of the word: a cancel of the follower reaches the followee (a handler's
    /// returned promise, which the child owns; not a `resolve(with:)` argument).
    static let forwardsCancel: UInt = 2
    static let addressMask: UInt = ~UInt(7)
}

extension AnyPromise {
    /// Records `source` as the promise this one follows, holding its memory, then fences:
    /// only for the thread whose claim to FOLLOWING won, once, right after it.
    final func recordFollowee(_ source: AnyPromise, forwardsCancel: Bool) {
        let address = HeldMemory.hold(Unmanaged.passUnretained(source))
        // Release: a canceller or a cycle check that reads the word sees `source`'s address
        // only once its hold is in place.
        pc_word_store(followeeWord, address | (forwardsCancel ? FolloweeLink.forwardsCancel : 0))
        // StoreLoad: our link is visible before we read the links of the chain we would
        // follow (`wouldWaitOnItself`); pairs with the same fence of a promise that starts
        // following us at the same time.
        pc_fence()
    }

    /// The followed promise's address (its memory held by us), or nil if we never followed.
    final var followeeAddress: UnsafeMutableRawPointer? {
        UnsafeMutableRawPointer(bitPattern: pc_word_load(followeeWord) & FolloweeLink.addressMask)
    }

    /// The followed promise if it is still alive and a cancel of ours should reach it.
    final var followeeToCancel: AnyPromise? {
        let word = pc_word_load(followeeWord)
        guard word & FolloweeLink.forwardsCancel != 0,
              let address = UnsafeMutableRawPointer(bitPattern: word & FolloweeLink.addressMask) else { return nil }
        return HeldMemory.promiseIfAlive(at: address)
    }

    /// Whether following `source` would make this promise wait on itself: `source` is this
    /// promise, or waits for it through a chain of waits of any length. A pending promise
    /// waits for the promise it follows (locked in), and a pending child for its pending
    /// parent (its handler has not run). Called by a promise that just locked in and
    /// recorded its followee (`recordFollowee`), before it registers on `source`.
    ///
    /// Cost: when `source` is settled, or pending with no parent and following nothing
    /// (the common case: a handler returns a fresh or settled promise), two loads. Otherwise
    /// one try-retain (`swift_tryRetain`, a CAS) per promise of the chain `source` waits
    /// on, which ends at its first settled or parentless promise. No lock and no
    /// allocation. A follow chain built tail-first pays its length at each link.
    ///
    /// Races: two promises locking in to follow each other at the same time each record
    /// their link, fence, then read the other's; at least one of them sees the other's
    /// link (the fences are ordered one way or the other), so a cycle can never close
    /// unseen. Both may see it: both are then rejected, as they would be anyway.
    ///
    /// Not followed: waits through a combinator (a promise that follows `all([it])` waits
    /// on an aggregate, which is not a follow link); such a loop stays pending.
    final func wouldWaitOnItself(following source: AnyPromise) -> Bool {
        if source === self { return true }
        let me = UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
        var current = source
        while true {
            let next: UnsafeMutableRawPointer
            if current.claimHint == UInt(PC_CLAIM_FOLLOWING) {
                // Locked in but its link not recorded yet: it waits on nobody we can see,
                // and its own check, after recording, sees our link (the fences).
                guard let followee = current.followeeAddress else { return false }
                next = followee
            } else if let parent = current.parentAddress, current.isPending {
                next = parent  // a child waits on its parent while it is pending
            } else {
                return false
            }
            if next == me { return true }
            // Alive, or the chain ends here: nobody waits on a dead promise any more.
            guard let alive = HeldMemory.promiseIfAlive(at: next), alive.isPending else { return false }
            current = alive
        }
    }

    /// Rejects this promise, claimed as FOLLOWING by this thread, with
    /// `PromiseError.cycle` (or cancels it, when `parent` passes down a cancel that came
    /// first), and publishes. Nothing if a canceller took the claim over meanwhile.
    final func rejectAsCycle(parent: AnyPromise?) {
        guard claim(from: PC_CLAIM_FOLLOWING, to: PC_REJECTED) else { return }
        if let parent, let reason = cancelReasonFromAncestors(parent: parent) {
            turnClaimIntoCancel(from: PC_REJECTED, reason: reason)
        } else {
            failure = PromiseError.cycle
        }
        publishClaimedOutcome()
    }
}

/// The fire callback of a promise's own node: `source` is the promise it observed
/// (parent or followee) when that one settled, or nil when the node was deferred.
@usableFromInline
func promiseNodeFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let owner = AnyPromise.owner(ofNode: node)
    if let source {
        // The node's retain is handed to `sourceDidSettle`, which keeps or releases it.
        // Both references are borrowed, not retained for the call (a retain and a release
        // each, on the runtime's slow path for promises with a side table): the source is
        // held by whoever publishes or observes it until this returns, and the owner by the
        // node's retain, which `sourceDidSettle` releases only as the last thing it does.
        owner._withUnsafeGuaranteedRef { promise in
            AnyPromise.owner(ofCore: source)._withUnsafeGuaranteedRef { source in
                promise.sourceDidSettle(source, retained: owner)
            }
        }
    } else {
        owner.takeRetainedValue().runDeferred()
    }
}

/// The late callback of `keepParentUntilCascadeEnds`: the cascade is over; the promise
/// lets its parent go, then the late node's retain of it goes.
func cascadeEndFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let promise = AnyPromise.owner(ofNode: node).takeRetainedValue()
    promise.settledParentRetain.take()?.release()
}

// MARK: The first observer, inline in a root

extension AnyPromise {
    @inlinable
    static var spareNodeOffsetInCore: Int { MemoryLayout<pc_promise>.offset(of: \pc_promise.spare_node)! }

    @inlinable
    final var spareNodePointer: UnsafeMutablePointer<pc_node> {
        (UnsafeMutableRawPointer(corePointer) + AnyPromise.spareNodeOffsetInCore).assumingMemoryBound(to: pc_node.self)
    }

    /// Elects the caller to keep its observer in this promise's first-observer slot: only
    /// a root's (a root never uses `continuation` and `context`, which hold it), and only
    /// one caller, ever (a tree_flags bit: the losers see it set with one load, no CAS). The
    /// caller must then call `fillFirstObserverSlot`.
    @inlinable
    final func claimFirstObserverSlot() -> Bool {
        isRoot && pc_tree_flags_set(corePointer, UInt(PC_TREE_FIRST_OBSERVER))
    }

    /// Stores the observer of the caller that claimed the slot and registers the slot's
    /// node on this promise; the caller stored the observer's context first, unless it
    /// is `.immediate` (a root's already: see `whenComplete`). The node carries no retain:
    /// a promise does not keep itself alive (it would never be freed while pending).
    /// Firing takes one for as long as the observer waits for its context or the
    /// trampoline; a promise that dies pending moves the unrun observer to a box on a
    /// broken stand-in (`breakObservers`), which runs it with `PromiseError.brokenPromise`.
    ///
    /// `immediate` picks the fire callback, so that firing never looks into the context.
    @usableFromInline
    final func fillFirstObserverSlot(_ observer: consuming Continuation, immediate: Bool) {
        continuation = consume observer
        if immediate {
            spareNodePointer.pointee.fire = firstObserverFireImmediate
        } else {
            spareNodePointer.pointee.fire = firstObserverFire
        }
        pc_observe(corePointer, spareNodePointer)  // the release push publishes all three
    }

    /// The promise whose first-observer node is `node`, not retained.
    static func owner(ofSpareNode node: UnsafeMutablePointer<pc_node>) -> Unmanaged<AnyPromise> {
        owner(ofCore: (UnsafeMutableRawPointer(node) - spareNodeOffsetInCore).assumingMemoryBound(to: pc_promise.self))
    }

    /// Runs the observer in the first-observer slot, once.
    final func runFirstObserver() {
        guard let observer = continuation.take() else { return }
        observer.run(self, self)
    }
}

/// The fire callback of a root's first-observer slot on a context other than `.immediate`
/// (see `fillFirstObserverSlot`).
func firstObserverFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    // Borrowed: whoever publishes the promise holds it until this returns; the work sent
    // to the context holds it from then on.
    AnyPromise.owner(ofSpareNode: node)._withUnsafeGuaranteedRef { promise in
        promise.sendToContext { promise.runFirstObserver() }
    }
}

/// The fire callback of a root's first-observer slot on `.immediate`: deferred to the
/// trampoline, then run.
func firstObserverFireImmediate(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let owner = AnyPromise.owner(ofSpareNode: node)
    if source != nil {
        _ = owner.retain()  // for the trampoline: the settler may let the promise go before it runs
        pc_defer(node)
    } else {
        owner.takeRetainedValue().runFirstObserver()  // deferred: the retain taken above
    }
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

/// The fire callback of an `ObserverBox` (whenComplete, onCancel, resolve(with:), wait).
@usableFromInline
func observerBoxFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let box = CoreLayout.owner(ofFirstField: node, as: ObserverBox.self)
    if let source {
        // The box is borrowed from the node's retain, which goes to the trampoline with the
        // node or is released last.
        let queued = box._withUnsafeGuaranteedRef { observer in
            observer.sourceRetain = AnyPromise.owner(ofCore: source).retain()
            if observer.queued { observer.sendToContext() }  // the work holds the box from here
            return observer.queued
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

/// Whether `node` fires through `fire`: tells the kinds of node apart (a promise's own, an
/// `ObserverBox`'s, an aggregator slot's, a waiter's) when a dying promise releases them.
func nodeFires(_ node: UnsafeMutablePointer<pc_node>, through fire: pc_fire_fn) -> Bool {
    unsafeBitCast(node.pointee.fire, to: UnsafeRawPointer?.self) == unsafeBitCast(fire, to: UnsafeRawPointer.self)
}

extension AnyPromise {
    /// Releases what a dying promise owns without recursing, and answers the observers of
    /// a promise that dies pending: they receive `PromiseError.brokenPromise`
    /// (`breakObservers`) instead of waiting for ever. A settled parent that a child still
    /// held for a handler that never ran is released in a loop: a promise that only we
    /// still hold would release its own parent from inside its deinit, one level deeper
    /// each time (a million-step chain would overflow the stack), so its links are stolen
    /// into this loop first and it dies with nothing left to release.
    final func releaseOwnedLinksIteratively() {
        var work: UnsafeMutablePointer<pc_node>? = nil  // dying promises, linked by their free nodes

        func release(_ owned: Unmanaged<AnyPromise>) {
            // The runtime's check on the reference itself: `isKnownUniquelyReferenced` needs
            // a strong variable, a retain and a release per promise of a dying chain.
            guard SwiftRuntime.isUniquelyReferenced(owned.toOpaque()) else {
                owned.release()
                return
            }
            // Ours alone: keep the retain for the loop. Its node is in no list (a list would
            // hold a retain), so it serves as our link.
            let node = owned._withUnsafeGuaranteedRef { $0.nodePointer }
            node.pointee.next = work
            work = node
        }

        func stealLinks(of promise: AnyPromise) {
            // Only `self` can be pending here: the loop below steals settled parents.
            if let observers = pc_detach(promise.corePointer) { promise.breakObservers(observers) }
            if let parent = promise.settledParentRetain {
                promise.settledParentRetain = nil
                release(parent)  // its link up holds the memory: `parent` answers nil once it died
            }
        }

        stealLinks(of: self)
        while let node = work {
            work = node.pointee.next
            let promise = AnyPromise.owner(ofNode: node).takeRetainedValue()
            stealLinks(of: promise)
            // `promise` dies here, with nothing left to release.
        }
    }

    /// This promise is dying pending, and `detached` (newest first) are the observers still
    /// registered on it: hands each, in registration order, to a stand-in promise of the
    /// same type, already rejected with `PromiseError.brokenPromise`, on which it fires at
    /// once as on any settled promise. So a child runs its error side (`recover` can still
    /// turn the error into a value) and ends rejected, a `whenComplete` or an `await` gets
    /// the failure, a combinator counts a rejected input, a follower is rejected; `onCancel`
    /// handlers do not run (freeing is not cancelling). Observers on a context fire on it;
    /// `.immediate` ones on this thread, through the core's trampoline (no recursion),
    /// before the release that dropped the promise returns, as folly's `BrokenPromise`
    /// callbacks run in the promise's destructor. Such a handler must not touch the
    /// variable whose assignment dropped the promise (Swift's exclusivity check traps on
    /// `holder.promise = nil` while a handler reads `holder.promise`).
    ///
    /// No registration can race with this: registering needs a reference to the promise,
    /// and this runs once the last one is gone. A registration made before that is in the
    /// list, since the last release happens after it on whatever thread made it.
    final func breakObservers(_ detached: UnsafeMutablePointer<pc_node>) {
        let dying = UnownedLink.address(of: self)
        var ordered: UnsafeMutablePointer<pc_node>? = nil
        var node: UnsafeMutablePointer<pc_node>? = detached
        while let current = node {
            node = current.pointee.next
            current.pointee.next = ordered
            ordered = current
        }
        let standIn = makeBrokenStandIn()
        // One trampoline scope around the whole list, as a publish has: the observers fire
        // as one batch, in registration order, and inline handlers run after the loop,
        // not from inside it. (Inside another scope already, that scope runs them.)
        let openedScope = standIn.beginInlineObservation() != nil
        defer { if openedScope { endInlineObservation() } }
        node = ordered
        while let current = node {
            node = current.pointee.next
            if nodeFires(current, through: firstObserverFireImmediate) || nodeFires(current, through: firstObserverFire) {
                // Our own slot, whose memory goes with us: its observer moves to a box.
                guard let observer = continuation.take() else { continue }
                let context: (any ExecutionContext)? = nodeFires(current, through: firstObserverFire) ? takeContext() : nil
                MovedSlotObserver(observer, context: context).register(on: standIn)
                continue
            }
            // A link that points at us without holding our memory must go before it does.
            if nodeFires(current, through: aggregatorSlotFire) {
                clearAggregatorSlotInput(current, inputDyingAt: dying)
            }
            pc_observe(standIn.corePointer, current)  // the node's retain goes with it
        }
    }
}

// MARK: The tree_flags flags, the registry, the forwarding epoch and the holds word

/// The bits of a promise's `tree_flags` word (see `pc_registry.h`).
@usableFromInline
enum TreeFlag {
    @inlinable static var linked: UInt { UInt(PC_TREE_LINKED) }
    @inlinable static var cancelClaimed: UInt { UInt(PC_TREE_CANCEL_CLAIMED) }
    @inlinable static var cancelPublished: UInt { UInt(PC_TREE_CANCEL_PUBLISHED) }
}

extension AnyPromise {
    /// The tree_flags word (acquire: a `cancelPublished` seen makes the stored reason visible).
    @inlinable
    final var treeFlags: UInt { pc_tree_flags(corePointer) }

    /// Sets `flag`; true for the one call that set it (full barrier, see `pc_tree_flags_set`).
    final func setTreeFlag(_ flag: UInt) -> Bool {
        pc_tree_flags_set(corePointer, flag)
    }

    /// Pushes `child`'s spare node onto this promise's registry; the number of links
    /// pushed so far (approximate, for pruning).
    final func registryPush(_ link: UnsafeMutablePointer<pc_node>) -> UInt {
        pc_children_push(corePointer, link)
    }

    /// Takes the whole registry (newest first); the caller owns the links.
    final func registryTake() -> UnsafeMutablePointer<pc_node>? {
        pc_children_take(corePointer)
    }

    /// Lowers the registry's link count after `count` links were dropped.
    final func registryForget(_ count: UInt) {
        pc_children_forget(corePointer, count)
    }

    /// The holds word (see `holdPathWhileInFlight`).
    final var holdsWord: UInt { pc_holds(corePointer) }
    final func holdsAddIfHolding(_ delta: UInt) -> Bool { pc_holds_add_if_holding(corePointer, delta) }
    final func holdsAdd(_ delta: UInt) -> UInt { pc_holds_add(corePointer, delta) }
    final func holdsRemoveOne() -> UInt { pc_holds_remove_one(corePointer) }
    final func holdsClearSelf() -> UInt { pc_holds_clear_self(corePointer) }
    final func holdsMarkGone() { pc_holds_mark_gone(corePointer) }

    /// Runs the node's fire callback once the current cascade is over; false outside one.
    final func deferUntilCascadeEnds() -> Bool {
        pc_defer_late(nodePointer)
    }
}

/// The process-wide forwarding epoch (see `pc_forwarding_epoch`).
enum ForwardingEpoch {
    static func begin() { pc_forwarding_begin() }
    static func end() { pc_forwarding_end() }
    /// Read after the claim CAS (acquire).
    static var current: UInt { pc_forwarding_epoch() }
}

// MARK: The combinators' and waiters' helpers

/// Lowers a countdown word; true for the call that reaches zero (`pc_count_down`).
func countDownReachesZero(_ counter: UnsafeMutablePointer<UInt>) -> Bool {
    pc_count_down(counter) == 0
}

/// A one-shot election (`pc_once`): true for the one caller that set the flag.
func electOnce(_ flag: UnsafeMutablePointer<UInt>) -> Bool {
    pc_once(flag)
}

/// Registers a raw node (an aggregator slot's) on `promise`; the caller set its fire
/// callback and transferred whatever the node carries.
func observe(_ promise: AnyPromise, with node: UnsafeMutablePointer<pc_node>) {
    pc_observe(promise.corePointer, node)
}
