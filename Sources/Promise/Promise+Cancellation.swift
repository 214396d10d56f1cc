import CPromiseCore

extension AnyPromise {
    /// Cancels the promise and every descendant that is still pending.
    ///
    /// A pending promise settles as `.cancelled` with a `CancellationError`. Cancellation
    /// then flows down, never up or sideways: children end cancelled with the same reason
    /// (their error handlers still run, for clean-up), and so does every pending
    /// descendant, also when this promise had already settled before the cancel (a child
    /// whose handler is still queued, or that follows a promise its handler returned).
    /// The parent and siblings are untouched. Handlers registered later on a cancelled
    /// promise yield cancelled children.
    ///
    /// Cancellation reaches the work a promise owns, while it is pending: its `onCancel`
    /// handlers, the Task of `Promise { try await ... }`, the promise a handler returned
    /// that the child follows, the pending inputs of a combinator's output, the step in
    /// flight of `sequence` and `retry`, the work in flight of `all(_:maxConcurrent:)`,
    /// and the timer of `after`, `delay` and `timeout`. Owned work whose outcome was
    /// decided first is left alone, its handlers included. A promise
    /// another thread is settling at that instant may still be handing out its children:
    /// those it has not reached yet take the cancel on that thread, before their handlers
    /// run.
    ///
    /// ```swift
    /// let image = download(url).then { decode($0) }
    /// image.cancel()            // `download` keeps going; `image` is cancelled
    /// image.root.cancel()       // the whole tree, from the top
    /// ```
    ///
    /// - Complexity: O(number of descendants still in flight), iteratively (no recursion).
    public final func cancel() {
        cancel(reason: CancellationError())
    }

    /// Cancels the promise and its pending descendants with `reason` as their error (see
    /// `cancel()`).
    ///
    /// ```swift
    /// struct UserAborted: Error {}
    /// upload.cancel(reason: UserAborted())
    /// upload.catch { print($0) }   // UserAborted()
    /// ```
    public final func cancel(reason: any Error) {
        cancelTree(reason: reason, asOwnedWork: false)
    }

    /// Cancels work a cancelled promise owns (the promise its handler returned, a
    /// combinator's pending input, a run's step in flight) if it is still pending, and
    /// what hangs below it. Work that settled before the cancel reached it (an input that
    /// fulfilled meanwhile) is left alone, with its descendants: its outcome was decided
    /// first, and its other consumers are no business of the canceller's (the cancel
    /// would flow sideways). A direct `cancel` of a settled promise still reaches its
    /// descendants in flight.
    @usableFromInline
    final func cancelOwnedWork(reason: any Error) {
        cancelTree(reason: reason, asOwnedWork: true)
    }

    /// The walk of `cancel(reason:)` and `cancelOwnedWork(reason:)`: iterative, each
    /// promise reached with the reason it takes and whether it is owned work.
    private final func cancelTree(reason: any Error, asOwnedWork: Bool) {
        var work: [CancelStep] = [CancelStep(promise: self, reason: reason, isOwnedWork: asOwnedWork)]
        while let step = work.popLast() {
            step.promise.cancelOne(reason: step.reason, isOwnedWork: step.isOwnedWork, into: &work)
        }
    }

    /// One promise a cancel must reach next.
    private struct CancelStep {
        let promise: AnyPromise
        let reason: any Error
        /// Reached as work a cancelled promise owns, not as a descendant: left alone if
        /// it settled first (see `cancelOwnedWork`).
        let isOwnedWork: Bool
    }

