import CPromiseCore

// The cycle check's walk: from the promise a follower would wait on, along what that
// promise waits on (followees, pending parents, combinator inputs), looking for the
// follower itself. Its callers and the records it reads are in Following.swift.

/// The walk of `wouldWaitOnItself`: from a promise, along what it waits on, looking for
/// the target (the promise that locks in).
///
/// Along single links (a followee, a pending parent): one try-retain (`swift_tryRetain`,
/// a CAS) per promise, with no lock and no allocation, to the first settled or
/// parentless promise. When `source` is settled, or pending with no parent and following
/// nothing (the common case: a handler returns a fresh or settled promise), two loads.
///
/// At a combinator's pending output the walk branches, over the inputs its slots still
/// link (a try-retain each, under the slot's lock). An `allSettled` output waits on each
/// input: any that waits on the target closes a cycle. Any other output may be settled
/// by one input (`race`, `any`, and `all` or `and`, which reject with the first error):
/// it waits on the target only if no input can settle it, that is if every pending input
/// waits on the target (asked of each in turn, 64 levels of such outputs deep at most)
/// and no settled one is settling it. Once branched, the walk remembers what it met (a
/// set of addresses: a chain shared by many inputs is walked once, outside those nested
/// questions) and tries at most `budget` more promises, inputs included. A cycle that
/// only a longer walk would find is not looked for, and stays pending as it would
/// without the check: a lock-in costs a bounded amount however many promises wait on one
/// combinator.
struct WaitWalk {
    /// How many promises a walk tries once it has branched.
    static let budget = 1_024
    /// How deep a walk goes into the inputs of outputs that one input may settle (`race`,
    /// `any`, `all`, `and`) nested in each other's paths: each level asks whether no input
    /// can settle its output (every pending one waits on the target, and no settled one
    /// settles it). A recursion, a few frames a level: the budget bounds the work, this
    /// the stack.
    static let nesting = 64
    /// How far apart the followers of a walked run that record its end lie at most (see
    /// `waits`): walks from inside the run take at most that many steps to a skip, for a
    /// rare state made per that many followers.
    static let checkpointSpacing = 32

    private let target: UnsafeMutableRawPointer
    private var budget = WaitWalk.budget
    private var branched = false
    /// Whether the walk may skip along recorded ends of follow runs (see `waits`).
    private let usesChainEnds: Bool
    /// The followers whose recorded end it took (none: it skipped nothing); taking one
    /// twice means it went round a loop that skipped the target (see `waits`).
    private var chainEndsTaken: Set<UnsafeMutableRawPointer> = []
    private var loopedThroughChainEnds = false
    /// The walk epoch when the walk began (see `waits`).
    private let epoch: UInt
    /// Once branched: the promises and aggregators met, which `kept` keeps alive for the
    /// walk, so that no address in the set is reused by another object meanwhile.
    private var seen: Set<UnsafeMutableRawPointer> = []
    private var kept: [AnyObject] = []
    /// The aggregators whose question "can no input settle the output?" is being asked,
    /// outermost first. An input whose chain comes back to one of them waits on that
    /// output, so it is no way out of it: the answer for that branch is yes, not the
    /// nesting limit's "cannot tell" (two followers of one `all`, say).
    private var asked: [UnsafeMutableRawPointer] = []
    /// The answers found, while asking about the aggregators in `asked`, to whether an
    /// output one input may settle waits on the target (`enter`), each with how many
    /// aggregators were being asked about then. Inputs that share the chain below
    /// (`all([next, next])` at each level of a cycle) reach one output many times; asked
    /// again, it would take twice the tries per level, and the budget would be spent from
    /// about seven levels on. An answer holds while those it was found under are still
    /// asked about: a "yes" also under more of them (an input that comes back to one
    /// asked about waits on it), a "no" only under the same ones. Dropped as they are.
    private var answers: [UnsafeMutableRawPointer: (level: Int, waits: Bool)] = [:]
    private var answersInOrder: [(aggregator: UnsafeMutableRawPointer, level: Int)] = []

    init(target: AnyPromise, usesChainEnds: Bool = false) {
        self.target = UnsafeMutableRawPointer(Unmanaged.passUnretained(target).toOpaque())
        self.usesChainEnds = usesChainEnds
        // After the full fence that followed the store of the link being checked (see
        // `pc_walk_epoch_advance` for why that order matters).
        epoch = usesChainEnds ? WalkEpoch.current : 0
    }

    /// The tag of a chain end recorded through pending children, in walk epoch `epoch`:
    /// never 0, which tags an end reached through follow links only.
    static func recordTag(_ epoch: UInt) -> UInt { epoch << 1 | 1 }

