import CPromiseCore

// Settling: electing the one settler (the claim), storing the outcome and publishing it.
// The resolver side's public calls (`fulfill`, `reject`, `resolve`) are in Promise.swift;
// these are the shared steps and the variants a handler uses to settle its own child,
// where a cancel that reached an ancestor first wins over the handler's result.

extension AnyPromise {
    /// Claims the promise for `outcome` (from free, or taking over from following),
    /// stores `error` and publishes. False if it had been claimed already.
    @usableFromInline
    final func settleFailure(_ error: any Error, as outcome: UInt32) -> Bool {
        settleFailureClaimingFrom(error, as: outcome) != nil
    }

    /// The work that was to settle this promise (its handler, or `Promise(on:_:)`'s
    /// work) was let go of unrun by its context (`WatchedWork`): nothing else will settle
    /// it, so it rejects with `PromiseError.brokenPromise`, as its holder's `reject`
    /// would (losing to a settle or a cancel that came first), and the diagnostics hook
    /// hears of it once, as a broken promise whose work was dropped, not again as an
    /// unhandled rejection when it is freed.
    final func rejectAsWorkDropped() {
        guard settleFailure(PromiseError.brokenPromise, as: PC_REJECTED) else { return }
        PromiseDiagnostics.report(.brokenPromise, for: self, workDropped: true)
        noteErrorSeen()
    }

    /// For the deinit of the run that settles this output (`retry`, `sequence`,
    /// `all(_:maxConcurrent:)`): nothing can settle it any more, so it rejects with
    /// `PromiseError.brokenPromise` a moment later, on a lane of the library's own, as
    /// `WatchedWork` breaks: the run's last release may be a context's letting go of its
    /// work, inside the context's own call (under its lock).
    final func breakOnALaneIfPending() {
        guard isPending else { return }
        TimerHeap.shared.send { [self] in _ = settleFailure(PromiseError.brokenPromise, as: PC_REJECTED) }
    }

    /// `settleFailure`, telling which claim it took over: `PC_CLAIM_FREE`, or `PC_CLAIM_FOLLOWING` (a
    /// cancel of a follower, which must then reach the followee); nil if it lost.
    final func settleFailureClaimingFrom(_ error: any Error, as outcome: UInt32) -> UInt32? {
        // A cancelled promise's children take the cancel as it fires them, and none goes
        // in flight: only a rejection keeps the parent (`publishKeepingParent`).
        let parent = outcome == PC_CANCELLED ? nil : parentToKeepForSettle()
        let from: UInt32
        if claim(from: PC_CLAIM_FREE, to: outcome) {
            from = PC_CLAIM_FREE
            if outcome != PC_CANCELLED, !isRoot, let reason = cancelReasonAfterHolderClaim(keeping: parent) {
                publishHolderClaimAsCancel(from: outcome, reason: reason, keeping: parent)
                return nil  // an ancestor's cancel came first: the rejection lost to it
            }
        } else if outcome == PC_CANCELLED && claim(from: PC_CLAIM_FOLLOWING, to: PC_CANCELLED) {
            from = PC_CLAIM_FOLLOWING
            // Dekker with `follow`, which stores its followee link, fences, then reads the
            // claim: our claim is visible before our caller reads the link
            // (`followeeToCancel`), so one of us forwards the cancel to the followee. The
            // claim's CAS is no StoreLoad barrier (acq_rel on AArch64, `pc_promise.h`).
            fullFence()
        } else {
            parent?.release()
            return nil
        }
        if outcome == PC_REJECTED { storeRejection(error) } else { failure = error }
        publishOutcomeFromHolder(keeping: parent)
        return from
    }

    /// For whoever holds a derived promise and has just claimed an outcome for it
    /// (`fulfill`, `reject`, `resolve`, a `resolve(with:)` adoption): the reason of a
    /// cancel that reached one of its ancestors first, which then wins, as it does over a
    /// handler's result (`cancelReasonFromAncestors`); nil if there is none. Such a cancel
    /// may have found this promise in no registry and no list: a child whose `.immediate`
    /// handler waits in the firing batch of the thread settling its parent takes it only
    /// when that thread reaches it, and a resolver calling in between must not win.
    ///
    /// Cost: a handler looks up once its parent has settled, in O(1) in a quiet epoch;
    /// a holder's look passes every pending ancestor up to the first settled one (each
    /// may be in, or below, a batch waiting to run), so settling by hand the children of
    /// a long pending chain one by one costs the chain's length each, the length squared
    /// in all. Cutting the look short would let a resolver win over a cancel that came
    /// first below a deep enough chain.
    ///
    /// - Parameter parent: the parent `parentToKeepForSettle` retained, if any; without
    ///   it the parent is looked up (a root's child), and a dead one passes nothing down.
    @usableFromInline
    final func cancelReasonAfterHolderClaim(keeping parent: Unmanaged<AnyPromise>?) -> (any Error)? {
        // Not recording what it verified: the settle is not a handler's, which is what
        // descendants trust (`verifiedEpoch`).
        if let parent {
            return parent._withUnsafeGuaranteedRef { cancelReasonFromAncestors(parent: $0, recording: false) }
        }
        guard !isRoot, let parent = parentIfAlive else { return nil }
        return cancelReasonFromAncestors(parent: parent, recording: false)
    }

