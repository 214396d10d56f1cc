import CPromiseCore

// The lifetime model: how a cancel reaches a descendant that is still pending below a
// promise that has settled, and what keeps the promises on its way there. The table of
// who keeps whom, from when until when, is in the threading article ("The lifetime model:
// who keeps whom"); this file is its code.
//
// - A child the parent fired holds the parent (`settledParent`, Firing.swift) until
//   its handler is done with the parent's outcome, or, while the handler waits on its
//   context, until the child is settled otherwise (a cancel, its holder), which means the
//   handler will not run (`parkSettledParentForContext`).
// - A promise *in flight* (pending below a settled parent, with work still to come: a
//   handler queued on a context, a promise it follows, a hand-off, a lock-in) enters
//   flight once (`enterFlight`): it links itself into its parent's registry, so that a
//   cancel forwarded through the settled parent finds it, and holds its path alive (the
//   `holds` words) until it settles or dies.
// - A child whose `.immediate` handler is running is in no registry: it looks up when it
//   claims (`cancelReasonFromAncestors`, Promise+Cancellation.swift). So that it finds
//   every live ancestor, the cascade keeps what the path needs until it ends: a step whose
//   publish fired `.immediate` children keeps its parent, a root too
//   (`keepParentUntilCascadeEnds`; a parent it borrows is kept by the call that opened
//   the cascade, until it ends), and a promise in flight whose publish did keeps its
//   holds (`publishLeavingFlight`, CoreBridge.swift). A kept step that nothing else
//   reaches is retired once its child ran (or, for a child following the promise its
//   handler returned, adopted): its value is freed then, not at the cascade's end
//   (`retireIfOnlyTheCascadeKeepsIt`).
// - A side branch settled early (by its holder, or by the promise `resolve(with:)` made it
//   follow) keeps its parent from before its claim through its cascade
//   (`publishKeepingParent`, CoreBridge.swift), and its parent, firing it, links it up
//   (`linkIntoParentChain`, which links the parent even when the child is linked): no
//   handler holds that path, and its descendants may be linking up on another thread
//   while the ancestors above are cancelled and let go. Below a parent still pending it
//   links itself up at once and then leaves the parent's list (`leavePendingParent`),
//   after which the parent's fire does not see it: a cancel reaches it through the
//   parent's registry, which `cancelOne` walks even when it finds the parent cancelled
//   already, and a parent that adopts a cancel from a promise it followed passes on
//   (`passOnClaimedCancel`).

extension AnyPromise {
    /// In a cascade of handlers run inline by one settling call (`.immediate` children
    /// settling their own children), keeps this promise's hold on its parent until the
    /// cascade is over (`keepUntilCascadeEnds`), then drops it, newest first. So while any
    /// handler of the cascade runs, every promise above it that the cascade went through
    /// is alive, and a cancel of an ancestor that someone holds still finds that handler's
    /// child (through `cancelReasonFromAncestors`, or through the registries of a child
    /// that went in flight: `holdPathWhileInFlight` holds only what is alive). False,
    /// doing nothing, outside a cascade (a handler run by its context), or when this
    /// promise's node went on to follow a promise (the follow holds the path itself).
    ///
    /// A root parent is kept too: code running inside the cascade (an observer of this
    /// promise, say) may cancel the root and let it go before the next step looks up, and
    /// a root settled inside an outer scope is not held by its settling call while its
    /// cascade runs. In a chain that is one step: the first.
    ///
    /// Cost: a thread-local store per inline handler, and the release at the end; the
    /// cascade's promises, which were alive before it started, are freed when it ends
    /// rather than one by one.
    final func keepParentUntilCascadeEnds(_ parentRetain: Unmanaged<AnyPromise>) -> Bool {
        // Acquire: `resolve(with:)` on another thread may record a followee meanwhile.
        // (A handler's child is a derived promise: its word is in its lineage.)
        guard lineageFolloweeWordValue == 0 else { return false }
        // The common case (an `Int`, say) as before: nothing to free, one load.
        guard parentRetain._withUnsafeGuaranteedRef({ $0.outcomeFreeableEarly }) else {
            return keepUntilCascadeEnds(parentRetain, then: releaseKeptPromise)
        }
        return AnyPromise.keepAndRetireIfOnlyTheCascadeKeepsIt(parentRetain)
    }