    /// Cancels this promise alone (if pending) and appends to `work` the descendants and
    /// owned work that the cancel must reach next, each with the reason it takes.
    private final func cancelOne(reason: any Error, isOwnedWork: Bool, into work: inout [CancelStep]) {
        if let from = settleFailureClaimingFrom(reason, as: PC_CANCELLED) {
            // The promise a handler returned is work we own: the cancel reaches it. (Its
            // link may not be recorded yet: `follow` then forwards the cancel itself.)
            if from == PC_CLAIM_FOLLOWING, let followee = followeeToCancel {
                work.append(CancelStep(promise: followee, reason: reason, isOwnedWork: true))
            }
            leavePendingSources(claimedFrom: from)
        } else if isOwnedWork && !isClaimedAsCancel {
            // Owned work that settled (or was claimed) otherwise first: its outcome stands,
            // and so do its descendants. Sound because this writes nothing: a descendant of
            // ours that the same promise also is (a sibling a handler returned, say) is
            // reached again through a registry or its ancestor look-up, as a descendant.
            return
        } else if isClaimedAsCancel && !isCancelled {
            // Another cancel claimed this promise and has not published yet. Every promise
            // claimed as cancelled walks its registry once published (its own `cancelOne`,
            // or `passOnClaimedCancel` after an adopted or turned claim), with its reason:
            // forwarding ours through it now would hand ours to some descendants.
            return
        } else if !isCancelled, setTreeFlag(TreeFlag.cancelClaimed) {
            // Settled otherwise: remember the reason for descendants still to come. The
            // epoch brackets the bit so that descendants in no registry (a handler already
            // running) see it when they claim (`cancelReasonFromAncestors`).
            ForwardingEpoch.begin()
            rareState.forwardedCancelReason = reason
            _ = setTreeFlag(TreeFlag.cancelPublished)
            ForwardingEpoch.end()
        } else if !carriesCancelForDescendants {
            // Another cancel won the forwarding and has not published its reason yet: it
            // walks the registry once it has, and every descendant takes its reason.
            // Walking here would hand ours to some of them.
            return
        }
        // A combinator's output owns its inputs' work: the cancel reaches those still
        // pending, however the output ended cancelled (its own claim above, or a cancel it
        // adopted, passed on by `passOnClaimedCancel`). Then the aggregator lets go of
        // what it kept. A second cancel finds the inputs cancelled already.
        if isRoot, publishedTag == UInt(PC_CANCELLED), let aggregator = aggregatorIfAlive {
            // With the output's own reason: a canceller whose claim lost passes that on.
            var inputs: [AnyPromise] = []
            aggregator.appendPendingInputs(to: &inputs)
            if !inputs.isEmpty {
                let ownReason = failureOrCancellation
                work += inputs.map { CancelStep(promise: $0, reason: ownReason, isOwnedWork: true) }
            }
            aggregator.retireIfIdle()
        }
        // Walked whatever the claim above did: a child that left this promise's list while
        // it was pending (`leavePendingParent`) is reached only here, also when this
        // promise's own claim took a cancel first (the spin model's
        // -DBROKEN_CARRIER_SKIPS_REGISTRY).
        // With the reason this promise passes down: that of the first cancel, when two
        // race (the claim or the forwarded reason elects it).
        var passedOn: (any Error)? = nil
        forEachLinkedChild(reapplyingCancel: false) { child in
            if passedOn == nil { passedOn = cancelReasonForDescendants ?? reason }
            work.append(CancelStep(promise: child, reason: passedOn.unsafelyUnwrapped, isOwnedWork: false))
        }
    }

    /// A cancelled promise waits for nothing any more: its registrations on promises
    /// still pending leave them (amortised: `observerGaveUp` prunes once enough have
    /// given up), so a long-lived promise whose children are cancelled one by one keeps a
    /// bounded number of them, with their handlers' captures, until the prune that takes
    /// them off (every so many give-ups: at least `RareState.minimumGaveUpBeforePrune`,
    /// or as many as the last prune kept). Those are its own
    /// node on its parent (a child whose handler has not run), and the registration on a
    /// promise it follows without owning it (`resolve(with:)`; one a handler returned is
    /// cancelled with it, which settles it). A child whose handler has an error side stays:
    /// a cancel of its parent still runs that side, for clean-up (`runContinuation`).
    ///
    /// Each is first looked at through its held memory, with no retain: in the cancel of a
    /// tree, every descendant's parent has just settled.
    private final func leavePendingSources(claimedFrom from: UInt32) {
        if let parent = parentAddress { AnyPromise.observerGaveUp(onPromiseAt: parent) }
        if from == PC_CLAIM_FOLLOWING, followeeToCancel == nil, let followee = followeeAddress {
            AnyPromise.observerGaveUp(onPromiseAt: followee)
        }
    }