    /// Whether `source` waits on `target` (the promise that locks in): the walk from a
    /// lock-in or a run's new step.
    ///
    /// Linear chains of followers, however they were built: a chain built inner-first
    /// whose every level is observed before it locks in walks, at each new level, the
    /// whole chain below it, which made such chains quadratic. So, before it branches,
    /// the walk records, at the first follower of each run of waits it walks, where the
    /// run ended (a pending promise that follows nothing and waits on no parent: a root,
    /// a combinator's output, a `timeout` child), and a later walk that meets that
    /// follower skips there. A run is made of follow links and of the links of pending
    /// children to their parents. Follow links are written once, so while every follower
    /// of the run is still pending the skip leads where the links would; a follower of it
    /// that settled ends its chain for the exact walk, which the skip does not see. So
    /// the skipping walk reaches everything the exact one does, and more only through
    /// followers settled meanwhile (which stop waiting): its "no" is exact, and a "yes"
    /// that took a skip is asked again of the exact walk. The skip may also jump over the
    /// target itself, when another walk recorded the run while the target was locking in:
    /// then the walk goes round a loop of skips (a cycle through the target, seen from
    /// after it) and takes one skip twice, and the exact walk answers instead.
    ///
    /// A pending child waits on its parent only until it settles (which, like a
    /// follower's settle, only stops a wait) or locks in to follow another promise (which
    /// changes what it waits on). So a run goes on through a pending child only after
    /// marking it (`markWalkedThrough`), and a child so marked that locks in advances the
    /// walk epoch (`recordFollowee`); an end recorded through children carries the epoch
    /// of its walk (`recordTag`), and a walk takes it only in that epoch, which it read
    /// as it began. Else the walk takes the end of the record's follow links, recorded
    /// beside it: the first child it went through. (A walk's epoch is read after the link
    /// it checks is stored and fenced, so a child that locks in once the walk has read it
    /// sees that link in its own check: `pc_walk_epoch_advance`.) Levels that alternate a
    /// follow and a pending child (each following a `map` of the level below), built
    /// inner-first and observed at every level, so take O(1) steps a level while no such
    /// child locks in anywhere; while they do, as many as the follow links alone allow
    /// (each dearer: the marks, and records made that a later walk cannot take).
    ///
    /// Each follower records one end at a time; the end it holds (by its memory) may be
    /// stale (the chain grew at its far end since), and the walk goes on from there, and
    /// then records the end it found at every follower it skipped from, in place of the
    /// stale one, so that a chain growing at its far end while side followers lock in to
    /// its head costs each walk the links added since the last, not one more skip each
    /// time. The run's later followers record the same end when they have a rare state
    /// already (a root that follows keeps its link there), and so does every
    /// `checkpointSpacing`-th, so that walks starting at each level in turn (a side
    /// follower locking in to each level of a chain, one after another) reach a recorded
    /// end within that many links. Cost: a chain walked inner-first takes O(1) steps per
    /// new level; a walk from any level of a chain walked before, at most
    /// `checkpointSpacing` steps; one allocation (the follower's rare state) per end
    /// recorded at a run's first follower, and one per `checkpointSpacing` followers of a
    /// walked chain that have no rare state.
    static func waits(from source: AnyPromise, on target: AnyPromise) -> Bool {
        var walk = WaitWalk(target: target, usesChainEnds: true)
        let reached = walk.reaches(from: source)
        guard !walk.chainEndsTaken.isEmpty && (reached || walk.loopedThroughChainEnds) else { return reached }
        var exact = WaitWalk(target: target)
        return exact.reaches(from: source)
    }

    /// Where a promise's single links end.
    private enum End {
        case target
        case elsewhere
        /// At `output`, which the library settles from what it waits on: a combinator's
        /// aggregator, or a run's steps.
        case combinator(any WaitedOnByOutput, output: AnyPromise)
    }

    /// Runs `body` (an aggregator's recheck, `Aggregator.rejectOutputIfItWaitsOnItself`)
    /// with `aggregator` among those asked about: an input whose chain comes back to it
    /// waits on it, as in `enter`.
    mutating func asking<R>(about aggregator: AnyObject, _ body: (inout WaitWalk) -> R) -> R {
        branched = true
        asked.append(UnsafeMutableRawPointer(Unmanaged.passUnretained(aggregator).toOpaque()))
        defer { stopAsking() }
        return body(&self)
    }

    /// Ends the question about the innermost aggregator asked about: the answers found
    /// under it no longer hold.
    private mutating func stopAsking() {
        asked.removeLast()
        while let last = answersInOrder.last, last.level > asked.count {
            answersInOrder.removeLast()
            if answers[last.aggregator]?.level == last.level { answers[last.aggregator] = nil }
        }
    }

    /// An answer found before for the aggregator at `address` that still holds (see
    /// `answers`).
    private func answerFound(for address: UnsafeMutableRawPointer) -> Bool? {
        guard let answer = answers[address], answer.waits || answer.level == asked.count else { return nil }
        return answer.waits
    }