    /// Publishes the outcome a holder claimed as `from` as a cancel with `reason` instead
    /// (`cancelReasonAfterHolderClaim` found one), and passes the cancel on.
    @usableFromInline
    final func publishHolderClaimAsCancel(from claimed: UInt32, reason: any Error, keeping parent: Unmanaged<AnyPromise>?) {
        turnClaimIntoCancel(from: claimed, reason: reason)
        publishOutcomeFromHolder(keeping: parent)
        passOnClaimedCancel()
    }

    /// Whether nobody has settled this promise or locked it in to follow another yet (the
    /// claim word, a relaxed load: a hint, for runs deciding whether to go on).
    final var isFreeToSettle: Bool { claimHint == UInt(PC_CLAIM_FREE) }

    /// Whether a cancel has claimed this promise (published or about to be).
    final var isClaimedAsCancel: Bool { claimHint == UInt(PC_CANCELLED) }

    /// `reject` for a handler settling its child (see `fulfillFromHandler`). Returns
    /// whether the child ended rejected with `error` (not settled otherwise first, nor
    /// cancelled by an ancestor's cancel).
    @usableFromInline @discardableResult
    final func rejectFromHandler(_ error: any Error, parent: AnyPromise) -> Bool {
        guard claim(from: PC_CLAIM_FREE, to: PC_REJECTED) else {
            lostClaimToHandler(parent: parent)
            return false
        }
        var stored = false
        if let reason = cancelReasonFromAncestors(parent: parent) {
            turnClaimIntoCancel(from: PC_REJECTED, reason: reason)
        } else {
            storeRejection(error)
            stored = true
        }
        publishClaimedOutcome()
        if !stored { passOnClaimedCancel() }
        return stored
    }

    /// A handler's claim on its own child failed: locked in by `resolve(with:)` while the
    /// handler ran, which leaves the child in flight; or settled by its holder meanwhile,
    /// which links it up (as `runContinuation` does); or cancelled, which needs nothing more.
    @usableFromInline
    final func lostClaimToHandler(parent: AnyPromise) {
        let claimed = claimHint
        if claimed == UInt(PC_CLAIM_FOLLOWING) {
            stayInFlight(parent: parent)
        } else if claimed != UInt(PC_CANCELLED) {
            linkIntoParentChain(parent: parent)
        }
    }

    /// Fills in the outcome this thread just claimed as `tag` by adopting `source`'s (a
    /// followed promise, or a timeout child's receiver): its value or error is copied,
    /// unless a cancel reached `parent` or an ancestor first, which then wins as for a
    /// handler's child. Nil `parent`: nothing above to look at (it is gone, or `source` is
    /// a broken stand-in). The caller publishes.
    final func fillClaimedOutcome(_ tag: UInt, copying source: AnyPromise, lookingAbove parent: AnyPromise?) {
        if tag != UInt(PC_CANCELLED), let parent, let reason = cancelReasonFromAncestors(parent: parent) {
            turnClaimIntoCancel(from: UInt32(tag), reason: reason)
        } else {
            copyOutcome(from: source, tag: tag)
        }
    }

    /// Turns the outcome this thread claimed (not yet published) into a cancel with
    /// `reason`. Nobody else moves a claimed outcome, so the CAS cannot fail. The caller
    /// passes the cancel on after its publish (`passOnClaimedCancel`), as every promise
    /// claimed as cancelled does: a cancel that finds the claim before the publish leaves
    /// the registry walk to it (`cancelOne`).
    @usableFromInline
    final func turnClaimIntoCancel(from claimed: UInt32, reason: any Error) {
        let moved = claim(from: claimed, to: PC_CANCELLED)
        precondition(moved, "a claimed outcome changed under its owner")
        failure = reason
    }
}

extension Promise {
    /// Settles with what `body` returns or throws, if the promise is still free.
    @inlinable
    func settle(_ body: () throws -> Value) {
        do {
            fulfill(try body())
        } catch {
            reject(error)
        }
    }

    /// `fulfill` for a handler settling the child it belongs to: once the outcome is
    /// claimed, a cancel that reached an ancestor first wins over it (see
    /// `cancelReasonFromAncestors`), so a handler that was already running when the tree
    /// was cancelled leaves its child cancelled, not fulfilled.
    @inlinable
    func fulfillFromHandler(_ value: Value, parent: AnyPromise) {
        guard claim(from: PC_CLAIM_FREE, to: PC_FULFILLED) else { return lostClaimToHandler(parent: parent) }
        if let reason = cancelReasonFromAncestors(parent: parent) {
            turnClaimIntoCancel(from: PC_FULFILLED, reason: reason)
            publishClaimedOutcome()
            passOnClaimedCancel()
            return
        }
        storeValue(value)
        publishClaimedOutcome()
    }

    /// `settle` for a handler settling its child (see `fulfillFromHandler`).
    @inlinable
    func settleFromHandler(parent: AnyPromise, _ body: () throws -> Value) {
        do {
            fulfillFromHandler(try body(), parent: parent)
        } catch {
            rejectFromHandler(error, parent: parent)
        }
    }
}
