import CPromiseCore

// Following: a promise locked in to settle as another does (`resolve(with:)`, or a child
// whose handler returned a promise), the link that lets a cancel reach the followed
// promise, and the check that no promise ever waits on itself.

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
    /// Makes this promise follow `source` (same `Value`): it settles as `source` does.
    /// Uses the promise's own node, so only call it when that node is free: from this
    /// promise's continuation, once it ran (the only caller, `settleFollowing`), which
    /// passes the parent it holds.
    ///
    /// The followed promise is work this promise owns (a cancel reaches it), linked
    /// through `followeeWord` (see `FolloweeLink`). A promise that would follow itself,
    /// directly or through a chain that leads back to it, is rejected with
    /// `PromiseError.cycle` instead (see `wouldWaitOnItself` for the cost).
    @usableFromInline
    final func follow(_ source: AnyPromise, parent: AnyPromise) {
        guard claim(from: PC_CLAIM_FREE, to: PC_CLAIM_FOLLOWING) else {
            // Settled first by someone else: a canceller's reason reaches the work too.
            forwardCancelIfClaimed(to: source)
            lostClaimToHandler(parent: parent)
            return
        }
        #if DEBUG
        FollowWindowHook.run(self)
        #endif
        recordFollowee(source, forwardsCancel: true)
        enterFlight(parent: parent)
        observe(source, as: .following)
        if closesACycle(following: source) {
            rejectAsCycle(parent: parent)
            forwardCancelIfClaimed(to: source)
            return
        }
        // A canceller that took the claim over before our link was recorded could not
        // forward to `source` (it reads the link after its claim; we read the claim after
        // recording, and fenced), and a cancel of ours now would find the claim taken: we
        // forward its cancel. An ancestor's cancel may be that canceller, so this is read
        // before our own cancel below, which forwards by itself when it wins the claim.
        let claimTakenByACanceller = claimHint == UInt(PC_CANCELLED)
        // Not recording: once observed, `source` may fire on another thread at once, and
        // the adoption there runs the check again and records its epoch.
        if let reason = cancelReasonFromAncestors(parent: parent, recording: false) {
            cancel(reason: reason)  // an ancestor's cancel came first, or while we were linking
        }
        if claimTakenByACanceller { forwardCancelIfClaimed(to: source) }
    }

    /// For a promise that meant to follow `source` and found its claim taken by a
    /// canceller (before its own claim, or over it before the link was recorded, so the
    /// canceller could not see `source`): the cancel reaches `source` too, with its reason,
    /// once published. The claim word, not the published state, decides: a canceller
    /// publishes after it claims. Rare; an `onCancel` box.
    final func forwardCancelIfClaimed(to source: AnyPromise) {
        guard claimHint == UInt(PC_CANCELLED) else { return }
        onCancel(withReason: { [source] reason in source.cancelOwnedWork(reason: reason) })
    }

    /// A child whose parent settled stays pending with work to come: a handler hands it
    /// off to be settled later (`StoredHandler.handOff`), or `resolve(with:)` locked it in
    /// before or while its handler ran (`runContinuation`, `lostClaimToHandler`). It enters
    /// flight, so that a cancel forwarded through the settled parent still reaches it,
    /// and takes a cancel that reached an ancestor already.
    @usableFromInline
    final func stayInFlight(parent: AnyPromise) {
        enterFlight(parent: parent)
        if let reason = cancelReasonFromAncestors(parent: parent, recording: false) {
            cancel(reason: reason)
        }
    }

    /// Records `source` as the promise this one follows, holding its memory, then fences:
    /// only for the thread whose claim to FOLLOWING won, once, right after it.
    final func recordFollowee(_ source: AnyPromise, forwardsCancel: Bool) {
        let address = HeldMemory.hold(Unmanaged.passUnretained(source))
        // Release: a canceller or a cycle check that reads the word sees `source`'s address
        // only once its hold is in place.
        storeFolloweeWord(address | (forwardsCancel ? FolloweeLink.forwardsCancel : 0))
        // StoreLoad: our claim and our link are visible before we read the walk's mark
        // below and the links of the chain we would follow (`wouldWaitOnItself`); pairs
        // with the fence of a promise that starts following us at the same time, and
        // with the one a walk makes after marking us (`markWalkedThrough`).
        fullFence()
        // A pending child that a walk went through to its parent waits on `source` from
        // now on: the skips recorded over it end (see `pc_walk_epoch_advance`). Before
        // our cycle check, which fences again before it loads the links it walks.
        if treeFlags & TreeFlag.walkedThrough != 0 { WalkEpoch.advance() }
    }

    /// The followed promise's address (its memory held by us), or nil if we never followed.
    final var followeeAddress: UnsafeMutableRawPointer? {
        UnsafeMutableRawPointer(bitPattern: followeeWordValue & FolloweeLink.addressMask)
    }

    /// The followed promise if it is still alive and a cancel of ours should reach it.
    final var followeeToCancel: AnyPromise? {
        let word = followeeWordValue
        guard word & FolloweeLink.forwardsCancel != 0,
              let address = UnsafeMutableRawPointer(bitPattern: word & FolloweeLink.addressMask) else { return nil }
        return HeldMemory.promiseIfAlive(at: address)
    }

    /// Where the cycle check last found this follower's run of waits to end (`WaitWalk`:
    /// a promise pending and following nothing, met through followers and pending
    /// children), retained, as a walk that began in walk epoch `epoch` may take it: the
    /// recorded end, if it was reached through follow links only, or through pending
    /// children in that epoch (then with `firstChild`, the first of them, where the follow
    /// links end, if it is still alive); else that first child, the end of the follow
    /// links, with no `firstChild`. Nil if none of these is recorded and alive.
    final func followChainEnd(inEpoch epoch: UInt)
        -> (end: AnyPromise, firstChild: AnyPromise?, throughChildren: Bool)? {
        guard let record = existingRareState?.chainEndRecord.load() else { return nil }
        if let end = record.end {
            if record.tag == 0 { return (end, nil, false) }
            if record.tag == WaitWalk.recordTag(epoch) { return (end, record.firstChild, true) }
        }
        return record.firstChild.map { ($0, nil, false) }
    }

    /// Records `end` as where this follower's run of waits ends (see `followChainEnd`),
    /// in place of the end recorded before, if any: a walk that went on from there found
    /// the run longer since. `tag`: 0 if the run reached `end` through follow links only,
    /// else `WaitWalk.recordTag` of the walk's epoch, with `firstChild` the first pending
    /// child it went through, if still alive. The follower holds the memory of those two
    /// (bare objects once they died) until it records others or dies itself.
    final func recordFollowChainEnd(_ end: AnyPromise, tag: UInt, firstChild: AnyPromise?) {
        let record = rareState.chainEndRecord
        // A quick look: a racing walk may record another end meanwhile; either is where
        // the run ended, seen at some point.
        guard tag != 0 || record.endAddress != UnownedLink.address(of: end) else { return }
        let replaced = record.replace(end: HeldMemory.hold(Unmanaged.passUnretained(end)), tag: tag,
                                      firstChild: firstChild.map { HeldMemory.hold(Unmanaged.passUnretained($0)) } ?? 0)
        if let old = UnsafeMutableRawPointer(bitPattern: replaced.end) { HeldMemory.release(old) }
        if let old = UnsafeMutableRawPointer(bitPattern: replaced.firstChild) { HeldMemory.release(old) }
    }

    /// Marks this pending child as gone through to its parent by a walk that may record a
    /// skip over it (`WaitWalk`), then looks at its claim and returns it: free, the child
    /// still waits on its parent, and the skip holds until it locks in, which advances the
    /// walk epoch (`recordFollowee`). A full fence between the mark and the look.
    final func markWalkedThrough() -> UInt {
        if treeFlags & TreeFlag.walkedThrough == 0 { _ = setTreeFlag(TreeFlag.walkedThrough) }
        // Dekker with `recordFollowee`, which claims, fences, then reads the mark: one of
        // us sees the other. The CAS that sets the mark is no StoreLoad barrier (acq_rel
        // on AArch64, `pc_promise.h`), so the fence is needed whoever set the mark.
        fullFence()
        return claimHint
    }

    /// Called by a promise that locked in to follow `source`, recorded the link and
    /// registered on `source`: whether that closed a wait cycle through it. Nobody can
    /// wait on this promise without being registered on it (a pending child, a follower),
    /// so a promise with no observers closes no cycle and needs no walk: a chain of
    /// returned promises built inner-first (each level's handler returns the level below,
    /// run before anyone observes its child) costs O(1) per link instead of its length.
    ///
    /// Races: a promise X locking in to follow this one at the same time registers on it,
    /// fences, then reads our link; we recorded our link, fenced, registered, and read our
    /// observers after another fence. Dekker: either we see X registered (and walk), or X
    /// sees our link (and walks to us).
    final func closesACycle(following source: AnyPromise) -> Bool {
        guard claimHint == UInt(PC_CLAIM_FOLLOWING) else { return false }  // settled meanwhile
        fullFence()
        if source === self { return true }
        guard hasWaitingObservers else { return false }
        return wouldWaitOnItself(following: source)
    }

    /// Whether following `source` would make this promise wait on itself: `source` is this
    /// promise, or waits for it through a chain of waits of any length. A pending promise
    /// waits for the promise it follows (locked in), a pending child for its pending
    /// parent (its handler has not run), a pending output of `allSettled` for each of its
    /// inputs still pending, and one of `race`, `any`, `all` or `and` only when no input
    /// can settle it any more (see `WaitWalk`). Called by a promise that just locked in and recorded
    /// its followee (`recordFollowee`) and registered on `source`, and has observers itself
    /// (`closesACycle`). See `WaitWalk` for the walk and its cost.
    ///
    /// Races: two promises locking in to follow each other at the same time each record
    /// their link, fence, then read the other's; at least one of them sees the other's
    /// link (the fences are ordered one way or the other), so a cycle can never close
    /// unseen. Both may see it: both are then rejected, as they would be anyway. A
    /// combinator's links to its inputs are there before its output is returned, so
    /// before anyone can follow it.
    final func wouldWaitOnItself(following source: AnyPromise) -> Bool {
        source === self || WaitWalk.waits(from: source, on: self)
    }

    /// Rejects this promise, claimed as FOLLOWING by this thread, with
    /// `PromiseError.cycle` (or cancels it, when `parent` passes down a cancel that came
    /// first), and publishes. Nothing if a canceller took the claim over meanwhile.
    ///
    /// - Parameters:
    ///   - parent: the parent its handler holds; nil from `resolve(with:)`, a settle by
    ///     the holder, which keeps the parent itself (`publishKeepingParent`).
    ///   - claimed: the claim it is taken from: a run's output, which follows nothing,
    ///     is still free (`rejectAsCycleIfWaited`).
    final func rejectAsCycle(parent: AnyPromise?, from claimed: UInt32 = PC_CLAIM_FOLLOWING) {
        let kept = parent == nil ? parentToKeepForSettle() : nil
        guard claim(from: claimed, to: PC_REJECTED) else {
            kept?.release()
            return
        }
        if let parent, let reason = cancelReasonFromAncestors(parent: parent) {
            turnClaimIntoCancel(from: PC_REJECTED, reason: reason)
        } else {
            storeRejection(PromiseError.cycle)
            PromiseDiagnostics.report(.cycle, for: self)
        }
        publishOutcomeFromHolder(keeping: kept)
        passOnClaimedCancel()  // if it turned into a cancel
    }
}