    private mutating func record(_ waits: Bool, for address: UnsafeMutableRawPointer) -> Bool {
        guard !asked.isEmpty else { return waits }  // the outermost walk remembers `seen`
        answers[address] = (asked.count, waits)
        answersInOrder.append((address, asked.count))
        return waits
    }

    /// Whether `source` waits on the target. `depth`: how many levels of outputs that one
    /// input may settle the walk is inside. Those levels neither use nor fill the set of
    /// what was met (a chain met before may reach the target, which "met" does not say),
    /// and spend the same budget.
    mutating func reaches(from source: AnyPromise, depth: Int = 0) -> Bool {
        reaches(from: source, claim: source.claimHint, depth: depth)
    }

    /// `reaches(from:depth:)`, taking the source's claim as the caller read it (the
    /// recheck picks its follower by that same read: `rejectOutputIfItWaitsOnItself`).
    mutating func reaches(from source: AnyPromise, claim sourceClaim: UInt, depth: Int) -> Bool {
        var branches: [AnyPromise] = []  // inputs of combinators met, still to walk
        var start: AnyPromise? = source
        var claimRead: UInt? = sourceClaim  // for the first step only
        while let current = start {
            defer { claimRead = nil }
            switch follow(from: current, claim: claimRead, remembering: depth == 0) {
            case .target: return true
            case .elsewhere: break
            case .combinator(let aggregator, let output):
                if enter(aggregator, of: output, depth: depth, branches: &branches) { return true }
            }
            start = branches.popLast()
        }
        return false
    }

    /// Follows the single links from `start` (a followee, a pending parent) to where they
    /// end. Once the walk branched, each promise tried costs one of the budget, and, with
    /// `remembering`, one met before ends the chain (it was walked from there already).
    /// `claim`: `start`'s claim if the caller read it already (read here otherwise).
    private mutating func follow(from start: AnyPromise, claim startClaim: UInt? = nil, remembering: Bool) -> End {
        var current = start
        var claimRead = startClaim
        // The run of waits being walked (see `waits`; unbranched walks that skip only):
        // its first follower, and how many links it has taken.
        var runStart: AnyPromise? = nil
        var runLinks = 0
        // The followers of the run that record its end: the first, those with a rare state
        // (a root that follows keeps its link there; a follower skipped from has one),
        // and every `checkpointSpacing`-th; for each, whether the run went through a
        // pending child after it, and the first such child. Those from
        // `beforeFirstChild` on have met none yet.
        var recorders: [(follower: AnyPromise, throughChildren: Bool, firstChild: AnyPromise?)] = []
        var beforeFirstChild = 0
        func wentThrough(firstChild child: AnyPromise?) {
            for index in beforeFirstChild..<recorders.count {
                recorders[index].throughChildren = true
                recorders[index].firstChild = child
            }
            beforeFirstChild = recorders.count
        }
        while true {
            let next: UnsafeMutableRawPointer?
            let claim = claimRead ?? current.claimHint
            claimRead = nil
            if claim == UInt(PC_CLAIM_FOLLOWING) {
                // Locked in but its link not recorded yet: it waits on nobody we can see,
                // and its own check, after recording, sees our link (the fences).
                if usesChainEnds && !branched {
                    if runStart == nil || current.existingRareState != nil
                        || runLinks % WaitWalk.checkpointSpacing == 0 {
                        recorders.append((current, false, nil))
                    }
                    if runStart == nil { runStart = current }
                    runLinks += 1
                    if let skip = current.followChainEnd(inEpoch: epoch) {
                        let taken = UnsafeMutableRawPointer(Unmanaged.passUnretained(current).toOpaque())
                        guard chainEndsTaken.insert(taken).inserted else {
                            loopedThroughChainEnds = true
                            return .elsewhere
                        }
                        if skip.throughChildren { wentThrough(firstChild: skip.firstChild) }
                        if isTarget(skip.end) { return .target }
                        guard skip.end.isPending else { return .elsewhere }
                        current = skip.end
                        continue
                    }
                }
                next = current.followeeAddress
            } else if !current.isPending {
                return .elsewhere
            } else if runStart != nil, let parent = current.parentAddress,
                      current.parentWord & ParentLink.settledBesidesParent == 0 {
                // A pending child inside a run: it waits on its parent, and the run goes on
                // through it, marked, so that a skip recorded over it ends if it locks in
                // to follow another promise instead (see `waits`).
                let claimAfterMark = current.markWalkedThrough()
                if claimAfterMark != UInt(PC_CLAIM_FREE) {
                    // Locked in meanwhile: look again. Or its settle is decided (not yet
                    // published, which the walk does not wait for): it waits on nothing.
                    guard claimAfterMark == UInt(PC_CLAIM_FOLLOWING) else { return .elsewhere }
                    claimRead = claimAfterMark
                    continue
                }
                wentThrough(firstChild: current)
                runLinks += 1
                next = parent
            } else {
                // Pending and following nothing: the run of waits ends here.
                if runLinks >= 2 {
                    let tag = WaitWalk.recordTag(epoch)
                    for recorder in recorders {
                        recorder.follower.recordFollowChainEnd(current, tag: recorder.throughChildren ? tag : 0,
                                                               firstChild: recorder.firstChild)
                    }
                }
                runStart = nil
                runLinks = 0
                recorders.removeAll()
                beforeFirstChild = 0
                if let parent = current.parentAddress {
                    // A child waits on its parent while it is pending, unless something
                    // else settles it too (`timeout`'s timer).
                    guard current.parentWord & ParentLink.settledBesidesParent == 0 else { return .elsewhere }
                    next = parent
                } else if let settler = current.settlerIfAlive {
                    return .combinator(settler, output: current)
                } else {
                    return .elsewhere
                }
            }
            guard let next else { return .elsewhere }
            if next == target { return .target }
            if branched {
                guard budget > 0 else { return .elsewhere }
                budget -= 1
                if remembering && !seen.insert(next).inserted { return .elsewhere }
            }
            // Alive, or the chain ends here: nobody waits on a dead promise any more.
            guard let alive = HeldMemory.promiseIfAlive(at: next), alive.isPending else { return .elsewhere }
            if branched { kept.append(alive) }
            current = alive
        }
    }

