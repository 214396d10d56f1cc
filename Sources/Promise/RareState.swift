import CPromiseCore
import Dispatch

// The rare state of a promise: what few promises need, in a side object made on first use
// and reached through one word of the promise (`rareStateWord`), so that the others pay a
// word for it, not its size. Today it holds the reason of a cancel forwarded through a
// settled promise, the list of waiters that may give up, the count of other observers
// that gave up (`observerGaveUp`, below: the slots of settled combinators, children and
// followers cancelled, children settled early), and a root's
// followee link (`AnyPromise.followeeWord`: a root follows only through `resolve(with:)`).
//
// Waiters that may give up (a `wait(timeout:)`, an `await` whose Task may be cancelled, a
// `timeout` child whose timer may fire first) are not nodes of the promise's lock-free
// observer stack: a node stays there until the promise settles, so a waiter that gave up
// would stay too, and polling a long-lived pending promise would grow without bound. They
// are entries of a doubly linked list instead, which registers one node on the promise,
// once, for all of them. An entry that gives up unlinks itself, in O(1), and leaves
// nothing behind. The list has a lock (a spin lock in one word, `pc_word_lock`, held for
// an O(1) link or unlink, or, once, for the walk that takes the whole list when the
// promise settles). Registering `then`, `whenComplete` and the combinators never touches
// it, and a promise nobody waits on this way never takes it. But the settle of a promise
// that has such waiters does take it, once: that settle is not lock-free (a holder
// preempted inside costs the settler a time slice). The trade is deliberate: a waiter
// leaves at once and leaves nothing, where pruning the lock-free observer stack
// (`pc_prune`, for combinators' slots and cancelled children) leaves a few dead nodes between prunes
// and walks the stack each time; unlinking one node from that stack in place would need
// memory reclamation (hazard pointers or epochs), which the core does without.
//
// Order: when the promise settles, the waiting threads and Tasks wake first, at once, in
// registration order; the `timeout` children settle next, in registration order, through
// the settling thread's trampoline. All of them at the place of the list's node among the
// promise's other observers (the first waiter's), not each at its own.

/// An entry of a promise's waiter list. Every field is guarded by the list's lock.
class WaiterEntry: @unchecked Sendable {
    /// Where an entry is: not yet in a list, in one, or finished (delivered, or gave up).
    enum Place { case fresh, listed, finished }

    // First stored property (the class has no superclass), so its address is known: a
    // countdown from 2 for entries that resume only once two things happened (`Waiter`).
    // Not guarded by the lock: lowered with `pc_count_down`.
    private final var arrivals: UInt = 2
    final var arrivalsPointer: UnsafeMutablePointer<UInt> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: UInt.self)
    }

    fileprivate final var place = Place.fresh
    fileprivate final var next: WaiterEntry?
    fileprivate final unowned(unsafe) var previous: WaiterEntry?

    /// The promise this entry settles when delivered, or nil for an entry that only wakes
    /// someone (a blocked thread, a suspended Task), which is delivered at once, from the
    /// settling call's firing. An entry that settles a promise goes through the settling
    /// thread's trampoline (its observers must not nest), under the cascade watch.
    var settledPromise: AnyPromise? { nil }

    /// Whether the entry would still take the promise's outcome: for the broken-promise
    /// report of a promise that dies pending with the entry listed. Guarded by the lock.
    var takesTheOutcome: Bool { true }

    /// The promise settled (or died pending: `source` is then its broken stand-in).
    /// Called once, outside the lock: the waking entries in registration order, then the
    /// settling ones in registration order.
    func deliver(from source: AnyPromise) {
        preconditionFailure("WaiterEntry is abstract")
    }
}