    /// `observerGaveUp` on the promise at `address`, whose memory the caller holds: only
    /// if it is pending (one load, no retain) and still alive.
    private static func observerGaveUp(onPromiseAt address: UnsafeMutableRawPointer) {
        guard HeldMemory.isPendingPromise(at: address), let promise = HeldMemory.promiseIfAlive(at: address) else { return }
        promise.observerGaveUp()
    }

    /// Whether this promise's own node, while registered on a pending promise, waits for
    /// nothing (`observerHasGivenUp`): it was cancelled, or settled otherwise before its
    /// parent and linked itself up (`leavePendingParent`), so it takes no outcome from the
    /// parent, and its handler (if it has not run) has no error side that a cancel of its
    /// parent would still run. Read by a pruner holding that promise's stack, so it is
    /// ordered after the node's registration: `continuation` is the handler the
    /// initialiser stored (on a parent's list), or already taken before the node went on
    /// to a followee's.
    final var waitsForNothing: Bool {
        takesNoOutcome && continuation?.hasErrorSide != true
    }

    /// Whether this promise's own node takes no outcome from the promise it is registered
    /// on: it was cancelled, or settled otherwise before its parent (only once its link
    /// walk is done, `leavePendingParent`). Its handler's error side, if any, then waits
    /// only for a cancel of the parent (see `waitsForNothing`).
    final var takesNoOutcome: Bool {
        claimHint == UInt(PC_CANCELLED) || treeFlags & TreeFlag.leftParent != 0
    }

    /// A derived promise settled early, by its holder or by the promise `resolve(with:)`
    /// made it follow, while its parent is still pending: its own node on the parent waits
    /// for nothing any more, unless its handler has an error side, which a cancel of the
    /// parent still runs, for clean-up (the prune keeps such a node: `waitsForNothing`).
    /// So it links itself, and its pending parent, up the chain, as the parent's fire
    /// would have done (`runContinuation`): the way a later cancel of the parent or above
    /// reaches its descendants in flight. Only once that walk is done may its node leave
    /// (`TreeFlag.leftParent`, which `waitsForNothing` reads): a walk that pauses before
    /// it reaches an ancestor may find it cancelled and gone when it resumes, and then the
    /// parent's fire, which links the parent up while its own parent is held, is what
    /// still reaches the ancestor (argued in Verification/README.md: the spin model has no
    /// descendant that links from another thread).
    /// Then it gives up on the parent, so that a long-lived parent keeps a bounded number
    /// of such children, and none of their handlers' captures. A cancel leaves through
    /// `leavePendingSources` instead: its descendants take the cancel, and need no link.
    ///
    /// - Parameter parent: this promise's parent, which the caller holds.
    @usableFromInline
    final func leavePendingParent(_ parent: AnyPromise) {
        // Only a child whose own node is on the parent's list (a `timeout` child's is not:
        // it waits in the parent's waiter list, which it leaves by itself). The parent's
        // state first: the role is written before the child is shared, and again only by
        // `follow`, on the thread whose handler ran, so after the parent settled, and while
        // that thread may still be linking: a settler that took the claim over from
        // FOLLOWING (a cycle's rejection from a combinator's input) read that claim, which
        // came after the parent's publish, so it sees the parent settled and reads no role.
        guard parent.isPending, role == .continuation, claimHint != UInt(PC_CANCELLED) else { return }
        linkIntoParentChain(parent: parent)
        _ = setTreeFlag(TreeFlag.leftParent)
        parent.observerGaveUp()
    }

