// Combinators that run user work on inputs a few at a time: `all(_:maxConcurrent:on:_:)`,
// and `sequence`, which is the same with one at a time. (`retry`, which runs one step at a
// time too but on no inputs, is in Promise+Retry.swift.)

/// A run of `work` over inputs, at most `limit` promises in flight, pulling the inputs
/// lazily: what it holds is bounded by `limit` (the inputs in flight and weak links to
/// their promises), not by how many inputs there are, except for the results it returns.
///
/// One thread at a time pulls inputs and starts work (`pumping`): a completion while
/// another thread pumps only hands it a free slot, so an `.immediate` run of a million
/// settled inputs loops instead of recursing, and the input iterator is only ever used by
/// the pumping thread, never under the lock. The first error (or a cancel of the output)
/// stops the pulling and cancels what is in flight. An outside settle of the output (or a
/// lock-in to follow another promise, `resolve(with:)`, which tells the run through
/// `outputLockedIn`) stops the pulling too; what is in flight goes on, as an aggregate's
/// inputs do, but the run's observers on it give up (`StepObserver`), and the run lets go
/// of its results, the work and the inputs, so a step that lives on keeps only the run's
/// shell (with its output), until its next prune: at once, if the run's observer is the
/// first on the step to give up (a step made for the run, `longLived.then { }`).
///
/// Ownership: the run is the output's resolver. It holds the output; the output's hook
/// (`OutcomeHook`) holds the run weakly (a strong link back would keep both alive for ever
/// once nothing else holds the run). The work queued on the context and the observers on
/// the steps in flight hold the run. A context that lets go of a step's work unrun (one
/// other than Dispatch's queues, which run every block: see `WatchedWork`) breaks the run
/// at once, as a first error does: the output rejects with `PromiseError.brokenPromise`,
/// what is in flight is cancelled, and no more starts; other steps in flight must not keep
/// it waiting, nor start inputs it can no longer use. And if everything that held the run
/// let go of it while the output is pending, the run's deinit rejects the output so, a
/// moment later on a lane of the library's own, as a promise that dies pending breaks its
/// observers.
///
/// Threading: its spin lock (`SpinLocked`), held for a few field updates, never around a
/// call out.
private final class FanOut<Input: Sendable, Value: Sendable>: SpinLocked, WaitedOnByOutput, @unchecked Sendable {
    // Only the pumping thread touches it. Type-erased: a closure may capture the
    // metatype of `Input` (Sendable), not that of the caller's sequence type.
    private var iterator: AnyIterator<Input>
    /// One slot per input started, in input order: its value once its work fulfilled.
    private var results: [Value?] = []
    private var finished = 0
    private var inFlight: [Int: WeakStep] = [:]
    private var pumping = false
    private var exhausted = false
    private var stopped = false
    /// Why the run stopped, if a cancel stopped it: given to a step that starts after.
    private var stopReason: (any Error)?
    private let limit: Int
    private let output = Promise<[Value]>(madeByLibrary: ())
    private let context: any ExecutionContext
    /// Whether `context` runs every work it is given, so that a step needs no `WatchedWork`.
    private let contextRunsEveryWork: Bool
    /// The user's work; let go of when the run stops (under the lock).
    private var work: (@Sendable (Input) throws -> Promise<Value>)?
    /// A run with more than one slot, once a cycle check looked into it (a promise locking
    /// in to follow the output walked through it, or a step started waiting on the
    /// output): each step that starts or finishes, and the end of the inputs, ask again
    /// whether every step in flight waits on the output
    /// (`rejectOutputIfEveryStepWaitsOnIt`). Under the lock.
    private var cycleWatched = false
    /// The slot whose step the last such look found to be a way out (pending, and not
    /// waiting on the output): looked at first next time, so that a look costs one walk
    /// while that step is in flight. Under the lock.
    private var wayOutHint: Int?

    private struct WeakStep {
        weak var promise: AnyPromise?
    }

    init(_ inputs: some Sequence<Input>, limit: Int, context: any ExecutionContext,
         work: @escaping @Sendable (Input) throws -> Promise<Value>) {
        iterator = AnyIterator(inputs.makeIterator())
        self.limit = limit
        self.context = context
        contextRunsEveryWork = context.runsEveryWork
        self.work = work
    }

