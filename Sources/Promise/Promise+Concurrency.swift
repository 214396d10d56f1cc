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
    public convenience init(_ work: @escaping @Sendable () async throws -> Value) {
        self.init()
        let task = Task { [self] in
            do {
                self.fulfill(try await work())
            } catch {
                self.reject(error)
            }
        }
        onCancel { task.cancel() }
    }

    /// The value, awaited without blocking a thread; throws the promise's error (a
    /// cancelled promise throws its cancellation reason).
    ///
    /// ```swift
    /// let data = try await download(url).value
    /// ```
    ///
    /// Cancelling the awaiting Task cancels only this waiter, which then throws
    /// `CancellationError`: the promise and its other observers are untouched. An already
    /// settled promise returns without suspending.
    @inlinable
    public var value: Value {
        get async throws {
            if let settled = settledResult { return try settled.get() }  // no suspension
            return try await awaitOutcome().get()
        }
    }

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
    @inlinable
    public var result: Result<Value, any Error> {
        get async {
            if let settled = settledResult { return settled }  // no suspension
            return await awaitOutcome()
        }
    }

    /// Suspends until the promise settles or the awaiting Task is cancelled.
    @usableFromInline
    func awaitOutcome() async -> Result<Value, any Error> {
        // The waiter is its own small promise following this one: the claim CAS decides
        // whether the outcome or the Task's cancellation gets there first, and cancelling
        // the waiter never touches the promise it follows.
        let waiter = Promise<Value>()
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                waiter.whenComplete(on: .immediate) { continuation.resume(returning: $0) }
                waiter.resolve(with: self)
            }
        } onCancel: {
            waiter.cancel()
        }
    }
}
