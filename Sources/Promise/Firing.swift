import CPromiseCore

// Firing: what happens to a child when the promise it observes settles. The core calls
// `promiseNodeFire` for the child's node (CoreBridge registered it); the child either
// hands its handler to its context or defers it on this thread's trampoline, runs it
// with its parent's outcome, and lets the parent go when the handler is done.
//
// The walk of one value, from `fulfill` to a handler queued on a context, file by file:
// Promise.swift `fulfill` -> CoreBridge `claim`, `publishClaimedOutcome` (pc_publish fires
// the observers in order) -> here: `promiseNodeFire`, `sourceDidSettle` (links the child
// for cancels, sends it to its context), `runContinuationTakingParent`, `runContinuation`
// -> Continuations.swift `StoredHandler.run` (the user's handler) -> Settling.swift
// `settleFromHandler`, `fulfillFromHandler` -> CoreBridge `publishClaimedOutcome` again.

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
        // The node's retain keeps the owner alive while its handler runs, and goes to the
        // first `.immediate` child its publish fires if one takes it (`runDeferred`).
        let handedOn = owner._withUnsafeGuaranteedRef { $0.runDeferred() }
        if !handedOn { owner.release() }
    }
}

extension AnyPromise {
    /// The observed promise (parent or followee) settled; `retained` is the retain the
    /// node carried, which this keeps (deferring the node) or releases. The caller borrows
    /// `self` from that retain: nothing may touch `self` after releasing it.
    @usableFromInline
    final func sourceDidSettle(_ source: AnyPromise, retained: Unmanaged<AnyPromise>) {
        switch role {
        case .continuation:
            if runsHandlerInline {
                // Held until the handler is done (see `settledParent`), which runs later on
                // this thread: by the reference of the frame running the source's own
                // handler if it offers it (that frame returns first); else by the caller of
                // the source's settling call if it opened the firing scope; else by a
                // retain of our own. The fire also tells the cascade watch: our handler
                // may look up through the source's parent (`keepParentUntilCascadeEnds`).
                let source = Unmanaged.passUnretained(source)
                if source._withUnsafeGuaranteedRef({ $0.noteInlineChildFiredTakingReference() }) {
                    settledParent = .owning(source)
                } else if callerHoldsThroughDeferredWork(source._withUnsafeGuaranteedRef { $0.corePointer }) {
                    settledParent = .borrowing(source)
                } else {
                    settledParent = .owning(source.retain())
                }
                deferOnThisThread()  // runs right after the current firing, no recursion
                return
            }
            let parent = Unmanaged.passRetained(source)  // held until the handler is done
            if source.carriesCancelForDescendants {
                settledParentOfContextChild = .owning(parent)
                // The error side goes to the context now, in registration order with the
                // other observers on it; cancelling this child itself is deferred (stack
                // safety) but still happens before the settling call returns.
                if source.isCancelled, continuation?.hasErrorSide == true {
                    errorSideDispatched = true
                    // The work holds the parent itself: `settledParent` stays with
                    // this thread's deferred half, which drops it (rare: an allocation
                    // more for the closure's captures, and one for its one-shot flag; on
                    // a context that might drop it, the watch lets go of the handler).
                    let once = RunOnce()
                    sendToContext({ [source] in if once.claim() { self.runContinuation(parent: source) } },
                                  ifDropped: { if once.claim() { self.continuation = nil } })
                }
                deferOnThisThread()
                return
            }
            // In flight after the parent settled: a later cancel must still reach us.
            enterFlight(parent: source)
            if source.carriesCancelForDescendants {
                settledParentOfContextChild = .owning(parent)
                deferOnThisThread()  // a cancel arrived while we linked: take the cancel path
            } else if parkSettledParentForContext(parent) {
                // The node's reference keeps this promise alive until `send` has returned:
                // the work may run, and drop its own reference, before that.
                sendHandlerToContext()
                retained.release()
            } else {
                retained.release()  // settled otherwise meanwhile: no work left for the context
            }
        case .following:
            let tag = source.publishedTag
            if claim(from: PC_CLAIM_FOLLOWING, to: UInt32(tag)) {
                // The parent if it is still alive: the handler that made us follow is done
                // and dropped its hold (a dead parent has nothing to pass down any more).
                fillClaimedOutcome(tag, copying: source, lookingAbove: parentIfAlive)
                _ = setTreeFlag(TreeFlag.adopted)  // before the publish; see `adoptedFromItsHandlersPromise`
                deferOnThisThread()  // publishes right after the current firing
            } else {
                retained.release()  // cancelled while following: nothing to adopt
            }
        case .idle:
            preconditionFailure("CPromiseCore fired an idle node")
        }
    }

