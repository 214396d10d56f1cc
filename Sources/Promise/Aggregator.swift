import CPromiseCore

/// One slot per input of a combinator: the node registered on that input, and the input
/// itself once it has settled (so its value can be read when the aggregate finishes,
/// without the aggregate holding pending inputs: that would be a retain cycle).
@usableFromInline
struct AggregatorSlot {
    var node = pc_node()                    // first: a node's address is its slot's
    var owner: UnsafeMutableRawPointer?     // the Aggregator; each registration retains it
    /// The input that fired the slot, retained, until the slot's queued run takes it: only
    /// for a slot nested too deep to run at once (`aggregatorSlotFire`).
    var firedBy: UInt = 0
    var settled: Unmanaged<AnyPromise>?     // written once, by the input's firing thread
    /// The input, unowned (see `UnownedLink`), so that cancelling the aggregate can cancel
    /// it while it is pending without the aggregate keeping it. Valid while this slot is
    /// registered on it (an input that dies pending clears it: `clearAggregatorSlotInput`),
    /// and after, while `settled` holds the input; whoever stops holding a settled input,
    /// or never holds it (a retired aggregator), clears the link first.
    var input: UInt = 0
}

/// The lock-free engine behind `all`, `allSettled`, `any`, `race` and `and`: one
/// allocation of slots for any number of inputs, a countdown word decremented by each
/// input that counts (the one reaching zero finishes), and the output's own claim CAS
/// electing the first input that decides the outcome. No lock, and O(n) for n inputs.
final class Aggregator: @unchecked Sendable {
    /// The policy: called once per input, on the thread that settles it, with the
    /// aggregator, the input's index and the settled input.
    typealias InputSettled = @Sendable (Aggregator, Int, AnyPromise) -> Void

    let count: Int
    /// Which outcome of one input settles the output before the others (for the cycle
    /// check, `WaitWalk`: an output waits on a promise that locks in if nothing else can
    /// settle it).
    enum SettledEarlyBy {
        /// None: the output settles once every input has (`allSettled`).
        case nothing
        /// A rejection or cancel (`all`, `and`).
        case failure
        /// A fulfilment (`any`).
        case fulfilment
        /// Any outcome (`race`).
        case anyOutcome

        /// Whether an input that settled with `tag` settles the output.
        func settles(withTag tag: UInt) -> Bool {
            switch self {
            case .nothing: return false
            case .failure: return tag != UInt(PC_FULFILLED)
            case .fulfilment: return tag == UInt(PC_FULFILLED)
            case .anyOutcome: return true
            }
        }
    }

    let settledEarlyBy: SettledEarlyBy
    private let slots: UnsafeMutablePointer<AggregatorSlot>
    /// The countdown (`countDown`), the retirement gate (`pc_gate_enter`) and the
    /// cycle watch (`watchForCyclesAsInputsSettle`), three words.
    private let remaining: UnsafeMutablePointer<UInt>
    private var gate: UnsafeMutablePointer<UInt> { remaining + 1 }
    private var cycleWatch: UnsafeMutablePointer<UInt> { remaining + 2 }
    private let inputSettled: InputSettled
    /// The output, retained: the aggregator is its resolver. Dropped with the settled
    /// inputs when the aggregator retires (`retire`).
    private var keptOutput: Unmanaged<AnyPromise>?

    /// - Parameters:
    ///   - output: the promise the policy settles; held until it has settled.
    ///   - countdown: how many `countDown()` calls finish the aggregate.
    ///   - inputSettled: the policy. It reaches the output through a reference that does
    ///     not hold it (`unowned(unsafe)`): the aggregator holds it for as long as the
    ///     policy can run.
    init(inputs: UnsafeBufferPointer<AnyPromise>, output: AnyPromise, countdown: Int, settledEarlyBy: SettledEarlyBy,
         inputSettled: @escaping InputSettled) {
        precondition(MemoryLayout<AggregatorSlot>.offset(of: \AggregatorSlot.node) == 0)
        count = inputs.count
        self.settledEarlyBy = settledEarlyBy
        slots = .allocate(capacity: count)
        slots.initialize(repeating: AggregatorSlot(), count: count)
        remaining = .allocate(capacity: 3)
        remaining.initialize(to: UInt(countdown))
        (remaining + 1).initialize(to: 0)
        (remaining + 2).initialize(to: 0)
        keptOutput = Unmanaged.passRetained(output)
        // Plain stores: nothing else sees the slots before `start` registers them (and the
        // output, linked to the aggregator before that, reaches it only after `init`
        // returned).
        for (index, input) in inputs.enumerated() { slots[index].input = UnownedLink.address(of: input) }
        self.inputSettled = inputSettled
    }