    /// `keepParentUntilCascadeEnds` for a parent whose value or error needs freeing.
    @inline(never)
    private static func keepAndRetireIfOnlyTheCascadeKeepsIt(_ parentRetain: Unmanaged<AnyPromise>) -> Bool {
        // Before our keep goes on top: whether the parent left flight inside this cascade
        // and keeps itself until it ends (a follower whose publish fired this child). The
        // parent is borrowed, never copied: a copy is a reference the counts would see.
        let parentKeepsItself = parentRetain._withUnsafeGuaranteedRef { cascadeKeepsLast($0, then: dropKeptSelfHold) }
        guard keepUntilCascadeEnds(parentRetain, then: releaseKeptPromise) else { return false }
        parentRetain._withUnsafeGuaranteedRef { parent in
            // Its keep holds it until the cascade ends, but its own hold on its path only
            // if no other thread may drop that hold meanwhile (`adoptedFromItsHandlersPromise`).
            parent.retireIfOnlyTheCascadeKeepsIt(cascadeReferences: parentKeepsItself ? 2 : 1,
                                                 pathHeld: parentKeepsItself && parent.adoptedFromItsHandlersPromise)
        }
        return true
    }

    /// Whether this derived promise adopted the outcome of the promise its handler
    /// returned (`follow`; the followee link's `forwardsCancel`, which only `follow`
    /// records), on this thread, which published it: then it went in flight, its own hold
    /// taken, before it registered on that promise, so before the adoption, and no later
    /// call puts it in flight again. Only its keep's end (`dropKeptSelfHold`) drops that
    /// hold, and the path above it stays held until then. Not so for a promise settled
    /// otherwise: the thread putting it in flight drops the hold it took if it sees the
    /// promise settled meanwhile (`holdPathWhileInFlight`), at any time: a cancel, a
    /// holder's settle, or a cycle's rejection from the thread of a combinator's input,
    /// which may come while `follow` is still taking the hold. The adopting thread sets
    /// `TreeFlag.adopted` after its claim, before it publishes.
    final var adoptedFromItsHandlersPromise: Bool {
        lineageFolloweeWordValue & FolloweeLink.forwardsCancel != 0 && treeFlags & TreeFlag.adopted != 0
    }

    /// The same for a child that followed the promise its handler returned (`flatMap`)
    /// and has just adopted its outcome, inside a cascade, as it leaves flight
    /// (`leaveFlight`, before the cascade keeps it): its handler has run, so its parent's
    /// value is read by nobody the library knows of, and the parent is kept only by this
    /// child's hold on its path (and by its own keep, if it left flight in this cascade
    /// too). So a `flatMap` chain built before its root settled frees each step's value
    /// once the next step adopted, as a `then` chain does once the next step ran.
    ///
    /// The references counted must stay until the cascade ends, or a user's reference
    /// could take the place of one let go meanwhile. This child's hold does
    /// (`adoptedFromItsHandlersPromise`): only the cascade's end drops it. It holds the
    /// parent itself (not found dead: no `PC_HOLDS_GONE`), and keeps the parent's holds,
    /// so the parent's path, until then. The parent's own keep is counted only when it is
    /// this thread's newest keep (`cascadeKeepsLast`). A child settled by a cancel, or any
    /// other promise leaving flight, frees nothing here.
    final func freeParentValueOnceAdopted() {
        guard adoptedFromItsHandlersPromise else { return }
        let holds = holdsWord
        guard holds & UInt(PC_HOLDS_SELF) != 0, holds & UInt(PC_HOLDS_GONE) == 0,
              let parentAddress else { return }
        // Alive: this child's hold holds it.
        Unmanaged<AnyPromise>.fromOpaque(parentAddress)._withUnsafeGuaranteedRef { parent in
            guard parent.outcomeFreeableEarly else { return }
            let keepsItself = cascadeKeepsLast(parent, then: dropKeptSelfHold)
            parent.retireIfOnlyTheCascadeKeepsIt(cascadeReferences: keepsItself ? 2 : 1, pathHeld: true)
        }
    }