/// A blocking `wait` (see `Promise.wait(timeout:)`): a semaphore the outcome signals. The
/// library's one blocking primitive, on its one documented cold path: only the thread
/// that called `wait` ever waits on it; the settling thread signals, which never blocks,
/// and only when such a waiter is listed.
final class BlockingWaiter<Value: Sendable>: WaiterEntry, @unchecked Sendable {
    let signal = DispatchSemaphore(value: 0)
    /// Written by `deliver` before it signals; read after the wait returned.
    var result: Result<Value, any Error>?

    override func deliver(from source: AnyPromise) {
        result = unsafeDowncast(source, to: Promise<Value>.self).publishedResult
        signal.signal()
    }
}

/// A `timeout` child while its receiver is pending: settles the child as the receiver
/// settles, unless the timer (or anyone) settled the child first; then the entry has
/// left the receiver's list, and the child is no longer kept by it.
final class TimeoutFollower<Value: Sendable>: WaiterEntry, @unchecked Sendable {
    let child: Promise<Value>

    init(child: Promise<Value>) {
        self.child = child
    }

    override var settledPromise: AnyPromise? { child }

    /// Not once anyone claimed the child: the timer, a cancel or its holder (the entry
    /// may still be listed while that settle publishes, and then leaves), or a lock-in by
    /// `resolve(with:)` (listed until this promise settles, and then the child stays in
    /// flight below it, following the other promise: `deliver`).
    override var takesTheOutcome: Bool { child.claimHint == UInt(PC_CLAIM_FREE) }

    /// Settles the child as the receiver settled; a cancel forwarded to the receiver (or
    /// above it) before the child claimed wins, as for any handler's child. From a broken
    /// stand-in (the receiver died pending) there is nothing above to look at.
    ///
    /// The child reads the receiver's error even if it settled first (timed out, say, or
    /// settled by hand inside the handler that rejected the receiver, before this came):
    /// a `timeout` child counts as reading it, as a combinator counts for its inputs.
    ///
    /// A child locked in by `resolve(with:)` before the receiver settled stays pending
    /// below it, as a handler's child locked in does (`runContinuation`): it enters flight,
    /// so that a cancel of the receiver or above, then or later, reaches it, and takes a
    /// cancel that reached them already (the receiver's own, too).
    override func deliver(from source: AnyPromise) {
        source.noteErrorSeenIfRejected()
        let fromParent = child.parentAddress == UnsafeMutableRawPointer(Unmanaged.passUnretained(source).toOpaque())
        guard !child.adoptOutcome(of: source, lookingAbove: fromParent ? source : nil),
              fromParent, child.claimHint == UInt(PC_CLAIM_FOLLOWING) else { return }
        child.stayInFlight(parent: source)
    }
}

/// What `RareState.add` did with an entry.
enum WaiterAddition {
    /// Listed: `deliver` comes when the promise settles, unless the entry gives up first.
    case listed
    /// The promise had settled and the list fired: the caller reads the outcome itself.
    case promiseSettled
    /// The entry gave up (`remove`) before it was added: nothing to wait for.
    case gaveUpAlready
}