    deinit {
        // Nothing holds the run any more, and nothing settled its output: nothing can.
        output.breakOnALaneIfPending()
    }

    /// Starts the run; the promise of its results.
    func run() -> Promise<[Value]> {
        output.recordRun(self)  // for the cycle check (see `appendLinkedInputs`)
        OutcomeHook { [weak self] output in
            output.forgetRun()
            if output.isCancelled {
                self?.stop(cancelling: output.failureOrCancellation)
            } else {
                self?.stop(cancelling: nil)  // by the run, or from outside
            }
        }.register(on: output)
        pump()
        return output
    }

    /// Starts work while fewer than `limit` are in flight, unless another thread is at it
    /// (it will see the slot freed). Only the pumping thread appends to `results`, so a
    /// slot it found free stays free while it pulls the next input outside the lock.
    private func pump() {
        guard withLock({ () -> Bool in
            if pumping { return false }
            pumping = true
            return true
        }) else { return }
        while true {
            let (canStart, stoppedNow) = withLock { () -> (Bool, Bool) in
                if stopped { return (false, true) }  // still pumping: the inputs go first
                if exhausted || results.count - finished >= limit || !output.isFreeToSettle {
                    pumping = false
                    return (false, false)
                }
                return (true, false)
            }
            if stoppedNow { letGoOfInputs() }
            guard canStart else { break }
            guard let input = iterator.next() else {
                let (done, stoppedNow, watched) = withLock { () -> (Bool, Bool, Bool) in
                    exhausted = true
                    if stopped { return (false, true, false) }  // still pumping: the inputs go first
                    pumping = false
                    return (finished == results.count, false, cycleWatched)
                }
                if stoppedNow { letGoOfInputs() }
                // With no input left, the steps in flight may all wait on the output.
                if done { finish() } else if watched { rejectOutputIfEveryStepWaitsOnIt() }
                break
            }
            let index = withLock { () -> Int in
                results.append(nil)
                return results.count - 1
            }
            start(input, at: index)
        }
    }

    /// For the cycle check (`WaitedOnByOutput`): the steps in flight, on which the output
    /// waits, and nothing else (`stepsTheOutputWaitsOn`).
    ///
    /// A run that takes one step at a time (`sequence`, `all(_:maxConcurrent: 1)`) waits on
    /// its step alone, and only its failure settles the output early (its fulfilment starts
    /// the next step, checked as it starts). With more slots, any step that settles is a
    /// way out (`settledEarlyBy`): a fulfilled one frees its slot for the next input, or
    /// ends the run.
    func appendLinkedInputs(to inputs: inout [AnyPromise], limit: Int) -> (complete: Bool, unlinked: Bool) {
        let (steps, complete, unlinked) = stepsTheOutputWaitsOn()
        guard complete, steps.count <= limit else { return (false, unlinked) }
        inputs += steps.map(\.step)
        return (true, false)
    }

    /// The steps in flight with their slots, retained, and whether the output waits on
    /// them and nothing else: every slot taken has its step made (a slot whose work is
    /// queued on the context, or running, may still make a step that settles the output),
    /// and no other step starts before one of them settles, because the inputs ran out or
    /// every slot is taken (a slot just freed is the next input's, which the pumping
    /// thread may be pulling). `unlinked` if a step is gone or being made.
    ///
    /// The steps are retained under the lock and let go of outside it, by the caller: a
    /// step whose last reference is ours dies pending, and the run's observer on it calls
    /// back in.
    private func stepsTheOutputWaitsOn() -> (steps: [(slot: Int, step: AnyPromise)], complete: Bool, unlinked: Bool) {
        withLock {
            var steps: [(slot: Int, step: AnyPromise)] = []
            let taken = results.count - finished
            guard !stopped, taken > 0, inFlight.count == taken, exhausted || taken == limit else {
                return (steps, false, false)
            }
            for (slot, weakStep) in inFlight {
                guard let step = weakStep.promise else { return (steps, false, true) }
                steps.append((slot, step))
            }
            return (steps, true, false)
        }
    }