    /// Frees this settled promise's value now if the cascade's keep is all that holds it:
    /// its child has run, so nobody can read the value any more, and the cascade keeps the
    /// promise only for the look-ups that pass through it. So a chain built before its
    /// root settled keeps each step's value only until the next step ran, not until the
    /// cascade ends (the promises themselves, which the chain held before it settled, go
    /// when it ends).
    ///
    /// Who could still read the value: everything that reads a settled promise's value
    /// holds it (a child firing or queued, an observer deferred, a combinator's slot), or
    /// borrows it from a caller that does, except what reaches a promise through a link
    /// that does not hold it: `parent` and `debugDescription` (`parentIfReachable`, which
    /// treats a retired promise as gone, as it will be once the cascade ends, unless a
    /// descendant in flight holds it), the cancel walks and `root`'s walk (which read no
    /// value), and a user's `weak` or `unowned` reference, which does not go through the
    /// library. So the value is freed only when one snapshot of the reference counts
    /// (`SwiftRuntime.isOnlyReference`) shows nothing but the cascade's reference and the
    /// kept child's link up: no other child, follower, combinator slot or registry link
    /// (each holds the memory), no unowned reference, and no side table (so no weak
    /// reference, now or before). From then on only the library's own links can make a
    /// new reference. Dekker with `isRetiredSeenAfterTakingIt`: this sets
    /// `TreeFlag.retiring`, fences and takes a second snapshot; a reader takes its
    /// reference (a read-modify-write), fences and reads the flags. Either this sees the
    /// reader's reference, keeps the value and clears `retiring`, or the reader sees
    /// `retiring`, and waits for the decision, a few instructions: `retiring` turns into
    /// `retired` (final) in one step before the value goes, or goes. A reader that saw the
    /// flag before this second snapshot holds a reference the snapshot sees, so the
    /// decision it waits for keeps the value, and it answers the promise.
    ///
    /// A rejected step's error goes the same way (a chain of `then` and `recover` that
    /// throws and recovers at every step keeps one error at a time, not one per step). A
    /// cancelled step keeps its reason: a descendant looking up through it reads it
    /// (`cancelReasonForDescendants`), and every step below shares it anyway.
    ///
    /// The references the library holds, all kept until the cascade ends: the keeps
    /// (`cascadeReferences`: the child's keep of this promise, or the child's hold on its
    /// path, and this promise's own keep when it left flight in this cascade), and of its
    /// memory the link up of the child that ran, and, if this promise is linked into its
    /// parent's registry, that link (taken before the mark, so a linked promise has it
    /// while the parent lives). That parent lives on only where this promise's holds keep
    /// it until the cascade ends (`pathHeld`: its own hold, which no other thread may drop,
    /// or the hold of the child that adopted; its parent is no root and was not found
    /// dead); otherwise a linked promise keeps its value.
    ///
    /// Cost: one load and a branch for a value with nothing to free (an `Int`, checked by
    /// the callers); otherwise two loads of the count word, two read-modify-writes of the
    /// tree flags and a fence, once per step whose value or error needs freeing.
    @inline(never)
    private final func retireIfOnlyTheCascadeKeepsIt(cascadeReferences: Int, pathHeld: Bool) {
        var memoryHolds = 1  // the link up of the child that ran
        if treeFlags & TreeFlag.linked != 0 {
            guard pathHeld, holdsItsParentInFlight, holdsWord & UInt(PC_HOLDS_GONE) == 0 else { return }
            memoryHolds = 2
        }
        let object = Unmanaged.passUnretained(self).toOpaque()
        guard SwiftRuntime.isOnlyReference(to: object, strongReferences: cascadeReferences,
                                           besidesMemoryHolds: memoryHolds),
              setTreeFlag(TreeFlag.retiring) else { return }
        fullFence()  // the flag's store before the second snapshot (StoreLoad)
        guard SwiftRuntime.isOnlyReference(to: object, strongReferences: cascadeReferences,
                                           besidesMemoryHolds: memoryHolds) else {
            // A reader took a reference meanwhile (and may be waiting for this decision):
            // it keeps the value.
            return updateTreeFlags(clearing: TreeFlag.retiring, setting: 0)
        }
        updateTreeFlags(clearing: TreeFlag.retiring, setting: TreeFlag.retired)
        if claimHint == UInt(PC_REJECTED) { freeFailureEarly() } else { freeStoredValueEarly() }
    }

    /// The parent, unless it is gone or its value was freed early
    /// (`retireIfOnlyTheCascadeKeepsIt`): what `parent` and `debugDescription` show. A
    /// retired parent is kept only for the library's own walks: for the cascade's
    /// look-ups until it ends, or by a descendant in flight, for a cancel from above.
    final var parentIfReachable: AnyPromise? {
        guard let parent = parentIfAlive, !parent.isRetiredSeenAfterTakingIt else { return nil }
        return parent
    }

