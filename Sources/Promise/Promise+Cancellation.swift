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
    /// Cancellation reaches the work a promise owns: its `onCancel` handlers, the Task of
    /// `Promise { try await ... }`, and the promise a handler returned that the child
    /// follows.
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
        var work: [AnyPromise] = [self]
        while let promise = work.popLast() {
            promise.cancelOne(reason: reason, into: &work)
        }
    }

    /// Cancels this promise alone (if pending) and appends to `work` the descendants and
    /// owned work that the cancel must reach next.
    private final func cancelOne(reason: any Error, into work: inout [AnyPromise]) {
        let wasFollowing = claimHint == UInt(PC_FOLLOWING)
        if settleFailure(reason, as: PC_CANCELLED) {
            // Winning FOLLOWING -> CANCELLED makes us the one reader of the followee link.
            if wasFollowing, let followee = UnownedLink.load(followeeWord) { work.append(followee) }
        } else if !isCancelled, pc_family_set(corePointer, UInt(PC_FAMILY_CANCEL_CLAIMED)) {
            // Settled otherwise: remember the reason for descendants still to come. The
            // epoch brackets the bit so that descendants in no registry (a handler already
            // running) see it when they claim (`cancelReasonFromAncestors`).
            pc_forwarding_begin()
            forwardedCancelReason = reason
            _ = pc_family_set(corePointer, UInt(PC_FAMILY_CANCEL_PUBLISHED))
            pc_forwarding_end()
        }
        forEachLinkedChild(reapplyingCancel: false) { work.append($0) }
    }

    /// The reason descendants must be cancelled with: this promise's own if it is
    /// cancelled, or that of a cancel forwarded through it after it settled; nil if none.
    final var cancelReasonForDescendants: (any Error)? {
        if publishedTag == UInt(PC_CANCELLED) { return failure ?? CancellationError() }
        guard pc_family(corePointer) & UInt(PC_FAMILY_CANCEL_PUBLISHED) != 0 else { return nil }
        return forwardedCancelReason
    }

    /// Called by a handler's child right after it claimed an outcome (or locked in to
    /// follow a promise): the reason of a cancel that reached one of its ancestors before
    /// that claim, which must then win over the handler's result; nil if there is none.
    ///
    /// Why it is needed: a cancel of a settled promise finds the descendants still in
    /// flight through the registry, but a child whose `.immediate` handler is running is
    /// in none (linking it would cost an allocation on the hottest path), and neither are
    /// its settled, unlinked ancestors between it and the cancelled promise. So the child
    /// looks up instead. Dekker-style: the canceller sets PUBLISHED, then its registry
    /// walk; the child claims, then reads. Either the child's claim comes first (its
    /// outcome stands: it had settled before the cancel) or it sees the bit.
    ///
    /// Cost: one look at the parent when no cancel of a settled promise ran anywhere since
    /// the parent checked (the forwarding epoch it recorded is still current); otherwise a
    /// walk up to the first ancestor that verified the current epoch, the root, or a
    /// pending ancestor (whose own cancel still reaches its children by firing them).
    ///
    /// `recording: false` only looks (for a promise that may be adopting an outcome on
    /// another thread meanwhile, which records for itself).
    @usableFromInline
    final func cancelReasonFromAncestors(recording: Bool = true) -> (any Error)? {
        guard let parentRetain = settledParentRetain else { return nil }  // a root, or settled from outside
        // After the claim CAS (a full barrier), so the load cannot move above it.
        let epoch = UInt(pc_forwarding_epoch())
        let quiet = epoch & UInt(PC_FORWARDING_ACTIVE_MASK) == 0
        // Whether `promise` vouches for every ancestor above it at this epoch.
        @inline(__always) func coversAbove(_ promise: AnyPromise) -> Bool {
            promise.verifiedEpoch == AncestorCheck.noAncestors || (quiet && promise.verifiedEpoch == epoch)
        }
        // The first ancestor's reason, walking up until one vouches for those above it.
        @inline(__always) func reasonAbove() -> (any Error)? {
            // The common case, without touching reference counts (the parent is held by
            // `settledParentRetain`): no cancel on the parent, and it verified this epoch.
            if parentRetain._withUnsafeGuaranteedRef({ !$0.carriesCancelForDescendants && coversAbove($0) }) {
                return nil
            }
            var ancestor = parentRetain.takeUnretainedValue()
            while true {
                if let reason = ancestor.cancelReasonForDescendants { return reason }
                if coversAbove(ancestor) { return nil }
                // `parentIfAlive`, not `settledParent`: an ancestor settled from outside may
                // still be getting its settled parent stored by another thread.
                guard let up = ancestor.parentIfAlive, !up.isPending else { return nil }
                ancestor = up
            }
        }
        let reason = reasonAbove()
        if reason == nil && recording { verifiedEpoch = quiet ? epoch : AncestorCheck.unverified }
        return reason
    }

    /// Whether `cancelReasonForDescendants` is non-nil, without building the error.
    @inlinable
    final var carriesCancelForDescendants: Bool {
        publishedTag == UInt(PC_CANCELLED) || pc_family(corePointer) & UInt(PC_FAMILY_CANCEL_PUBLISHED) != 0
    }

    /// `reject` for a handler settling its child (see `fulfillFromHandler`).
    @usableFromInline
    final func rejectFromHandler(_ error: any Error) {
        guard claim(from: PC_FREE, to: PC_REJECTED) else { return }
        if let reason = cancelReasonFromAncestors() {
            turnClaimIntoCancel(from: PC_REJECTED, reason: reason)
        } else {
            failure = error
        }
        publishClaimedOutcome()
    }

    /// Turns the outcome this thread claimed (not yet published) into a cancel with
    /// `reason`. Nobody else moves a claimed outcome, so the CAS cannot fail.
    @usableFromInline
    final func turnClaimIntoCancel(from claimed: UInt32, reason: any Error) {
        let moved = claim(from: claimed, to: PC_CANCELLED)
        precondition(moved, "a claimed outcome changed under its owner")
        failure = reason
    }

    /// Registers `body` to run once if and when this promise is cancelled: the resolver
    /// side's hook to stop the work behind it (RXPromise's pattern). Runs at once if the
    /// promise is already cancelled; never runs if it settles any other way.
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
    @usableFromInline static let unverified: UInt = 1
    @usableFromInline static let noAncestors: UInt = .max
}