final class RareState: @unchecked Sendable {
    // First stored property, so that its address is known without a lookup: the list's
    // node, registered on the promise once, the list's lock (a `pc_word_lock` word whose
    // value stays 0), a root's followee word (see `AnyPromise.followeeWord`), a run
    // output's link to its run (`runWord`), and a follower's recorded chain end
    // (`chainEndRecord`). A tuple keeps them in this order.
    private final var header: Header = (pc_node(), 0, 0, 0, 0, 0, 0)
    private typealias Header = (node: pc_node, lock: UInt, followee: UInt, run: UInt,
                                chainEnd: UInt, chainEndTag: UInt, chainEndFirstChild: UInt)
    /// The promise that settled, retained while the deferred node waits to run.
    private var sourceRetain: Unmanaged<AnyPromise>?
    /// The reason of a cancel forwarded through the promise after it had settled: written
    /// once, by the canceller that set PC_TREE_CANCEL_CLAIMED, before it sets
    /// PC_TREE_CANCEL_PUBLISHED (which publishes it).
    final var forwardedCancelReason: (any Error)?
    private var head: WaiterEntry?
    private unowned(unsafe) var tail: WaiterEntry?
    private var nodeRegistered = false
    /// Observers of the promise that gave up since its last prune, and how many give-ups
    /// start the next one (see `AnyPromise.observerGaveUp`): the first prunes at once.
    private var gaveUpSincePrune = 0
    private var gaveUpBeforePrune = 1
    static let minimumGaveUpBeforePrune = 8
    private var fired = false
    /// The settling entries taken when the node fired, for its deferred half: written and
    /// read by the settling thread only.
    private var settling: WaiterEntry?
    /// A combinator's output only: the `Aggregator` that settles it, by its memory (the
    /// runtime's unowned count, as `HeldMemory` holds a promise's), tried with
    /// `swift_tryRetain` (`AnyPromise.aggregatorIfAlive`). The aggregator holds the output
    /// until the output settles, so a strong link back would be a cycle. Written once,
    /// before the output is shared (`recordAggregator`).
    final var aggregatorMemory: UnsafeMutableRawPointer?

    deinit {
        if let aggregatorMemory { SwiftRuntime.unownedRelease(aggregatorMemory) }
        if let run = UnsafeMutableRawPointer(bitPattern: runWord.pointee) { SwiftRuntime.unownedRelease(run) }
        let record = chainEndRecord
        if let end = UnsafeMutableRawPointer(bitPattern: record.end.pointee) { HeldMemory.release(end) }
        if let child = UnsafeMutableRawPointer(bitPattern: record.firstChild.pointee) { HeldMemory.release(child) }
    }

    /// A promise that follows another: where the cycle check last found its run of waits
    /// to end (`WaitWalk`, `AnyPromise.followChainEnd`); all 0 until then.
    final var chainEndRecord: ChainEndRecordWords {
        let header = Unmanaged.passUnretained(self).toOpaque() + CoreLayout.headerSize
        return ChainEndRecordWords(
            end: (header + MemoryLayout<Header>.offset(of: \.chainEnd)!).assumingMemoryBound(to: UInt.self),
            tag: (header + MemoryLayout<Header>.offset(of: \.chainEndTag)!).assumingMemoryBound(to: UInt.self),
            firstChild: (header + MemoryLayout<Header>.offset(of: \.chainEndFirstChild)!).assumingMemoryBound(to: UInt.self))
    }

    /// A run's output only (`retry`, `sequence`): the run's object the cycle check asks
    /// for the step in flight, by its memory, in a locked word (`UnownedLink`), set before
    /// the run starts (`AnyPromise.recordRun`) and emptied when the output settles
    /// (`forgetRun`), so that a settled output that lives on keeps none of the run.
    final var runWord: UnsafeMutablePointer<UInt> {
        (Unmanaged.passUnretained(self).toOpaque() + CoreLayout.headerSize + MemoryLayout<Header>.offset(of: \.run)!)
            .assumingMemoryBound(to: UInt.self)
    }

    private func withLock<T>(_ body: () -> T) -> T {
        let word = (UnsafeMutableRawPointer(nodePointer) + MemoryLayout<Header>.offset(of: \.lock)!)
            .assumingMemoryBound(to: UInt.self)
        return withWordLock(word, body)
    }

    /// A root's followee word (see `AnyPromise.followeeWord`); written once, atomically.
    final var followeeWord: UnsafeMutablePointer<UInt> {
        RareState.followeeWord(ofRareStateAt: Unmanaged.passUnretained(self).toOpaque())
    }

    /// `followeeWord` of the rare state at `address`, without a reference to it (no
    /// retain and release: a promise asks on every deinit).
    @inline(__always)
    static func followeeWord(ofRareStateAt address: UnsafeMutableRawPointer) -> UnsafeMutablePointer<UInt> {
        (address + CoreLayout.headerSize + MemoryLayout<Header>.offset(of: \.followee)!)
            .assumingMemoryBound(to: UInt.self)
    }