    /// Whether this promise's value was freed early, for a reader that has just taken a
    /// reference to it through a link that does not hold it (Dekker with the retirement:
    /// the fence orders the try-retain before the flags' load; a retirement being decided
    /// is waited out, so the answer is final).
    final var isRetiredSeenAfterTakingIt: Bool {
        treeFlagsAfterFence & TreeFlag.retired != 0
    }
}

// MARK: The registry of descendants in flight

// A promise's cancellation registry (`pc_promise.children`) is a stack of its descendants
// that were still in flight after it settled: children whose handler waits on a context,
// followers, and, linked in turn, the settled ancestors between them and the promise; and,
// while it is pending, children settled early that left its observer stack
// (`leavePendingParent`). A cancel of the promise reaches them through it.
//
// The link is a node of the child's own (`pc_lineage.link`, which only a derived
// promise has: a root has no parent to link into), so linking allocates nothing. The registry must
// not keep children alive (it would keep settled subtrees alive), so it holds each linked
// child's memory, not the child: an unowned reference count (`swift_unownedRetain`). A
// walker tries each child with `swift_tryRetain`, which fails once the child began dying;
// the memory of a dead child goes when the registry drops it (pruned as the registry
// grows, or when the promise dies), so it lingers at most that long. Each child is linked
// once (PC_TREE_LINKED), so its node is in at most one registry.

extension AnyPromise {
    /// The one transition into flight: this promise is pending below a parent that has
    /// settled, with work still to come (a handler queued on a context, a promise it
    /// follows, a hand-off to whoever settles it later). From here until it settles or
    /// dies it holds its path up (`holdPathWhileInFlight`) and is linked into its parent's
    /// registry (`linkIntoParentChain`), so a cancel of any live ancestor reaches it.
    ///
    /// Every way of becoming pending after the parent settled calls this, and nothing
    /// else decides whether a promise is reached: the hold is taken whether or not the
    /// promise was linked before (a descendant in flight links its pending ancestors
    /// early, which is no hold of theirs). Calling it again while in flight changes
    /// nothing.
    ///
    /// - Parameter parent: this promise's parent, which the caller holds (the thread that
    ///   fired this promise, or its continuation), so reading it needs no lock.
    final func enterFlight(parent: AnyPromise) {
        // A root's child holds nothing (see `holdPathWhileInFlight`): skip the word's load.
        if holdsItsParentInFlight && holdsWord & UInt(PC_HOLDS_SELF) == 0 { holdPathWhileInFlight() }
        linkIntoParentChain(parent: parent)
    }

    /// Links this promise into its parent's registry, and the parent into its own, up to
    /// the first ancestor that is linked already (each link is made once). Reachability
    /// only: whether the path is held is `holdPathWhileInFlight`'s business.
    ///
    /// A promise linked already still has its parent linked: a descendant's walk may have
    /// linked it and not yet reached the parent (another thread, paused between two
    /// pushes while the ancestors above settle, are cancelled and are let go). The caller
    /// holds the parent, and the parent's own parent is held too (by its handler, the
    /// cascade or its settling call), so linking it now means a cancel of any live
    /// ancestor finds the path, or the path finds the cancel (`addToRegistry`).
    ///
    /// - Parameter parent: this promise's parent, which the caller holds.
    final func linkIntoParentChain(parent: AnyPromise) {
        _ = linkOnce(into: parent)
        // The common case ends here, without touching the reference counts: the parent is
        // a root, or linked already (pc_tree_flags_set would refuse it anyway).
        if parent.isRoot || parent.treeFlags & TreeFlag.linked != 0 { return }
        AnyPromise.linkAncestors(from: parent)
    }

    /// The rest of `linkIntoParentChain`'s walk, from `promise` (not linked yet) up.
    @inline(never)
    private static func linkAncestors(from start: AnyPromise) {
        var promise = start
        while let up = promise.parentIfAlive, promise.linkOnce(into: up) {
            if up.isRoot || up.treeFlags & TreeFlag.linked != 0 { return }
            promise = up
        }
    }