    /// The deferred half of `sourceDidSettle`, on the same thread, after the firing that
    /// triggered it returned. The caller holds this promise with the reference its node
    /// carried; true if that reference went to an `.immediate` child (see
    /// `runContinuationTakingParent`), which then owns it.
    @usableFromInline
    final func runDeferred() -> Bool {
        switch role {
        case .continuation:
            // The common case first, without a strong copy of the parent (a retain and a
            // release) or building an optional error: no cancel to pass down.
            let held = runsHandlerInline ? settledParent : settledParentOfContextChild
            guard !held.isEmpty, let reason = held.parent._withUnsafeGuaranteedRef({ parent in
                parent.carriesCancelForDescendants ? parent.cancelReasonForDescendants : nil
            }) else {
                // A child on a context is deferred only to take its parent's cancel, whose
                // reason is stored before the flag that sent it here.
                assert(runsHandlerInline, "a child on a context deferred with no cancel to take")
                return runContinuationTakingParent(offeringReference: true)
            }
            // The hold on the parent is this thread's from here: ended when this returns,
            // after the handler's error side if it runs here.
            let hold = runsHandlerInline ? takeSettledParent() : takeSettledParentOnce()
            defer { hold.end() }
            return hold.parent._withUnsafeGuaranteedRef { parent in
                // Cancellation flows down at once, whatever context the handler runs on. A
                // cancelled parent still gives the handler its error side, for clean-up; a
                // settled parent whose cancel is being forwarded gives it nothing to run.
                cancel(reason: reason)
                if errorSideDispatched { return false }  // already on its context: do not touch it here
                guard runsHandlerInline, parent.isCancelled, continuation?.hasErrorSide == true else {
                    continuation = nil  // releases the handler unrun
                    return false
                }
                runContinuation(parent: parent)  // immediate: the error side inline
                return false
            }
        case .following:
            role = .idle
            publishClaimedOutcome()
            passOnClaimedCancel()
            return false
        case .idle:
            preconditionFailure("CPromiseCore deferred an idle node")
        }
    }

    /// A new child's registration on its parent, from its initialiser. An `.immediate`
    /// handler on a parent that has settled (not cancelled), with nothing firing on this
    /// thread, runs now, exactly as registering would run it (the core would fire the node
    /// at once and run its deferred half before `pc_observe` returns), without the node:
    /// no registration CAS, fire, deferral, nor the node's retain of the child. The
    /// caller of the continuation method holds the parent for the call, so the handler
    /// borrows it. A parent cancelled, or whose cancel is being passed down, takes the
    /// usual path (the registration runs at the end of the scope opened here, as inside
    /// any firing), whose deferred half cancels the child; a cancel forwarded after that
    /// look is found as on the usual path, by the child's claim (`cancelReasonFromAncestors`).
    @inline(__always)  // into the initialiser, as the registration was: no retain of `parent`
    final func observeAsContinuation(of parent: AnyPromise) {
        // `isPending` first: an inline load, where most parents are pending (a chain built
        // ahead), spares the call into the core.
        if runsHandlerInline, !parent.isPending, parent.beginInlineObservation() != nil {
            return runOnSettledParentInScope(parent)
        }
        observe(parent, as: .continuation)
    }

