import CPromiseCore

// Bridging to Swift concurrency: awaiting a promise, and a promise backed by a Task.

extension Promise {
    /// Runs `work` in a new `Task`; its return value fulfils the promise, a throw rejects
    /// it. Cancelling the promise cancels the Task (cooperatively: `work` sees
    /// `Task.isCancelled` and `CancellationError` from `Task.sleep` and friends).
    ///
    /// ```swift
    /// let profile = Promise<Profile> { try await api.profile(for: id) }
    /// profile.cancel()   // cancels the request's Task
    /// ```
    ///
    /// A promise settled otherwise first (its holder fulfilled it, say) cancels the Task
    /// too: its result would be ignored, and a Task left waiting (on a long-lived promise,
    /// say) would keep the promise and its value for as long as it waits. One locked in to
    /// follow another promise (`resolve(with:)`) keeps its Task until that one settles it.
    ///
    /// A closure that does not `await` needs the type spelled:
    /// `Promise<Int> { compute() }`. Swift may take a trailing closure for the value of
    /// `init(value:)`, so `Promise { compute() }` fails to compile (asking for
    /// `@Sendable`), and `Promise { @Sendable in compute() }` is a promise fulfilled with
    /// the closure. To run such work on a context instead of in a Task, use `init(on:_:)`.
    public convenience init(
        _ work: @escaping @Sendable () async throws -> Value,
        file: StaticString = #fileID,
        line: UInt = #line
    ) {
        self.init(file: file, line: line)
        // Whichever comes first: the Task settling the promise, or the promise settling
        // otherwise (then the hook cancels the Task). The Task is never cancelled by its
        // own settle, whose `.immediate` handlers run inside it.
        let first = RunOnce()
        let task = Task { [self] in
            do {
                let value = try await work()
                _ = first.claim()
                self.fulfill(value)
            } catch {
                _ = first.claim()
                self.reject(error)
            }
        }
        // On any outcome, and no reader of its error (an unread rejection is reported).
        OutcomeHook { _ in if first.claim() { task.cancel() } }.register(on: self)
    }

    #if compiler(>=6.2)
    /// The value, awaited without blocking a thread; throws the promise's error (a
    /// cancelled promise throws its cancellation reason).
    ///
    /// ```swift
    /// let data = try await download(url).value
    /// ```
    ///
    /// Cancelling the awaiting Task cancels only this waiter, which then throws
    /// `CancellationError` and leaves the promise at once (a long-lived promise awaited by
    /// many cancelled Tasks keeps none of them): the promise and its other observers are
    /// untouched. An already settled promise returns without suspending, and an awaiting
    /// actor keeps running: the getter runs on the caller's executor (it is
    /// `nonisolated(nonsending)`, with Swift 6.2 and later; built by 6.0 or 6.1 it hops to
    /// the generic executor and back, as any nonisolated `async` member did then).
    @inlinable
    nonisolated(nonsending) public var value: Value {
        get async throws {
            if let settled = settledResult { return try settled.get() }  // no suspension
            return try await awaitOutcome().get()
        }
    }
    #else
    /// The value, awaited without blocking a thread (see the declaration above, for
    /// Swift 6.2 and later).
    @inlinable
    public var value: Value {
        get async throws {
            if let settled = settledResult { return try settled.get() }  // no suspension
            return try await awaitOutcome().get()
        }
    }
    #endif

    #if compiler(>=6.2)
    /// The outcome as a `Result`, awaited without blocking a thread. If the awaiting
    /// Task is cancelled first, the waiter gets `.failure(CancellationError())` and the
    /// promise is untouched.
    ///
    /// ```swift
    /// switch await fetch().result {
    /// case .success(let page): show(page)
    /// case .failure(let error): report(error)
    /// }
    /// ```
    ///
    /// Runs on the caller's executor, as `value` does.
    @inlinable
    nonisolated(nonsending) public var result: Result<Value, any Error> {
        get async {
            if let settled = settledResult { return settled }  // no suspension
            return await awaitOutcome()
        }
    }
    #else
    /// The outcome as a `Result`, awaited without blocking a thread (see the declaration
    /// above, for Swift 6.2 and later).
    @inlinable
    public var result: Result<Value, any Error> {
        get async {
            if let settled = settledResult { return settled }  // no suspension
            return await awaitOutcome()
        }
    }
    #endif

    /// Suspends until the promise settles or the awaiting Task is cancelled, on the
    /// caller's executor (`isolation`): the awaiting actor resumes without a hop. Only
    /// for a promise the caller found pending: a call to a function with an isolated
    /// parameter checks the executor on the way in and out (two `swift_task_switch`
    /// calls, about 180 instructions), which a settled promise's getter does not pay.
    @usableFromInline
    func awaitOutcome(isolation: isolated (any Actor)? = #isolation) async -> Result<Value, any Error> {
        // One allocation: an entry of the promise's waiter list (see `RareState`). The
        // list's lock decides whether the outcome or the Task's cancellation gets there
        // first (cancelling never touches the promise, and a cancelled waiter leaves the
        // list at once: a promise awaited by many cancelled Tasks keeps none of them),
        // and a countdown resumes the Task once both the decision is made and the
        // continuation is installed, in whichever order they happen (the cancellation
        // handler runs first if the Task was cancelled before the await).
        let waiter = Waiter<Value>()
        let list = rareState
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                waiter.continuation = continuation
                if list.add(waiter, on: self) == .promiseSettled {
                    waiter.decide(self.settledResult.unsafelyUnwrapped)
                }
                waiter.arrive()
            }
        } onCancel: {
            if list.remove(waiter) { waiter.decide(.failure(CancellationError())) }
        }
    }
}

/// One `await p.value` / `await p.result`: an entry of the promise's waiter list.
final class Waiter<Value: Sendable>: WaiterEntry, @unchecked Sendable {
    /// Written once by the awaiting Task, before its `arrive`.
    var continuation: UnsafeContinuation<Result<Value, any Error>, Never>?
    /// Written once by whoever the list let decide, before its `arrive`.
    var outcome: Result<Value, any Error>?

    override func deliver(from source: AnyPromise) {
        decide(unsafeDowncast(source, to: Promise<Value>.self).publishedResult)
    }

    /// The outcome or the cancellation, from the one caller the list let decide.
    func decide(_ result: Result<Value, any Error>) {
        outcome = result
        arrive()
    }

    /// One of the two things a resume waits for is done; the second one resumes. The
    /// countdown's full barrier makes the other side's write visible here.
    func arrive() {
        guard countDownReachesZero(arrivalsPointer) else { return }
        continuation.unsafelyUnwrapped.resume(returning: outcome.unsafelyUnwrapped)
    }
}