/// What settles an output the library made from promises it waits on: a combinator's
/// `Aggregator` (its inputs), or a run of steps (`retry`: its attempt in flight;
/// `sequence`, `all(_:maxConcurrent:)`: their steps in flight). The output's rare state
/// links to it (`AnyPromise.settlerIfAlive`), so the cycle check's walk goes on through
/// it.
protocol WaitedOnByOutput: AnyObject {
    /// Appends the promises the output waits on now, at most `limit`: `complete` false if
    /// there may be more (or more may start before these settle), `unlinked` true if one
    /// cannot be reached any more (gone, or not made yet).
    func appendLinkedInputs(to inputs: inout [AnyPromise], limit: Int) -> (complete: Bool, unlinked: Bool)

    /// Which outcome of one of them settles the output before the others.
    var settledEarlyBy: Aggregator.SettledEarlyBy { get }

    /// The walk is about to look at the inputs of an output that one of them may settle
    /// first: ask again as they settle (an aggregator does; a run checks each step it
    /// starts instead, `rejectAsCycleIfWaited`).
    func watchForCyclesAsInputsSettle()

    /// The output locked in to follow another promise (`resolve(with:)`): a run can no
    /// longer settle it, so it stops as for an outside settle (its observer on the step in
    /// flight gives up) and lets go of the user's code and its results. An aggregator
    /// does nothing: its slots leave its inputs once the output settles.
    func outputLockedIn()
}