    /// One slot: the first error rejects the output. More: any step that settles may
    /// settle it, or start the step that does.
    var settledEarlyBy: Aggregator.SettledEarlyBy { limit == 1 ? .failure : .anyOutcome }

    /// The walk of a promise locking in to follow the output is about to look at the steps
    /// (`WaitWalk`): a run with more slots asks again as steps start and finish, since a
    /// step that settles without settling the output may leave it waiting on that promise.
    /// (A run with one slot checks the step it starts, which waits on it alone.)
    func watchForCyclesAsInputsSettle() {
        guard limit > 1 else { return }
        withLock { cycleWatched = true }
    }

    /// For a run with more slots that a cycle check looked into: rejects the output with
    /// `PromiseError.cycle` if every step in flight waits on it (nothing else can settle
    /// it: no other step starts before one of these settles). Starts with the step that
    /// was a way out last time, so a look costs one walk while that step is in flight.
    private func rejectOutputIfEveryStepWaitsOnIt() {
        guard output.isFreeToSettle else { return }
        var walk = WaitWalk(target: output)
        let waitsOnItself = walk.asking(about: self) { walk -> Bool in
            if let hinted = withLock({ wayOutHint.flatMap { inFlight[$0]?.promise } }), isWayOut(hinted, &walk) {
                return false
            }
            let (steps, complete, _) = stepsTheOutputWaitsOn()
            guard complete else { return false }
            guard let wayOut = steps.first(where: { isWayOut($0.step, &walk) }) else { return true }
            withLock { wayOutHint = wayOut.slot }
            return false
        }
        // Locked in by its holder while the steps were read: not ours to judge any more.
        guard waitsOnItself, output.isFreeToSettle else { return }
        output.rejectOutputAsCycle()
    }

    /// Whether `step` may settle the output, or start the step that does: it settled, or
    /// it is pending without waiting on the output.
    private func isWayOut(_ step: AnyPromise, _ walk: inout WaitWalk) -> Bool {
        !step.isPending || !walk.reaches(from: step, depth: 1)
    }

    /// For the pumping thread of a stopped run: lets go of the input sequence (which only
    /// that thread touches), then stops pumping.
    private func letGoOfInputs() {
        iterator = AnyIterator { nil }
        withLock { pumping = false }
    }

    private func start(_ input: Input, at index: Int) {
        let startStep: @Sendable () -> Void = { [self] in
            guard output.isFreeToSettle else { return }  // settled or locked in: start nothing more
            // The work, once per input: a context that runs it twice (a contract broken)
            // must not start a second step for the slot. The slot is claimed under the lock
            // (a placeholder in `inFlight`, or its value once done).
            guard let work = withLock({ () -> (@Sendable (Input) throws -> Promise<Value>)? in
                // (Stopped, the run let go of its work and its results: nothing to claim.)
                guard let work = self.work, inFlight[index] == nil, case .none = results[index] else { return nil }
                inFlight[index] = WeakStep(promise: nil)
                return work
            }) else { return }  // stopped, or started already
            let step: Promise<Value>
            do {
                step = try work(input)
            } catch {
                return fail(error)
            }
            let (stoppedAlready, reason) = withLock { () -> (Bool, (any Error)?) in
                if !stopped { inFlight[index] = WeakStep(promise: step) }
                return (stopped, stopReason)
            }
            if stoppedAlready {
                // A cancel reaches the step too; any other end leaves it alone. Either way
                // the run took it, so its error is read (it may have one already).
                step.noteErrorSeen()
                if let reason { step.cancelOwnedWork(reason: reason) }
                return
            }
            StepObserver<Value>(until: output) { [self] result in
                switch result {
                case .success(let value): complete(index, with: value)
                case .failure(let error): fail(error)
                }
            }.register(on: step)
            // A step that waits on the output would never settle it, nor let another start.
            if limit == 1 { output.rejectAsCycleIfWaited(onBy: step) } else { lookForACycle(through: step) }
            // Settled or locked in meanwhile, after `stop` had looked for this step's
            // observer: it gives up now.
            if !output.isFreeToSettle { step.runStoppedWatching() }
        }
        if contextRunsEveryWork { return context.execute(startStep) }
        // Weak: a run nothing else holds is freed with the work, and its deinit breaks it.
        context.execute(WatchedWork(startStep, ifDropped: { [weak self] in self?.fail(PromiseError.brokenPromise) }).work)
    }