    deinit {
        for index in 0..<count { slots[index].settled?.release() }
        keptOutput?.release()
        slots.deinitialize(count: count)
        slots.deallocate()
        remaining.deallocate()
    }

    /// Registers a slot on every input (each registration retains the aggregator): the
    /// same `inputs` as `init`'s, which the caller holds until this returns.
    func start(_ inputs: UnsafeBufferPointer<AnyPromise>) {
        let owner = UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
        for (index, input) in inputs.enumerated() {
            let slot = slots + index
            slot.pointee.owner = owner
            // `node` is the slot's first field: the fire callback maps it back to the slot.
            let node = UnsafeMutableRawPointer(slot).assumingMemoryBound(to: pc_node.self)
            node.pointee.fire = aggregatorSlotFire
            _ = Unmanaged.passRetained(self)
            registerRawNode(node, on: input)
        }
    }

    /// True for the call that brings the countdown to zero (and so finishes).
    func countDown() -> Bool {
        countDownReachesZero(remaining)
    }

    /// The input at `index`, once it has settled (read after `countDown()` returned true,
    /// or from its own `inputSettled` call).
    func settledInput(at index: Int) -> AnyPromise {
        slots[index].settled.unsafelyUnwrapped.takeUnretainedValue()
    }

    func value<V: Sendable>(at index: Int, as type: V.Type) -> V {
        unsafeDowncast(settledInput(at: index), to: Promise<V>.self).storedValue
    }

    func result<V: Sendable>(at index: Int, as type: V.Type) -> Result<V, any Error> {
        unsafeDowncast(settledInput(at: index), to: Promise<V>.self).publishedResult
    }

    /// Every input's value, in input order (read after `countDown()` returned true).
    func values<V: Sendable>(as type: V.Type) -> [V] {
        perInput { value(at: $0, as: type) }
    }

    /// Every input's outcome, in input order (as `values(as:)`).
    func results<V: Sendable>(as type: V.Type) -> [Result<V, any Error>] {
        perInput { result(at: $0, as: type) }
    }

    /// One element per input, in input order. A loop over indices, not
    /// `(0..<count).map`: called from a combinator generic over the value, `map` would run
    /// unspecialised, through `Range`'s witness table at every step.
    private func perInput<T>(_ element: (Int) -> T) -> [T] {
        Array(unsafeUninitializedCapacity: count) { buffer, initialized in
            for index in 0..<count { (buffer.baseAddress.unsafelyUnwrapped + index).initialize(to: element(index)) }
            initialized = count
        }
    }

    /// The inputs that are still pending, retained: what a cancel of the output must
    /// reach (`AnyPromise.cancel`).
    func appendPendingInputs(to inputs: inout [AnyPromise]) {
        for index in 0..<count {
            if let input = UnownedLink.load(inputWord(slots + index)), input.isPending { inputs.append(input) }
        }
    }

    /// The inputs the slots still link (pending, or settled and kept), retained, in input
    /// order, until `limit` of them: what the output waits on (`WaitWalk`). Returns
    /// whether it looked at every slot, and whether some slot links no input any more (it
    /// died, or the aggregator let it go).
    func appendLinkedInputs(to inputs: inout [AnyPromise], limit: Int) -> (complete: Bool, unlinked: Bool) {
        var unlinked = false
        for index in 0..<count {
            guard inputs.count < limit else { return (false, unlinked) }
            if let input = UnownedLink.load(inputWord(slots + index)) {
                inputs.append(input)
            } else {
                unlinked = true
            }
        }
        return (true, unlinked)
    }