extension WaitedOnByOutput {
    func watchForCyclesAsInputsSettle() {}
    func outputLockedIn() {}
}

extension Aggregator: WaitedOnByOutput {}

extension AnyPromise {
    /// Links this output, a root the library made that nobody else has seen yet, to the
    /// run that settles it (see `RareState.runWord`), for the cycle check; `forgetRun`
    /// undoes it when the output settles.
    final func recordRun(_ run: some WaitedOnByOutput) {
        let address = Unmanaged.passUnretained(run as AnyObject).toOpaque()
        SwiftRuntime.unownedRetain(address)  // the link's hold: `forgetRun`, or the rare state's deinit
        UnownedLink.store(rareState.runWord, address: address)
    }

    /// The output settled: the cycle check has nothing to ask its run any more, and a
    /// settled output that lives on keeps none of the run's memory.
    final func forgetRun() {
        guard let word = existingRareState?.runWord,
              let run = UnsafeMutableRawPointer(bitPattern: UnownedLink.take(word)) else { return }
        SwiftRuntime.unownedRelease(run)
    }

    /// What settles this output (an aggregator or a run), retained, if it is still alive;
    /// nil for any other promise. For the cycle check's walk.
    final var settlerIfAlive: (any WaitedOnByOutput)? {
        if let aggregator = aggregatorIfAlive { return aggregator }
        guard isRoot, let word = existingRareState?.runWord else { return nil }
        return UnownedLink.loadObject(word) as? any WaitedOnByOutput
    }