    /// After the publish of an outcome adopted from another promise (a followee's, or a
    /// `timeout` child's receiver's), or of a claim turned into a cancel (a handler's child
    /// that found an ancestor cancelled): if it is a cancel, passes it on as `cancel`
    /// does, whose claim then fails and which walks the registry (`cancelOne`). That is
    /// where the children that left this promise's list while it was pending wait
    /// (`leavePendingParent`): the publish, which fires the list, does not reach them. So
    /// every promise claimed as cancelled walks its registry once published, and a cancel
    /// that meets the claim before the publish can leave the walk to it.
    ///
    /// It is a give-up too, as a cancel's own claim is (`leavePendingSources`): a child
    /// that follows a promise and takes on its cancel never takes an outcome from its
    /// parent, so it tells a parent still pending that an observer gave up. (A `timeout`
    /// child's node is not on its parent's list: there the give-up only brings the
    /// parent's next prune forward.)
    @usableFromInline
    final func passOnClaimedCancel() {
        guard publishedTag == UInt(PC_CANCELLED) else { return }
        if let parent = parentAddress { AnyPromise.observerGaveUp(onPromiseAt: parent) }
        cancel(reason: failureOrCancellation)
    }

    /// `leavePendingParent` for a caller that does not hold the parent: only if the
    /// parent is pending (one load through its held memory, no retain) and alive.
    @usableFromInline @inline(never)
    final func leaveParentIfPending() {
        // The parent's state before the role, as `leavePendingParent` says why.
        guard let address = parentAddress, HeldMemory.isPendingPromise(at: address),
              role == .continuation, claimHint != UInt(PC_CANCELLED),
              let parent = HeldMemory.promiseIfAlive(at: address)
        else { return }
        leavePendingParent(parent)
    }

    /// The reason descendants must be cancelled with: this promise's own if it is
    /// cancelled, or that of a cancel forwarded through it after it settled; nil if none.
    final var cancelReasonForDescendants: (any Error)? {
        if publishedTag == UInt(PC_CANCELLED) { return failureOrCancellation }
        guard treeFlags & TreeFlag.cancelPublished != 0 else { return nil }
        return existingRareState?.forwardedCancelReason
    }

    /// Called by a handler's child right after it claimed an outcome (or locked in to
    /// follow a promise): the reason of a cancel that reached one of its ancestors before
    /// that claim, which must then win over the handler's result; nil if there is none.
    ///
    /// Why it is needed: a cancel of a settled promise finds the descendants still in
    /// flight through the registry, but a child whose `.immediate` handler is running is
    /// in none (linking it would cost four atomic read-modify-writes on the hottest path),
    /// and neither are its settled, unlinked ancestors between it and the cancelled
    /// promise. So the child looks up instead. Dekker-style: the canceller sets
    /// PUBLISHED, then its registry walk; the child claims, then reads. Either the
    /// child's claim comes first (its outcome stands: it had settled before the cancel)
    /// or it sees the bit.
    ///
    /// Cost: one look at the parent when no cancel of a settled promise ran anywhere since
    /// the parent checked (the forwarding epoch it recorded is still current); otherwise a
    /// walk up to the first ancestor that verified the current epoch, or the root. The
    /// walk passes pending ancestors: one may be a step whose own `.immediate` handler has
    /// not run yet (it takes the cancel when it claims), while this child sits below a
    /// promise its holder settled early and claims first.
    ///
    /// `recording: false` only looks (for a promise that may be adopting an outcome on
    /// another thread meanwhile, which records for itself).
    ///
    /// `parent` is borrowed from the caller, which holds it (not an optional: binding one
    /// would make an owned copy, a retain and a release on every handler's claim).
    ///
    /// Inlinable: the common case (a quiet epoch, no cancel on the parent, which verified
    /// this epoch or has no ancestors) is a few loads inline in the handler's claim
    /// (`fulfillFromHandler`, specialised in the caller); the rest is
    /// `cancelReasonFromAncestors(parent:recording:epoch:)`.
    @inlinable @inline(__always)
    final func cancelReasonFromAncestors(parent: AnyPromise, recording: Bool = true) -> (any Error)? {
        // After the claim CAS. A value from before a concurrent forward began lets the
        // claim win that cancel, as if it came first (see `pc_forwarding_epoch`).
        let epoch = pc_forwarding_epoch()
        if pc_forwarding_is_quiet(epoch) && !parent.carriesCancelForDescendants {
            let vouched = parent.verifiedEpoch
            if vouched == epoch || vouched == AncestorCheck.noAncestors {
                if recording { verifiedEpoch = epoch }
                return nil
            }
        }
        return cancelReasonFromAncestors(parent: parent, recording: recording, epoch: epoch)
    }