    /// `observeAsContinuation`'s inline run, in the scope `beginInlineObservation` opened.
    @inline(never)
    private final func runOnSettledParentInScope(_ parent: AnyPromise) {
        if parent.carriesCancelForDescendants {
            observeOutOfLine(parent)  // rare: keeps this frame small
        } else {
            role = .continuation
            settledParent = .borrowing(Unmanaged.passUnretained(parent))
            runContinuationTakingParent()
        }
        parent.endInlineObservation()
    }

    /// `observe(parent, as: .continuation)`, not inlined.
    @inline(never)
    private final func observeOutOfLine(_ parent: AnyPromise) {
        observe(parent, as: .continuation)
    }

    /// Runs the continuation with the parent that `settledParent` holds, then drops
    /// that hold: a settled child keeps nothing above it. Only for the thread the firing
    /// handed the child to (its context, or the settling thread's trampoline).
    ///
    /// Inside a cascade the parent is kept until the cascade ends only if the handler's
    /// publish fired `.immediate` children on this thread (the cascade watch): they run
    /// later in the cascade and may look up through it. (A borrowed parent needs no
    /// keeping: the call that opened the cascade holds it until the cascade ends.) A step
    /// that ends a branch (the last `then` of a `sequence` step) frees its parent, and the
    /// parent's value, at once; a queued child held its path itself when it went in flight.
    ///
    /// - Parameter offeringReference: true from the frame that runs this promise's deferred
    ///   node holding it with the node's reference: the first `.immediate` child this
    ///   publish fires takes that reference instead of retaining (`pc_cascade_watch_offering`).
    /// - Parameter once: true from work a context runs: the hold is taken atomically, so a
    ///   context that runs the work twice (a broken contract) runs the handler once.
    /// - Returns: whether a child took it (then the caller must not release it).
    @usableFromInline @discardableResult
    final func runContinuationTakingParent(offeringReference: Bool = false, once: Bool = false) -> Bool {
        let hold = once ? takeSettledParentOnce() : takeSettledParent()
        guard !hold.isEmpty else { return false }
        return runContinuation(holding: hold, offeringReference: offeringReference)
    }

    /// For work its context dropped unrun (`sendHandlerToContext`): if the handler would
    /// only pass its parent's outcome through, runs it now, on this thread, and answers
    /// true; else leaves everything as it was and answers false. Takes the parked hold
    /// first, as the work would, so that no settler touches the handler meanwhile, and
    /// puts it back to answer false: one that took nothing while it was out finds the
    /// hold parked again for the caller's `runContinuationTakingParent`.
    final func runContinuationIfItOnlyPassesThrough() -> Bool {
        let hold = takeSettledParentOnce()
        guard !hold.isEmpty else { return false }
        let tag = hold.parent._withUnsafeGuaranteedRef { $0.publishedTag }
        let passesThrough = claimHint == UInt(PC_CLAIM_FREE)
            && continuation?.runsUserCode(forParentOutcome: tag) == false
        guard passesThrough else {
            storeWord(settledParentWord, hold.word)
            return false
        }
        _ = runContinuation(holding: hold, offeringReference: false)
        return true
    }

    /// `runContinuationTakingParent` once the hold is taken.
    private final func runContinuation(holding hold: ParentHold, offeringReference: Bool) -> Bool {
        let previousWatch = offeringReference ? watchCascadeOfferingReference() : watchCascade()
        hold.parent._withUnsafeGuaranteedRef { runContinuation(parent: $0) }
        let (firedInlineChild, referenceTaken) = AnyPromise.endOfferingCascadeWatch(previousWatch)
        let handedOn = offeringReference && referenceTaken
        // A borrowed parent is held by the call that opened the scope, until the cascade ends.
        if firedInlineChild && !hold.isBorrowed && keepParentUntilCascadeEnds(hold.parent) { return handedOn }
        hold.end()  // may free the parent, and iteratively the chain above it
        return handedOn
    }