    private func complete(_ index: Int, with value: Value) {
        let (done, watched) = withLock { () -> (Bool, Bool) in
            if stopped { return (false, false) }  // its results were let go
            results[index] = value
            inFlight[index] = nil
            finished += 1
            return (exhausted && finished == results.count && !stopped, cycleWatched)
        }
        if done { return finish() }
        pump()
        // The step that settled was a way out; with no other to start, the steps left may
        // all wait on the output.
        if watched { rejectOutputIfEveryStepWaitsOnIt() }
    }

    /// For a run with more slots, a step it just started observing: if the step waits on
    /// the output, or a cycle check looked into the run before, asks whether every step
    /// in flight waits on the output. The run recorded the step first; a promise locking
    /// in to follow the output at the same time recorded its link, fenced, then walks to
    /// the run's steps: with the fence here, one of the two sees the other (as in
    /// `AnyPromise.rejectAsCycleIfWaited`). Cost for a step that has settled, or is a
    /// fresh root: a fence, a few loads and the lock.
    private func lookForACycle(through step: AnyPromise) {
        fullFence()
        guard output.isPending else { return }
        let waits = WaitWalk.waits(from: step, on: output)
        let watched = withLock { () -> Bool in
            if waits { cycleWatched = true }
            return cycleWatched
        }
        if watched { rejectOutputIfEveryStepWaitsOnIt() }
    }

    private func finish() {
        // (Stopped meanwhile, the run let go of its results: the output settled already.)
        guard let values = withLock({ stopped ? nil : results.map { $0! } }) else { return }
        output.fulfill(values)
    }

    /// The first error: the output rejects with it, and what is in flight is cancelled.
    /// The run stops first, taking the steps in flight: the output's hook, which runs
    /// inside the reject, then finds nothing left to do.
    private func fail(_ error: any Error) {
        let reason = CancellationError()
        guard let steps = stopTakingSteps(reason: reason) else { return }  // stopped already
        if output.reject(error) {
            for step in steps { step.cancelOwnedWork(reason: reason) }
        } else if output.isClaimedAsCancel {
            // A cancel came first (claimed, perhaps not published yet), and its hook finds
            // the run stopped: the cancel reaches what is in flight from here, with its
            // reason, once published (at once if it is).
            output.onCancel(withReason: { cancelReason in
                for step in steps { step.cancelOwnedWork(reason: cancelReason) }
            })
        } else {
            // Settled or locked in meanwhile by someone else: what is in flight goes on.
            for step in steps { step.runStoppedWatching() }
        }
    }

    /// The output locked in to follow another promise: the run stops as for an outside
    /// settle (`WaitedOnByOutput`).
    func outputLockedIn() {
        stop(cancelling: nil)
    }

    /// Pulls no more inputs, and cancels the steps in flight with `reason`; with none (the
    /// output settled or locked in otherwise), leaves them: the observers on them give up.
    private func stop(cancelling reason: (any Error)?) {
        for step in stopTakingSteps(reason: reason) ?? [] {
            if let reason { step.cancelOwnedWork(reason: reason) } else { step.runStoppedWatching() }
        }
    }

    /// Stops the run, once: the steps in flight, or nil if it had stopped already. What
    /// the run holds of the user's goes too, the results, the work and the inputs (the
    /// thread pumping, or this one if none is, lets go of those): nothing will use them (a
    /// run that fulfils its output reads its results first), and a run kept for a while
    /// by its observer on a long-lived step (until that step's next prune) should keep
    /// nothing.
    private func stopTakingSteps(reason: (any Error)?) -> [AnyPromise]? {
        let (steps, results, work, pumpingHere) = withLock {
            () -> ([AnyPromise]?, [Value?], (@Sendable (Input) throws -> Promise<Value>)?, Bool) in
            if stopped { return (nil, [], nil, false) }
            stopped = true
            stopReason = reason
            let pumpingHere = !pumping
            pumping = true
            defer {
                inFlight = [:]
                self.results = []
                self.work = nil
            }
            return (inFlight.values.compactMap(\.promise), self.results, self.work, pumpingHere)
        }
        _ = consume results  // released outside the lock, as the work is
        _ = consume work
        if pumpingHere { letGoOfInputs() }
        return steps
    }
}