    /// An input settled. Until the output has settled the slot keeps the input (its value
    /// is part of the answer); after, the aggregator keeps nothing: the callback that
    /// finds the output settled with no other callback running retires it (`retire`), and
    /// inputs that settle later are not kept. So a settled aggregate that nobody holds
    /// keeps none of its inputs' values while another input stays pending
    /// (`race([work, shutdown])` in a loop), only the aggregator's own slots.
    fileprivate func slotFired(_ slot: UnsafeMutablePointer<AggregatorSlot>, source: AnyPromise) {
        var outputSettled = false
        if gateEnter(gate) {
            slot.pointee.settled = Unmanaged.passRetained(source)
            inputSettled(self, slots.distance(to: slot), source)
            outputSettled = keptOutput.unsafelyUnwrapped._withUnsafeGuaranteedRef { output in
                // After the gate's read-modify-write (and the input's publish before it).
                if output.isPending && wordAfterReadModifyWrite(cycleWatch) != 0 { rejectOutputIfItWaitsOnItself(output) }
                return !output.isPending
            }
        } else {
            // Retired: the input is not kept, so its link must not outlive it (the firing
            // holds it until this returns). `appendPendingInputs` may still run.
            UnownedLink.clear(inputWord(slot), ifPointingAt: UnownedLink.address(of: source))
        }
        if gateLeave(gate, request: outputSettled) { retire() }
    }

    /// Called by the cycle check's walk as it enters this aggregator from a promise that
    /// locks in (`WaitWalk`), before it looks at the inputs: the output of `race`, `any`,
    /// `all` or `and` waits on that promise only once no input can settle it any more,
    /// which an input settling later without settling the output may bring about
    /// (`all([a, b])` followed by `a`, then `b` fulfilled: only `a` can settle it now, and
    /// `a` waits on it). From here on, each input that settles without settling the
    /// output asks again (`rejectOutputIfItWaitsOnItself`). Dekker: the walk stores the
    /// watch and fences, then reads the inputs' states; an input publishes, then its slot
    /// reads the watch after the gate's read-modify-write. Either the walk sees the input
    /// settled, or the input's slot sees the watch.
    func watchForCyclesAsInputsSettle() {
        guard wordAfterReadModifyWrite(cycleWatch) == 0 else { return }
        storeWord(cycleWatch, Aggregator.watchWord(escapeHint: 0))
        fullFence()
    }

    /// The cycle watch's word: set (never 0, lock bit clear), with the index of the input
    /// the last recheck found to be a way out, where the next one starts.
    private static func watchWord(escapeHint index: Int) -> UInt { UInt(index + 1) << 1 }

    /// An input settled without settling the output, after a promise that waits on the
    /// output locked in: if every input still pending waits on the output, and no settled
    /// one settles it, nothing can settle it any more. Then the first pending input that
    /// follows a promise (the one whose lock-in made the cycle, as a rule) is rejected with
    /// `PromiseError.cycle`, as a lock-in that closes a cycle rejects itself, so that the
    /// cycle ends the same whichever came last, the lock-in or this settle (an outer
    /// `any` then wraps the error like any input's); with no such input, the output is.
    /// On the input's settling thread, inside the gate; no user code runs.
    ///
    /// An output its holder locked in to follow another promise (`resolve(with:)`) is no
    /// longer this aggregator's to settle: it waits on that promise, which its lock-in
    /// checked, so nothing is asked (an input that waits on it waits on that promise).
    ///
    /// Cost: the scan stops at the first input that is a way out (pending and not waiting
    /// on the output, or settled in a way that settles it), and starts at the one the last
    /// scan stopped at, which is where a way out is most likely still to be: inputs settled
    /// in order cost O(1) each, not a scan of every input.
    private func rejectOutputIfItWaitsOnItself(_ output: AnyPromise) {
        guard output.claimHint == UInt(PC_CLAIM_FREE) else { return }
        let start = max(Int(wordAfterReadModifyWrite(cycleWatch) >> 1) - 1, 0) % count
        var walk = WaitWalk(target: output)
        var waitsOnItself = false
        var follower: AnyPromise? = nil
        walk.asking(about: self) { walk in
            var sawPending = false
            for step in 0..<count {
                let index = (start + step) % count
                // Gone: it died pending (the gate keeps a retirement from clearing links
                // meanwhile), and its slot counts it, or has, as rejected with
                // `brokenPromise`. A way out only where a rejection settles the output.
                guard let input = UnownedLink.load(inputWord(slots + index)) else {
                    guard settledEarlyBy.settles(withTag: UInt(PC_REJECTED)) else { continue }
                    storeWord(cycleWatch, Aggregator.watchWord(escapeHint: index))
                    return
                }
                let tag = input.publishedTag
                if tag == UInt(PC_PENDING) {
                    // One read of the input's claim, for the walk's first step and for the
                    // follower: read again, the input's own lock-in check might have rejected
                    // it meanwhile, and the output would be rejected in its place, with a
                    // bare `cycle` where an `any` collects the follower's.
                    let claim = input.claimHint
                    guard walk.reaches(from: input, claim: claim, depth: 1) else {
                        storeWord(cycleWatch, Aggregator.watchWord(escapeHint: index))
                        return
                    }
                    sawPending = true
                    if follower == nil && claim == UInt(PC_CLAIM_FOLLOWING) { follower = input }
                } else if settledEarlyBy.settles(withTag: tag) {
                    return  // settling the output, if not done yet
                }
            }
            waitsOnItself = sawPending
        }
        // Locked in by its holder while the inputs were read: not ours to judge any more.
        guard waitsOnItself, output.claimHint == UInt(PC_CLAIM_FREE) else { return }
        if let follower {
            follower.rejectAsCycle(parent: nil)
        } else {
            output.rejectAsCycle(parent: nil, from: PC_CLAIM_FREE)
        }
    }