    /// Appends `entry`, and registers the list's node on `promise` the first time.
    func add(_ entry: WaiterEntry, on promise: AnyPromise) -> WaiterAddition {
        var register = false
        let addition: WaiterAddition = withLock {
            switch entry.place {
            case .finished: return .gaveUpAlready
            case .listed: preconditionFailure("a waiter entry was added twice")
            case .fresh: break
            }
            if fired {
                entry.place = .finished  // a later `remove` finds nothing to give up
                return .promiseSettled
            }
            entry.place = .listed
            entry.previous = tail
            if let tail { tail.next = entry } else { head = entry }
            tail = entry
            register = !nodeRegistered
            nodeRegistered = true
            return .listed
        }
        // Outside the lock: on a settled promise the node fires at once, and takes it.
        if register { registerNode(nodePointer, firingThrough: rareStateFire, holding: self, on: promise) }
        return addition
    }

    /// Takes `entry` out: true if it was still waiting (listed, or not yet added), so the
    /// caller delivers its give-up; false if the promise's outcome got there first.
    func remove(_ entry: WaiterEntry) -> Bool {
        withLock {
            switch entry.place {
            case .finished:
                return false
            case .fresh:
                entry.place = .finished
                return true
            case .listed:
                entry.place = .finished
                if let previous = entry.previous { previous.next = entry.next } else { head = entry.next }
                if let next = entry.next { next.previous = entry.previous } else { tail = entry.previous }
                entry.next = nil
                entry.previous = nil
                return true
            }
        }
    }

    /// Counts an observer that gave up; true when enough have to make a prune worth it.
    fileprivate func countGaveUp() -> Bool {
        withLock {
            gaveUpSincePrune += 1
            guard gaveUpSincePrune >= gaveUpBeforePrune else { return false }
            gaveUpSincePrune = 0
            return true
        }
    }

    /// A prune kept `kept` nodes: the next waits for as many give-ups (at least the
    /// minimum), so each prune's walk is paid for by the give-ups before it.
    fileprivate func prunedKeeping(_ kept: Int) {
        withLock { gaveUpBeforePrune = max(RareState.minimumGaveUpBeforePrune, kept) }
    }

    /// Whether a listed entry would still take the outcome (`takesTheOutcome`): for the
    /// broken-promise report. Takes the lock.
    var anyEntryTakesTheOutcome: Bool {
        withLock {
            var entry = head
            while let current = entry {
                if current.takesTheOutcome { return true }
                entry = current.next
            }
            return false
        }
    }

    /// The entries waiting now (for tests and descriptions; takes the lock).
    var waitingCount: Int {
        withLock {
            var count = 0
            var entry = head
            while let current = entry {
                count += 1
                entry = current.next
            }
            return count
        }
    }

    /// The promise settled: takes every listed entry, wakes the waiting ones at once, in
    /// registration order, and keeps the settling ones (in order) for `settleFollowers`.
    /// True if there are some.
    fileprivate func wakeWaiters(from source: AnyPromise) -> Bool {
        var entry: WaiterEntry? = withLock {
            fired = true
            let taken = head
            head = nil
            tail = nil
            var current = taken
            while let listed = current {
                listed.place = .finished
                current = listed.next
            }
            return taken
        }
        var settlingTail: WaiterEntry? = nil
        while let current = entry {
            entry = current.next
            current.next = nil
            if current.settledPromise == nil {
                current.deliver(from: source)
            } else if let last = settlingTail {
                last.next = current
                settlingTail = current
            } else {
                settling = current
                settlingTail = current
            }
        }
        return settling != nil
    }