// MARK: The registry of descendants in flight

/// A link from a promise to a descendant that is in flight after the promise settled, in
/// the promise's cancellation registry. It must not keep the descendant alive (the registry
/// would keep settled subtrees alive), so the descendant is an unowned link (see
/// `UnownedLink`) that the descendant clears in its deinit, before its memory goes; the
/// descendant holds the link for that (`registryLink`). Links whose word is 0 are dead and
/// pruned as the registry grows.
final class ChildLink {
    struct Words {
        var node = pc_node()  // first: the registry's intrusive link (see `linkNode`)
        var child: UInt       // the descendant, unowned
    }

    final var words: Words  // first stored property: the node sits right after the header

    init(_ child: AnyPromise) {
        words = Words(child: UnownedLink.address(of: child))
    }

    /// The locked word holding the descendant.
    final var childWord: UnsafeMutablePointer<UInt> {
        (_getUnsafePointerToStoredProperties(self) + MemoryLayout<Words>.offset(of: \Words.child)!)
            .assumingMemoryBound(to: UInt.self)
    }
}

extension AnyPromise {
    /// Links this promise into its parent's registry, and the parent into its own, up to
    /// the first ancestor that is linked already (each link is made once).
    ///
    /// - Parameter parent: this promise's parent, which the caller holds (the thread that
    ///   fired this promise, or its continuation), so reading it needs no lock.
    final func linkIntoParentChain(parent: AnyPromise?) {
        var promise: AnyPromise = self
        var next = parent
        while let up = next, pc_family_set(promise.corePointer, UInt(PC_FAMILY_LINKED)) {
            let link = ChildLink(promise)
            // Setting LINKED made this thread the only writer: the promise's own reference
            // to its link, which its deinit uses to clear the link's word, then drops.
            promise.registryLink = Unmanaged.passRetained(link)
            up.addChildLink(link)
            if let reason = up.cancelReasonForDescendants {
                // The parent's cancel may have missed this fresh link: apply it here.
                promise.cancel(reason: reason)
            }
            promise = up
            // An ancestor that is linked already ends the walk: skip reading its parent
            // (a locked read), which pc_family_set would then refuse anyway.
            next = pc_family(up.corePointer) & UInt(PC_FAMILY_LINKED) != 0 ? nil : up.parentIfAlive
        }
    }

    private final func addChildLink(_ link: ChildLink) {
        let count = pc_children_push(corePointer, linkNode(Unmanaged.passRetained(link)))
        if count >= 32, count & (count - 1) == 0 {
            forEachLinkedChild(reapplyingCancel: true) { _ in }  // prune dead links, amortised O(1)
        }
    }

    /// Takes the registry, calls `body` for each live child, puts back the links to live
    /// children and drops dead ones. With `reapplyingCancel`, a cancel published while
    /// the links were out of the registry (so its own walk found nothing) is applied to
    /// them here; a canceller's own walk passes false, having queued them already.
    final func forEachLinkedChild(reapplyingCancel: Bool, _ body: (AnyPromise) -> Void) {
        var node = pc_children_take(corePointer)
        guard node != nil else { return }
        var taken: UInt = 0
        var kept: [Unmanaged<ChildLink>] = []
        // The live children, held, for the re-applied cancel: once the links are back in
        // the registry another thread may prune (free) them, so they are not read again.
        var live: [AnyPromise] = []
        while let current = node {
            node = current.pointee.next
            taken += 1
            let link = CoreLayout.owner(ofFirstField: current, as: ChildLink.self)
            // We own the registry's retain of the link until we push it back.
            if let child = UnownedLink.load(link.takeUnretainedValue().childWord) {
                body(child)
                kept.append(link)
                if reapplyingCancel { live.append(child) }
                continue
            }
            link.release()  // its child died (and cleared the word): prune
        }
        for link in kept.reversed() {
            _ = pc_children_push(corePointer, linkNode(link))
        }
        pc_children_forget(corePointer, taken)
        if reapplyingCancel, !live.isEmpty, let reason = cancelReasonForDescendants {
            for child in live { child.cancel(reason: reason) }
        }
    }

    /// The deinit's half of a registry link: no thread may reach this dying promise through
    /// its parent's registry any more; then drop our reference to the link.
    final func releaseRegistryLink() {
        guard let link = registryLink else { return }
        registryLink = nil
        UnownedLink.clear(link.takeUnretainedValue().childWord, ifPointingAt: UnownedLink.address(of: self))
        link.release()
    }

    /// Releases the registry's links (deinit only).
    final func releaseChildLinks() {
        var node = pc_children_take(corePointer)
        while let current = node {
            node = current.pointee.next
            CoreLayout.owner(ofFirstField: current, as: ChildLink.self).release()
        }
    }

    private final func linkNode(_ link: Unmanaged<ChildLink>) -> UnsafeMutablePointer<pc_node> {
        (UnsafeMutableRawPointer(link.toOpaque()) + CoreLayout.headerSize).assumingMemoryBound(to: pc_node.self)
    }
}