    /// Called by a run that takes one step at a time and just started observing `step`
    /// for this output, which waits on that step alone: rejects the output with
    /// `PromiseError.cycle` if the step waits on it (it follows the output, say:
    /// `p.resolve(with: Promise.retry { p })`), since nothing else would settle it. The run
    /// recorded the step first; a promise locking in to follow the output at the same time
    /// recorded its link, fenced, then walks to the run's step: with the fence here, one of
    /// the two sees the other (as for two promises following each other,
    /// `wouldWaitOnItself`). Cost for a step that has settled, or is a fresh root: a fence
    /// and two loads.
    final func rejectAsCycleIfWaited(onBy step: AnyPromise) {
        fullFence()
        guard isPending else { return }
        guard step === self || WaitWalk.waits(from: step, on: self) else { return }
        rejectOutputAsCycle()
    }

    /// Rejects this output of a run, which follows nothing and is still free to settle,
    /// with `PromiseError.cycle`: what the run waits on all waits on it. Nothing if its
    /// holder settled it or locked it in meanwhile.
    final func rejectOutputAsCycle() {
        rejectAsCycle(parent: nil, from: PC_CLAIM_FREE)
    }
}

#if DEBUG
/// Debug builds only: runs a test's closure in `follow`'s window between the claim to
/// FOLLOWING and the recording of the followee link (a few instructions wide in a release
/// build), where a canceller that takes the claim over cannot see the followee yet.
enum FollowWindowHook {
    private final class Installed: Sendable {
        let body: @Sendable (AnyPromise) -> Void
        init(_ body: @escaping @Sendable (AnyPromise) -> Void) { self.body = body }
    }

    /// The installed closure's box, retained, or 0; read and replaced under the word's
    /// lock, so that a reader has retained the box before an install releases it.
    private nonisolated(unsafe) static let word: UnsafeMutablePointer<UInt> = {
        let word = UnsafeMutablePointer<UInt>.allocate(capacity: 1)
        word.initialize(to: 0)
        return word
    }()

    /// Runs `body` with each follower in the window from now on (nil: none).
    static func install(_ body: (@Sendable (AnyPromise) -> Void)?) {
        let new = body.map { UInt(bitPattern: Unmanaged.passRetained(Installed($0)).toOpaque()) } ?? 0
        var old: UInt = 0
        updateLockedWord(word) { value in
            old = value
            return new
        }
        if let box = UnsafeRawPointer(bitPattern: old) { Unmanaged<Installed>.fromOpaque(box).release() }
    }

    static func run(_ follower: AnyPromise) {
        guard loadWordAcquiring(word) != 0 else { return }  // none installed: no lock taken
        var installed: Installed?
        updateLockedWord(word) { value in
            if let box = UnsafeRawPointer(bitPattern: value) { installed = Unmanaged<Installed>.fromOpaque(box).takeUnretainedValue() }
            return value
        }
        installed?.body(follower)
    }
}
#endif