extension Promise {
    /// Runs `work` on each input, at most `maxConcurrent` at a time, and fulfils with the
    /// values in input order; the first error rejects the result, cancels the work in
    /// flight and starts no more (PromiseKit's `when(fulfilled:concurrently:)`).
    ///
    /// ```swift
    /// let pages = Promise.all(urls, maxConcurrent: 8) { url in fetch(url) }   // Promise<[Page]>
    /// ```
    ///
    /// The inputs are pulled one by one as slots free up, so a lazy sequence of a million
    /// inputs holds at most `maxConcurrent` of them (and the results) at a time. Cancelling
    /// the result cancels the work in flight with the same reason and starts no more (a
    /// work the context was already starting as the cancel came may still be called; the
    /// promise it returns is cancelled at once if it is still pending).
    ///
    /// `maxConcurrent` below 1 (a value from configuration, say) calls `work` never and
    /// returns a promise rejected with `PromiseError.invalidArgument`, which says so.
    ///
    /// Threading: `work` runs on `context`; the inputs are pulled on whichever thread
    /// finishes a step, one thread at a time. A context that lets go of a step's work
    /// unrun (an `OperationQueue` whose operations were cancelled) rejects the result with
    /// `PromiseError.brokenPromise` a moment later, as a first error does: the work in
    /// flight is cancelled and no more starts.
    public static func all<Inputs: Sequence>(
        _ inputs: Inputs,
        maxConcurrent: Int,
        on context: any ExecutionContext = .default,
        _ work: @escaping @Sendable (Inputs.Element) throws -> Promise<Value>
    ) -> Promise<[Value]> where Inputs.Element: Sendable {
        guard maxConcurrent >= 1 else {
            return Promise<[Value]>.madeByLibrary(rejectedWith: PromiseError.invalidArgument(
                "Promise.all needs a maxConcurrent of at least 1, and was given \(maxConcurrent)"))
        }
        return FanOut(inputs, limit: maxConcurrent, context: context, work: work).run()
    }

    /// Runs `work` on each input in turn, starting the next step when the previous
    /// promise fulfilled; fulfils with all values in order, or rejects with the first
    /// error (no later step starts). `all(_:maxConcurrent:on:_:)` with one at a time.
    ///
    /// ```swift
    /// let uploaded = Promise.sequence(files) { file in upload(file) }   // Promise<[Receipt]>
    /// ```
    ///
    /// Cancelling the result cancels the step in flight and starts no other. The run holds
    /// only the step in flight: each finished step is freed as soon as nobody else holds it.
    ///
    /// Threading: `work` runs on `context`, once per input, never two at a time.
    public static func sequence<Inputs: Sequence>(
        on context: any ExecutionContext = .default,
        _ inputs: Inputs,
        _ work: @escaping @Sendable (Inputs.Element) throws -> Promise<Value>
    ) -> Promise<[Value]> where Inputs.Element: Sendable {
        FanOut(inputs, limit: 1, context: context, work: work).run()
    }

    /// `sequence(on:_:_:)` with the context after the inputs, where
    /// `all(_:maxConcurrent:on:_:)` and `retry` take theirs.
    ///
    /// ```swift
    /// let uploaded = Promise.sequence(files, on: uploads) { file in upload(file) }
    /// ```
    public static func sequence<Inputs: Sequence>(
        _ inputs: Inputs,
        on context: any ExecutionContext,
        _ work: @escaping @Sendable (Inputs.Element) throws -> Promise<Value>
    ) -> Promise<[Value]> where Inputs.Element: Sendable {
        sequence(on: context, inputs, work)
    }
}