    /// Marks this promise linked and pushes it onto `parent`'s registry, once (false if it
    /// was linked already). The registry's hold on its memory is taken before the mark,
    /// so a promise marked linked has that hold for as long as its parent lives: the
    /// retirement counts it (`retireIfOnlyTheCascadeKeepsIt`).
    private final func linkOnce(into parent: AnyPromise) -> Bool {
        guard treeFlags & TreeFlag.linked == 0 else { return false }
        let pointer = Unmanaged.passUnretained(self).toOpaque()
        SwiftRuntime.unownedRetain(pointer)  // the registry's hold on our memory
        guard setTreeFlag(TreeFlag.linked) else {
            SwiftRuntime.unownedRelease(pointer)  // another thread linked us first
            return false
        }
        parent.addToRegistry(self)
        return true
    }

    /// Pushes `child` (a descendant this thread just marked LINKED, holding its memory for
    /// the registry) onto the registry, then applies a cancel that its walk may have missed.
    private final func addToRegistry(_ child: AnyPromise) {
        assert(!child.isRoot, "a root has no parent registry to be linked into")
        let childPointer = Unmanaged.passUnretained(child).toOpaque()
        assert(AnyPromise.owner(ofRegistryLink: child.registryLinkPointer).toOpaque() == childPointer,
               "DerivedLayout.registryLinkOffset does not find the child")
        let count = registryPush(child.registryLinkPointer)
        if count >= 32, count & (count - 1) == 0 {
            forEachLinkedChild(reapplyingCancel: true) { _ in }  // prune dead links, amortised O(1)
        }
        if carriesCancelForDescendants, let reason = cancelReasonForDescendants {
            // Our cancel may have walked the registry before the push: apply it here.
            child.cancel(reason: reason)
        }
    }

    /// Takes the registry, calls `body` for each live child, puts back the links to live
    /// children and drops dead ones. With `reapplyingCancel`, a cancel published while
    /// the links were out of the registry (so its own walk found nothing) is applied to
    /// them here; a canceller's own walk passes false, having queued them already.
    final func forEachLinkedChild(reapplyingCancel: Bool, _ body: (AnyPromise) -> Void) {
        var node = registryTake()
        guard node != nil else { return }
        var taken: UInt = 0
        var kept: [UnsafeMutablePointer<pc_link>] = []
        // The live children, held, for the re-applied cancel: once the links are back in
        // the registry another thread may prune them, so they are not read again.
        var live: [AnyPromise] = []
        while let current = node {
            node = current.pointee.next
            taken += 1
            // We own the registry's unowned count of the child until we push it back, so
            // its memory is there to try.
            let childPointer = AnyPromise.owner(ofRegistryLink: current).toOpaque()
            if let retained = SwiftRuntime.tryRetain(childPointer) {
                let child = Unmanaged<AnyPromise>.fromOpaque(retained).takeRetainedValue()  // balances the try
                body(child)
                kept.append(current)
                if reapplyingCancel { live.append(child) }
                continue
            }
            SwiftRuntime.unownedRelease(childPointer)  // the child died: prune (its memory goes after its deinit)
        }
        for link in kept.reversed() {
            _ = registryPush(link)
        }
        registryForget(taken)
        if reapplyingCancel, !live.isEmpty, let reason = cancelReasonForDescendants {
            for child in live { child.cancel(reason: reason) }
        }
    }

    /// Drops the registry's hold on its children's memory (deinit only). Inline, one load,
    /// for the common empty registry.
    @inline(__always)
    final func releaseChildLinks() {
        guard !pc_children_empty_at_deinit(corePointer) else { return }
        releaseTakenChildLinks()
    }

    @inline(never)
    private final func releaseTakenChildLinks() {
        var node = registryTake()
        while let current = node {
            node = current.pointee.next  // before the release, which may free the child
            SwiftRuntime.unownedRelease(AnyPromise.owner(ofRegistryLink: current).toOpaque())
        }
    }
}

// MARK: Holding the path of a descendant in flight

// A cancel reaches a descendant in flight (a handler queued on a context, a follower, a
// child handed off to be settled later) through the registries of the settled promises
// between it and the cancelled one. `parent` never keeps a parent alive, so those promises
// must be kept for as long as the descendant is in flight: a promise in flight holds its
// parent, and a settled promise holds its own parent while any descendant holds it. The
// `holds` word counts why (see `pc_holds_add`): the first hold takes a strong reference to
// the parent, the last drops it, and whoever drops it lets the next level go, in a loop.
//
// Roots are never held this way: a root that nobody holds cannot be cancelled, and one
// that somebody holds is alive anyway. So `root.then(on: queue)` pays nothing, and
// holding a settled promise keeps nothing above it once nothing below it is in flight.
//
// Cost, below a non-root parent: going in flight, a try-retain and one read-modify-write
// per ancestor whose first hold it is, one CAS at the first ancestor that already holds;
// settling, a load of the word, and the same walk back. Every publish loads the word once.