    /// At a combinator's pending output: true if it waits on the target for sure; else,
    /// for `allSettled`, its inputs still pending go to `branches`. At most `budget`
    /// inputs are looked at.
    private mutating func enter(_ aggregator: any WaitedOnByOutput, of output: AnyPromise, depth: Int,
                                branches: inout [AnyPromise]) -> Bool {
        branched = true
        let address = UnsafeMutableRawPointer(Unmanaged.passUnretained(aggregator as AnyObject).toOpaque())
        if asked.contains(address) { return true }  // back at an output being asked about
        if depth == 0 {
            guard seen.insert(address).inserted else { return false }
        }
        if let waits = answerFound(for: address) { return waits }
        kept.append(aggregator)
        let early = aggregator.settledEarlyBy
        // Before the inputs are read: one that settles after this look, without settling
        // the output, may leave it waiting on the target after all.
        if early != .nothing { aggregator.watchForCyclesAsInputsSettle() }
        var inputs: [AnyPromise] = []
        let limit = max(budget, 0)
        let (complete, unlinked) = aggregator.appendLinkedInputs(to: &inputs, limit: limit)
        budget -= inputs.count
        if early == .nothing {
            // `allSettled` waits on each input still pending.
            if inputs.contains(where: isTarget) { return true }
            branches += inputs.filter(\.isPending)
            return false
        }
        // One input may settle the output first: it waits on the target only if no input
        // can, looking at all of them (an input past the budget might).
        guard complete, depth < WaitWalk.nesting else { return record(false, for: address) }
        return record(noInputCanSettle(output, inputs: inputs, unlinked: unlinked, early: early,
                                       asking: address, depth: depth), for: address)
    }

    private func isTarget(_ promise: AnyPromise) -> Bool {
        UnsafeMutableRawPointer(Unmanaged.passUnretained(promise).toOpaque()) == target
    }

    /// For `enter`: whether none of `inputs` (of the aggregator at `address`, any of which
    /// may settle `output`) can settle it, because each pending one waits on the target
    /// and no settled one settles it.
    private mutating func noInputCanSettle(_ output: AnyPromise, inputs: [AnyPromise], unlinked: Bool,
                                           early: Aggregator.SettledEarlyBy, asking address: UnsafeMutableRawPointer,
                                           depth: Int) -> Bool {
        if unlinked {
            // A combinator's input gone from its slot died pending (its slot counts it, or
            // has, as rejected with `brokenPromise`), or a retired aggregator let it go
            // once the output had settled. For `any`, which no rejection settles, an input
            // that died is no way out, if the output is still pending after the links
            // were read (no retirement cleared them then). For the others a rejection
            // settles the output (and a run's gone step may be one not made yet): a way
            // out.
            guard !early.settles(withTag: UInt(PC_REJECTED)), output.isPending else { return false }
        }
        asked.append(address)
        defer { stopAsking() }
        var waitsOnTarget = false
        for input in inputs where !isTarget(input) {
            let tag = input.publishedTag
            if tag == UInt(PC_PENDING) {
                guard reaches(from: input, depth: depth + 1) else { return false }
                waitsOnTarget = true
            } else if early.settles(withTag: tag) {
                return false  // settling the output, if not done yet
            }
        }
        return waitsOnTarget || inputs.contains(where: isTarget)
    }
}
