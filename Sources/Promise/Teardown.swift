import CPromiseCore

// Teardown: what a dying promise releases, without recursion, and what it tells the
// observers still registered on it if it dies pending (`PromiseError.brokenPromise`).
// Called from the deinits (AnyPromise.swift).

/// Whether `node` fires through `fire`: tells the kinds of node apart (a promise's own, a
/// root's first-observer slot, an `ObserverBox`'s, a `CompletionNode`, an aggregator
/// slot's, a waiter list's) when a dying promise releases them.
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
            // Ours alone: keep the retain for the loop. Its node is in no list, so it serves
            // as our link: a list holding a child's node holds a retain of it, and a root's
            // node (its first observer's, which holds none) has fired, since the root has
            // settled, and its deferred run or queued work holds a retain while it waits
            // (or borrows the root from the caller that settled it, which then still holds
            // it: no such root is uniquely ours here).
            let node = owned._withUnsafeGuaranteedRef { $0.nodePointer }
            node.pointee.next = work
            work = node
        }

        func stealLinks(of promise: AnyPromise) {
            // Only `self` can be pending here: the loop below steals settled parents.
            if let observers = promise.detachObservers() { promise.breakObservers(observers) }
            if !promise.isRoot {
                let hold = promise.takeSettledParent()
                // Its link up holds the memory: `parent` answers nil once it died.
                if !hold.isEmpty && !hold.isBorrowed { release(hold.parent) }
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
    /// Whether any of `detached` still waits: any node but a waiter list whose waiters all
    /// gave up (a timed-out `wait` leaves nobody waiting) or settle `timeout` children
    /// claimed already, the observers a prune would have taken off (`observerHasGivenUp`:
    /// whether one is still listed depends only on when the last prune ran), and what
    /// waits only for a cancel, which freeing is not: `onCancel` handlers, and the error
    /// side of a child that settled otherwise (a prune keeps it, for that cancel). For the
    /// broken-promise report.
    ///
    /// A child counts by its claim, not by whether its node has left yet: a child whose
    /// holder (or timer, or canceller) claimed it is still listed while that settle
    /// publishes, and the call may drop our last reference in between (a `reject` looks
    /// above through `parentIfAlive`): the report would then name observers that receive
    /// nothing, which no order of the two calls gives.
    private final func anyoneWaits(on detached: UnsafeMutablePointer<pc_node>) -> Bool {
        var node: UnsafeMutablePointer<pc_node>? = detached
        while let current = node {
            if nodeWaitsForAnOutcome(current) { return true }
            node = current.pointee.next
        }
        return false
    }

    /// Whether `node`, registered on this pending promise, still waits for its outcome
    /// (see `anyoneWaits`).
    final func nodeWaitsForAnOutcome(_ node: UnsafeMutablePointer<pc_node>) -> Bool {
        if nodeFires(node, through: rareStateFire) { return existingRareState?.anyEntryTakesTheOutcome == true }
        if nodeFires(node, through: observerBoxFire),
           !CoreLayout.owner(ofFirstField: node, as: ObserverBox.self)._withUnsafeGuaranteedRef({ $0.waitsForOutcome }) {
            return false
        }
        if nodeFires(node, through: promiseNodeFire) {
            // A child waits unclaimed; a follower (a handler returned us) waits while its
            // claim is still FOLLOWING, not once a cancel took it over.
            return AnyPromise.owner(ofNode: node)._withUnsafeGuaranteedRef {
                $0.claimHint == UInt($0.role == .following ? PC_CLAIM_FOLLOWING : PC_CLAIM_FREE)
            }
        }
        // The rest (a `CompletionNode`, a root's first-observer slot, an aggregator slot)
        // wait unless they gave up, which only a slot of a retired aggregator does.
        return !observerHasGivenUp(node, nil)
    }

    final func breakObservers(_ detached: UnsafeMutablePointer<pc_node>) {
        let dying = UnownedLink.address(of: self)
        var ordered: UnsafeMutablePointer<pc_node>? = nil
        var node: UnsafeMutablePointer<pc_node>? = detached
        if PromiseDiagnostics.isEnabled && anyoneWaits(on: detached) {
            PromiseDiagnostics.report(.brokenPromise, for: self)
        }
        while let current = node {
            node = current.pointee.next
            current.pointee.next = ordered
            ordered = current
        }
        let standIn = makeBrokenStandIn()
        // Its error is this promise's broken promise, reported above if anyone waited: the
        // stand-in is no unhandled rejection of its own, whatever its observers read.
        standIn.noteErrorSeen()
        // One trampoline scope around the whole list, as a publish has: the observers fire
        // as one batch, in registration order, and inline handlers run after the loop,
        // not from inside it. (Inside another scope already, that scope runs them.) The
        // `.immediate` observers moved onto it each hold it until they have run: the scope
        // lends it to nobody (`pc_inline_begin` records no opener).
        let openedScope = standIn.beginInlineObservation() != nil
        defer { if openedScope { standIn.endInlineObservation() } }
        moveObservers(startingAt: ordered, to: standIn, inputDyingAt: dying)
    }

    /// `breakObservers`' loop: hands each node, in order, to `standIn`.
    private final func moveObservers(startingAt first: UnsafeMutablePointer<pc_node>?, to standIn: AnyPromise,
                                     inputDyingAt dying: UInt) {
        var node = first
        while let current = node {
            node = current.pointee.next
            if nodeFires(current, through: firstObserverFireImmediate) || nodeFires(current, through: firstObserverFireDefault) {
                // Our own slot, whose memory goes with us: its observer moves to a box.
                guard let observer = continuation.take() else { continue }
                let context: (any ExecutionContext)? = nodeFires(current, through: firstObserverFireDefault) ? .default : nil
                MovedSlotObserver(observer, context: context).register(on: standIn)
                continue
            }
            // A link that points at us without holding our memory must go before it does.
            if nodeFires(current, through: aggregatorSlotFire) {
                clearAggregatorSlotInput(current, inputDyingAt: dying)
            }
            registerRawNode(current, on: standIn)  // the node's retain goes with it
        }
    }
}