    /// The deferred half: settles the promises of the settling entries. True if one of
    /// them fired `.immediate` children on this thread (the cascade watch), whose handlers
    /// run later in the cascade and may look up through `source`.
    fileprivate func settleFollowers(from source: AnyPromise) -> Bool {
        var firedInline = false
        var entry = settling.take()
        while let current = entry {
            entry = current.next
            current.next = nil
            let previousWatch = current.settledPromise.unsafelyUnwrapped.watchCascade()
            current.deliver(from: source)
            if AnyPromise.endCascadeWatch(previousWatch) { firedInline = true }
        }
        return firedInline
    }

    final var nodePointer: UnsafeMutablePointer<pc_node> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: pc_node.self)
    }

    /// The fire callback of the list's node. Waiters wake at once (a blocked thread, a
    /// suspended Task: nothing runs inline). Timeout children are settled through the
    /// trampoline (their observers must not nest), the node deferred with the source held;
    /// if that fired `.immediate` children, the source stays held until the cascade ends,
    /// as a handler's parent does (`keepParentUntilCascadeEnds`).
    fileprivate static func fire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
        let state = CoreLayout.owner(ofFirstField: node, as: RareState.self)
        if let source {
            let settled = AnyPromise.owner(ofCore: source)  // held by the settler for this call
            let deferred = state._withUnsafeGuaranteedRef { rare in
                guard settled._withUnsafeGuaranteedRef({ rare.wakeWaiters(from: $0) }) else { return false }
                rare.sourceRetain = settled.retain()
                return true
            }
            if deferred {
                // Its timeout children settle later on this thread, as `.immediate` children
                // would: the step that settled `settled` keeps its own parent till then.
                settled._withUnsafeGuaranteedRef { $0.noteInlineChildFired() }
                deferNode(node)  // the node's retain goes with it
            } else {
                state.release()  // the node's retain
            }
            return
        }
        let rare = state.takeRetainedValue()
        let settled = rare.sourceRetain.take().unsafelyUnwrapped
        // A root too: code inside the cascade may cancel it and let it go before the
        // timeout children's own children look up (see `keepParentUntilCascadeEnds`).
        let keep = settled._withUnsafeGuaranteedRef { rare.settleFollowers(from: $0) }
        if keep && keepUntilCascadeEnds(settled, then: releaseKeptPromise) { return }
        settled.release()
    }
}

/// The fire callback of a `RareState`'s node (see `RareState.fire`).
func rareStateFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    RareState.fire(node, source)
}

// MARK: Observers that gave up on a pending promise

extension AnyPromise {
    /// An observer registered on this promise no longer waits for it (a slot of a
    /// combinator that settled without this input, a child or follower that was
    /// cancelled, a child settled early: see `observerHasGivenUp`). Its node stays on the lock-free stack
    /// until something takes it off: the first give-up on a promise prunes its stack at
    /// once (`pruneObserversThatGaveUp`), so a promise whose one observer gave up (a
    /// run's step, a child's `timeout`) keeps none; later ones every so many give-ups (as
    /// many as the nodes the last prune kept, and at least
    /// `RareState.minimumGaveUpBeforePrune`), pruned by the thread that counts the last.
    /// So a promise that outlives many such observers keeps a bounded number of them, and
    /// each give-up costs amortised O(1): the first prune walks nodes that each paid for
    /// their registration. A settled promise has fired its observers: nothing to do.
    ///
    /// What a prune takes off is released on the pruning thread: the thread whose give-up
    /// was the one to trigger it (a cancel, or a combinator settling), which may be that
    /// of an unrelated sibling. The handler of a child cancelled or settled early, and its
    /// captures, go there, not on the child's context.
    ///
    /// An observer that gave up counts as having read this promise's error, should it
    /// come (a child cancelled at a server's teardown, a `delay` its holder settled, a
    /// follower cancelled), as a combinator does its inputs' and a `timeout` child its
    /// receiver's: its holder chose not to wait for the outcome, so an error that follows
    /// is no unhandled rejection.
    final func observerGaveUp() {
        guard isPending else { return }
        noteErrorSeen()
        let rare = rareState
        guard rare.countGaveUp(), let kept = pruneObserversThatGaveUp() else { return }
        rare.prunedKeeping(kept)
    }