    /// Parks the hold on `parent` (one retain, the caller's) for the work this child is
    /// about to send to its context; false if the child was settled otherwise first
    /// (cancelled, or settled by its holder), which the work would find, running no
    /// handler: then the hold and the handler are let go here.
    ///
    /// The work takes the hold when it runs, maybe much later (a busy or suspended queue,
    /// the main queue of a program that never runs it). A child settled otherwise before
    /// then will never run its handler (a cancelled child's runs only to give a cancelled
    /// parent its error side, and this parent settled otherwise), so whoever settles it
    /// takes the hold and the handler at once (`dropHandlerParkedForContext`): the
    /// parent's value and the handler's captures do not wait for the context. (The work
    /// would have linked the child into the tree with its parent, which this thread's
    /// `enterFlight` did already.) A Dekker pairing decides who does, so that one of the
    /// two always sees the other: this thread stores the hold, fences and reads the claim;
    /// the settler claims (a full CAS) and then reads the hold. Of the settler, this check
    /// and the work, one takes it. A claim to follow another promise (`resolve(with:)`)
    /// leaves the hold to the work, which keeps the child in flight with it.
    final func parkSettledParentForContext(_ parent: Unmanaged<AnyPromise>) -> Bool {
        storeWord(settledParentWord, ParentHold.parked(parent).word)
        fullFence()
        let claimed = claimHint
        guard claimed != UInt(PC_CLAIM_FREE) && claimed != UInt(PC_CLAIM_FOLLOWING) else { return true }
        dropHandlerParkedForContext()
        return false
    }

    /// A settler's part of `parkSettledParentForContext`, called for every derived promise
    /// settled otherwise than by its handler, once published (`publishOutcomeFromHolder`:
    /// a cancel, its holder's `fulfill` or `reject`, a cancel turned from a claim, an
    /// outcome adopted from a promise it follows, a cycle's rejection): lets go of the
    /// parent and the handler if they are parked for a context (the handler unrun, with
    /// its captures, on this thread); nothing otherwise. An `.immediate` child parks
    /// nothing, and its word is its firing thread's alone: not even looked at.
    @usableFromInline
    final func dropHandlerParkedForContext() {
        guard !runsHandlerInline else { return }
        let hold = takeParkedSettledParent()
        guard !hold.isEmpty else { return }
        continuation = nil
        // Fired with the parent's error, settled otherwise before reading it: counts as
        // having read it, as a child that gave up before the error came does.
        hold.parent._withUnsafeGuaranteedRef { $0.noteErrorSeenIfRejected() }
        hold.end()  // may free the parent, and iteratively the chain above it
    }

    /// Runs the continuation once, unless this promise was settled by someone else first
    /// (then only a cancelled parent still gets the handler's error side). `parent` is
    /// held by the caller for the call.
    @usableFromInline
    final func runContinuation(parent: AnyPromise) {
        guard let handler = continuation.take() else { return }
        // `role` stays `.continuation` (the settling thread may still read it in
        // `runDeferred` while this runs on the context); `follow` moves it on.
        let parentCancelled = parent.publishedTag == UInt(PC_CANCELLED)
        let claimed = claimHint
        if parentCancelled || claimed == UInt(PC_CLAIM_FREE) {
            handler.run(parent, self)  // a claim it loses to a lock-in: `lostClaimToHandler`
        } else {
            parent.noteErrorSeenIfRejected()  // `handler` is released unrun: as read
            if claimed == UInt(PC_CLAIM_FOLLOWING) {
                stayInFlight(parent: parent)  // locked in before
            } else if claimed != UInt(PC_CANCELLED) {
                // Settled by its holder first: its descendants may be linking up on another
                // thread while the ancestors above are cancelled and let go, so it is linked
                // now, with its parent held here (see `linkIntoParentChain`).
                linkIntoParentChain(parent: parent)
            }
        }
    }
}