    /// Whether the aggregator retired: its output settled and what it kept was dropped,
    /// so a slot still registered on a pending input waits for nothing.
    fileprivate var isRetired: Bool {
        pc_word_load(gate) & UInt(PC_GATE_RETIRED) != 0
    }

    /// The output was cancelled: retires the aggregator now if no slot callback is
    /// running (one that is retires it when it leaves), so inputs that never settle do not
    /// keep the settled ones.
    func retireIfIdle() {
        _ = gateEnter(gate)
        if gateLeave(gate, request: true) { retire() }
    }

    /// Drops the settled inputs and the output; once, with no policy call running
    /// (`pc_gate_leave` elected us). A slot's unowned link to its input goes first, under
    /// its lock, since nothing holds that input's memory any more: a cancel of the output
    /// may still look for pending inputs (`appendPendingInputs`).
    private func retire() {
        for index in 0..<count {
            guard let settled = slots[index].settled else { continue }
            slots[index].settled = nil
            UnownedLink.clear(inputWord(slots + index), ifPointingAt: UInt(bitPattern: settled.toOpaque()))
            settled.release()
        }
        // A cancelled output's cancel reaches the inputs still pending through their slots'
        // links (`appendPendingInputs`), maybe only after this retirement (an input settled
        // between the cancel's publish and its look-up): those slots must not give up, or
        // a prune would clear the links first. The cancel settles those inputs, and their
        // slots then leave as any fired slot does.
        let outputCancelled = keptOutput?._withUnsafeGuaranteedRef { $0.isCancelled } ?? false
        keptOutput.take()?.release()
        // The slots still registered on pending inputs wait for nothing now: those inputs
        // may take them off (`observerGaveUp`), so that an input that outlives many
        // aggregates (`race([work, shutdown])` in a loop) keeps none of their slots. An
        // input given to a combinator counts as observed, so its error, if it comes after
        // its slot left, is not reported as unhandled either.
        for index in 0..<count where slots[index].settled == nil {
            guard let input = UnownedLink.load(inputWord(slots + index)) else { continue }
            input.noteErrorSeen()
            if !outputCancelled { input.observerGaveUp() }
        }
    }
}

/// For a pending input's prune (`AnyPromise.observerGaveUp`): whether `node`, an aggregator
/// slot registered on the input, belongs to a retired aggregator (its registration holds
/// the aggregator, so the slot is there to read).
func slotOfRetiredAggregator(_ node: UnsafeMutablePointer<pc_node>) -> Bool {
    let slot = UnsafeMutableRawPointer(node).assumingMemoryBound(to: AggregatorSlot.self)
    return Unmanaged<Aggregator>.fromOpaque(slot.pointee.owner.unsafelyUnwrapped)._withUnsafeGuaranteedRef { $0.isRetired }
}

/// The prune took `node`, a retired aggregator's slot, off the input at `input`: its link
/// to the input goes, then the registration's retain of the aggregator, as if it had fired.
func releaseRetiredAggregatorSlot(_ node: UnsafeMutablePointer<pc_node>, input: UInt) {
    let slot = UnsafeMutableRawPointer(node).assumingMemoryBound(to: AggregatorSlot.self)
    let owner = Unmanaged<Aggregator>.fromOpaque(slot.pointee.owner.unsafelyUnwrapped)
    UnownedLink.clear(inputWord(slot), ifPointingAt: input)
    owner.release()  // the registration's retain: may free the slot
}