    /// `cancelReasonFromAncestors(parent:recording:)` past its common case, with the
    /// epoch it read.
    @usableFromInline @inline(never)
    final func cancelReasonFromAncestors(parent: AnyPromise, recording: Bool, epoch: UInt) -> (any Error)? {
        let quiet = ForwardingEpoch.isQuiet(epoch)
        // The common case, without touching reference counts (the caller holds the
        // parent): no cancel on the parent, and it verified this epoch.
        let reason = !parent.carriesCancelForDescendants && AnyPromise.covers(parent, epoch: epoch, quiet: quiet)
            ? nil
            : AnyPromise.reasonAbove(startingAt: parent, epoch: epoch, quiet: quiet)
        if reason == nil && recording { verifiedEpoch = quiet ? epoch : AncestorCheck.unverified }
        return reason
    }

    /// Whether `promise` vouches for every ancestor above it at `epoch`.
    @inline(__always)
    private static func covers(_ promise: AnyPromise, epoch: UInt, quiet: Bool) -> Bool {
        promise.verifiedEpoch == AncestorCheck.noAncestors || (quiet && promise.verifiedEpoch == epoch)
    }

    /// The first reason found walking up from `start` until an ancestor vouches for those
    /// above it (a separate function: its strong references stay off the common path).
    @inline(never)
    private static func reasonAbove(startingAt start: AnyPromise, epoch: UInt, quiet: Bool) -> (any Error)? {
        var ancestor = start
        while true {
            if let reason = ancestor.cancelReasonForDescendants { return reason }
            // A pending ancestor's record is not published yet (its claim writes it, on
            // its own thread, before the publish whose acquire makes it readable here).
            if !ancestor.isPending && covers(ancestor, epoch: epoch, quiet: quiet) { return nil }
            // An ancestor that died has nobody left to cancel it, and passes nothing down.
            guard let up = ancestor.parentIfAlive else { return nil }
            ancestor = up
        }
    }

    /// Whether `cancelReasonForDescendants` is non-nil, without building the error.
    @inlinable
    final var carriesCancelForDescendants: Bool {
        publishedTag == UInt(PC_CANCELLED) || treeFlags & TreeFlag.cancelPublished != 0
    }

    /// Registers `body` to run once if and when this promise is cancelled: the resolver
    /// side's hook to stop the work behind it (RXPromise's pattern). Runs at once if the
    /// promise is already cancelled (called inside an `.immediate` handler or another
    /// `onCancel` body: right after that returns); never runs if it settles any other way.
    ///
    /// ```swift
    /// func download(_ url: URL) -> Promise<Data> {
    ///     let promise = Promise<Data>()
    ///     let task = session.dataTask(with: url) { data, _, error in
    ///         if let data { promise.fulfill(data) } else { promise.reject(error!) }
    ///     }
    ///     promise.onCancel { task.cancel() }   // cancelling the promise stops the download
    ///     task.resume()
    ///     return promise
    /// }
    /// ```
    ///
    /// Threading: `body` runs on the thread that cancels (inline, through the core's
    /// trampoline), so keep it short and non-blocking.
    public final func onCancel(_ body: @escaping @Sendable () -> Void) {
        CancelObserver { _ in body() }.register(on: self)
    }

    /// `onCancel` with the cancellation reason (for forwarding it to owned work).
    final func onCancel(withReason body: @escaping @Sendable (any Error) -> Void) {
        CancelObserver(body: body).register(on: self)
    }
}

/// Sentinels of `AnyPromise.verifiedEpoch`. Both have forwarding-in-progress bits set,
/// so neither equals an epoch read while no forward is in progress.
@usableFromInline
enum AncestorCheck {
    // Computed constants, not stored: code inlined into a client reads them as literals.
    @inlinable static var unverified: UInt { 1 }
    @inlinable static var noAncestors: UInt { .max }
}