extension AnyPromise {
    /// Called by a promise going in flight (`enterFlight`), while it does not hold yet:
    /// holds the path up until it settles (`publishClaimedOutcome`) or dies (deinit).
    final func holdPathWhileInFlight() {
        guard holdsItsParentInFlight else { return }
        AnyPromise.addHold(UInt(PC_HOLDS_SELF), to: self)
        // Settled before the publisher could see SELF: one of us drops it (Dekker, see
        // `pc_holds_after_publish`).
        if publishedTagAfterHold != UInt(PC_PENDING) { dropSelfHold() }
    }

    /// Drops this promise's own hold, if it still has it.
    @usableFromInline
    final func dropSelfHold() {
        AnyPromise.removeHold(UInt(PC_HOLDS_SELF), from: self)
    }

    /// Adds `delta` to `start`'s holds; the first hold of a promise takes its parent and
    /// adds a hold there, and so on up to an ancestor that already holds, or whose parent
    /// is a root, gone, or absent.
    ///
    /// The path is secured top-down: a promise's hold becomes visible in its word only once
    /// its parent counts a hold for it. So "a promise that holds has a hold counted at its
    /// parent" is true at every moment, and a remover that drops a promise's last hold
    /// (`removeHold`, bottom-up) always finds the parent's hold it removes next: it can
    /// never overtake an adder's walk. An adder that finds, at its turn, that another hold
    /// came first gives back the hold it had secured above (which cannot be the last one
    /// there: the other hold has its own).
    private static func addHold(_ delta: UInt, to start: AnyPromise) {
        guard start.holdsItsParentInFlight else { return }
        if start.holdsAddIfHolding(delta) { return }  // held already: so is the path above
        // Up: each promise whose parent is not held yet, with its parent (retained), until
        // a parent that already holds (which counted us at once), does not count, or a
        // parent that is gone.
        var pairs: [(promise: AnyPromise, parent: AnyPromise)] = []
        var promise = start
        var top: AnyPromise? = nil  // a promise with a dead parent, to count without one
        while true {
            guard let parent = promise.parentIfAlive else {
                promise.holdsMarkGone()  // dead for good: nothing above to hold
                top = promise
                break
            }
            pairs.append((promise, parent))
            if !parent.holdsItsParentInFlight || parent.holdsAddIfHolding(UInt(PC_HOLDS_ONE)) { break }
            promise = parent
        }
        if let top {
            // Counts the hold of the promise below it (or `start`'s own) with no parent to take.
            _ = top.holdsAdd(top === start ? delta : UInt(PC_HOLDS_ONE))
        }
        // Down: each promise's hold becomes visible after its parent's.
        for (promise, parent) in pairs.reversed() {
            let before = promise.holdsAdd(promise === start ? delta : UInt(PC_HOLDS_ONE))
            if before == 0 {
                _ = Unmanaged.passRetained(parent)  // the promise's hold on its parent
            } else {
                // Another hold came first and has its own hold above: give ours back.
                removeHold(UInt(PC_HOLDS_ONE), from: parent)
            }
        }
    }

    /// Removes `delta` from `start`'s holds; the last hold of a promise lets its parent go
    /// and removes a hold there, and so on up.
    private static func removeHold(_ delta: UInt, from start: AnyPromise) {
        var current = Unmanaged.passUnretained(start)
        var retainedByHold = false  // `current` is kept by the hold being dropped
        var delta = delta
        while true {
            let up: UnsafeMutableRawPointer? = current._withUnsafeGuaranteedRef { promise in
                guard promise.holdsItsParentInFlight else { return nil }
                let before = delta == UInt(PC_HOLDS_SELF)
                    ? promise.holdsClearSelf()
                    : promise.holdsRemoveOne()
                // Not ours to drop (SELF cleared by the other side), holds left, or the
                // parent was found dead: the parent is not held by this word any more.
                guard before == delta else { return nil }
                return promise.parentAddress
            }
            if retainedByHold { current.release() }  // after its word, which we read above
            guard let up else { return }
            current = Unmanaged.fromOpaque(up)
            retainedByHold = true
            delta = UInt(PC_HOLDS_ONE)
        }
    }
}