    /// A run (`retry`, `sequence`, `all(_:maxConcurrent:)`) stops watching this step of
    /// its: it counts as having read the step's error, as a combinator does its inputs'
    /// (an error the step gets later, or got while nobody watched it, is no unhandled
    /// rejection), and its observer, which waits for nothing now, may leave.
    final func runStoppedWatching() {
        noteErrorSeen()
        observerGaveUp()
    }
}

/// The prune's test (`pc_prune`, which holds the promise's stack meanwhile: it only looks):
/// whether `node`'s observer gave up. Three kinds can: a slot of an aggregator that
/// settled without this input, a child or follower cancelled, or a child settled early
/// and linked up, with no error side left to run (`AnyPromise.waitsForNothing`), and a
/// box that says so (`ObserverBox.gaveUp`: a `resolve(with:)` whose follower was
/// cancelled, a run's observer on its step once the run's output settled).
func observerHasGivenUp(_ node: UnsafeMutablePointer<pc_node>, _ context: UnsafeMutableRawPointer?) -> Bool {
    if nodeFires(node, through: aggregatorSlotFire) { return slotOfRetiredAggregator(node) }
    // The node's retain keeps its owner alive while the node is on the stack.
    if nodeFires(node, through: promiseNodeFire) {
        return AnyPromise.owner(ofNode: node)._withUnsafeGuaranteedRef { $0.waitsForNothing }
    }
    if nodeFires(node, through: observerBoxFire) {
        return CoreLayout.owner(ofFirstField: node, as: ObserverBox.self)._withUnsafeGuaranteedRef { $0.gaveUp }
    }
    return false
}

/// The prune's release, once the stack is back: `node` is ours, off the pending promise at
/// `context`. Each kind lets go as if it had fired with nothing to do.
func releaseNodeThatGaveUp(_ node: UnsafeMutablePointer<pc_node>, _ context: UnsafeMutableRawPointer?) {
    if nodeFires(node, through: aggregatorSlotFire) {
        releaseRetiredAggregatorSlot(node, input: UInt(bitPattern: context))
    } else if nodeFires(node, through: promiseNodeFire) {
        let owner = AnyPromise.owner(ofNode: node)
        owner._withUnsafeGuaranteedRef { $0.continuation = nil }  // the handler, unrun, and its captures
        owner.release()  // the registration's retain: may free the child
    } else if nodeFires(node, through: observerBoxFire) {
        CoreLayout.owner(ofFirstField: node, as: ObserverBox.self).release()  // the registration's retain
    } else {
        // `observerHasGivenUp` names only the three kinds above (a `CompletionNode`, a
        // root's first-observer slot and a waiter list never give up).
        preconditionFailure("a node of a kind that never gives up was pruned")
    }
}

extension AnyPromise {
    /// The promise's rare state, made on first use (see `RareState`).
    final var rareState: RareState {
        if let existing = existingRareState { return existing }
        let made = RareState()
        let address = UInt(bitPattern: Unmanaged.passRetained(made).toOpaque())  // the word's retain
        if publishRareState(address) { return made }
        Unmanaged<RareState>.fromOpaque(UnsafeRawPointer(bitPattern: address).unsafelyUnwrapped).release()
        return existingRareState.unsafelyUnwrapped  // another thread's came first
    }

    /// The rare state if it was made (acquire: its initialisation is visible).
    final var existingRareState: RareState? {
        UnsafeRawPointer(bitPattern: rareStateWordValue).map { Unmanaged<RareState>.fromOpaque($0).takeUnretainedValue() }
    }

    /// Releases the word's retain of the rare state (deinit only).
    final func releaseRareState() {
        guard let address = UnsafeRawPointer(bitPattern: rareStateWord.pointee) else { return }
        Unmanaged<RareState>.fromOpaque(address).release()
    }
}