/// The fire callback of an aggregator slot: runs the policy on the settling thread, inside
/// the input's firing, so that the output has settled before the input's settling call
/// returns (the first input to settle decides, on any thread). A slot that would run
/// inside `PC_SLOT_NESTING` (128) others on this thread (combinators nested directly, each
/// output the next one's input: `race([race([...])])`, or a fold `acc = race([acc, b])`)
/// is queued instead, holding the input for it, and the outermost slot run runs it before
/// it returns: nestings of any depth settle in bounded stack before the first input's
/// settling call returns (100,000 levels overflowed the stack before), the levels past
/// the limit once the levels below have fired.
func aggregatorSlotFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let slot = UnsafeMutableRawPointer(node).assumingMemoryBound(to: AggregatorSlot.self)
    let input: AnyPromise
    if let source {
        guard !SlotRuns.tooDeep else {
            // Held for the queued run: the firing may let the input go before it comes.
            slot.pointee.firedBy = UInt(bitPattern: AnyPromise.owner(ofCore: source).retain().toOpaque())
            SlotRuns.later(node)  // the registration's retain of the aggregator goes with it
            return
        }
        input = AnyPromise.owner(ofCore: source).takeUnretainedValue()
    } else {
        input = Unmanaged<AnyPromise>.fromOpaque(UnsafeRawPointer(bitPattern: slot.pointee.firedBy).unsafelyUnwrapped).takeRetainedValue()
        slot.pointee.firedBy = 0
    }
    let owner = Unmanaged<Aggregator>.fromOpaque(slot.pointee.owner.unsafelyUnwrapped)
    // A combinator counts as reading its inputs' errors, whether its policy reads this one
    // (`all`'s first) or not (`any` counting a rejection down, a slot of a retired
    // aggregate): none is reported as an unhandled rejection.
    input.noteErrorSeenIfRejected()
    SlotRuns.begin()
    owner.takeUnretainedValue().slotFired(slot, source: input)
    SlotRuns.end()
    owner.release()  // the registration's retain
}

/// The locked word of a slot's `input`.
func inputWord(_ slot: UnsafeMutablePointer<AggregatorSlot>) -> UnsafeMutablePointer<UInt> {
    (UnsafeMutableRawPointer(slot) + MemoryLayout<AggregatorSlot>.offset(of: \AggregatorSlot.input)!)
        .assumingMemoryBound(to: UInt.self)
}

/// Its input is dying pending (at `input`, in its deinit): clears the slot's unowned link
/// to it before its memory goes. The slot then fires with the input's broken outcome.
func clearAggregatorSlotInput(_ node: UnsafeMutablePointer<pc_node>, inputDyingAt input: UInt) {
    let slot = UnsafeMutableRawPointer(node).assumingMemoryBound(to: AggregatorSlot.self)
    UnownedLink.clear(inputWord(slot), ifPointingAt: input)
}


extension AnyPromise {
    /// Links this combinator output, a root nobody else has seen yet, to the aggregator
    /// that settles it (see `RareState.aggregatorMemory`). One allocation, the rare
    /// state, where an `onCancel` closure took three (its box, its context, and the weak
    /// reference's side table).
    final func recordAggregator(_ aggregator: Aggregator) {
        let address = Unmanaged.passUnretained(aggregator).toOpaque()
        SwiftRuntime.unownedRetain(address)  // the rare state's hold, released by its deinit
        rareState.aggregatorMemory = address
    }

    /// A root with a rare state settled by its holder or by the promise it followed (not
    /// cancelled: `cancel` does this itself): if it is a combinator's output, its
    /// aggregator lets go of the inputs it kept now, not when the next input settles, and
    /// its slots on the inputs still pending give up. So an output settled from outside
    /// keeps nothing either (`race([work, shutdown])` in a loop, each race rejected by hand).
    @usableFromInline @inline(never)
    final func settledRootLetsGoOfItsInputs() {
        aggregatorIfAlive?.retireIfIdle()
    }

    /// The aggregator that settles this combinator output, retained, if it is still
    /// alive; nil for any other promise (two loads for a root, none for a derived one).
    final var aggregatorIfAlive: Aggregator? {
        guard isRoot, let address = existingRareState?.aggregatorMemory else { return nil }
        return SwiftRuntime.tryRetain(address).map { Unmanaged<Aggregator>.fromOpaque($0).takeRetainedValue() }
    }
}
