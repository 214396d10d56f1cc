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
        // One allocation: a waiter observing this promise. Its election decides whether
        // the outcome or the Task's cancellation gets there first (cancelling never
        // touches the promise), and its countdown resumes the Task once both the decision
        // is made and the continuation is installed, in whichever order they happen (the
        // cancellation handler runs first if the Task was cancelled before the await).
        let waiter = Waiter<Value>()
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                waiter.continuation = continuation
                waiter.register(on: self)  // fires inline if settled meanwhile
                waiter.arrive()
            }
        } onCancel: {
            waiter.decide(.failure(CancellationError()))
        }
    }
}

/// The type-erased part of an `await` on a promise (the core's fire callback cannot be
/// generic). Its `pc_waiter` is its first stored property: node, election, countdown.
@usableFromInline
class WaiterBase: @unchecked Sendable {
    final var state = pc_waiter(node: pc_node(), decided: 0, remaining: 2)

    final var statePointer: UnsafeMutablePointer<pc_waiter> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: pc_waiter.self)
    }

    /// Registers the waiter on `source`, transferring one retain to its node (balanced in
    /// `waiterFire`; if `source` dies pending, its stand-in fires the node: `breakObservers`).
    final func register(on source: AnyPromise) {
        let node = UnsafeMutableRawPointer(statePointer).assumingMemoryBound(to: pc_node.self)  // its first field
        registerNode(node, firingThrough: waiterFire, holding: self, on: source)
    }

    /// The awaited promise settled.
    func sourceSettled(_ source: AnyPromise) {
        preconditionFailure("WaiterBase is abstract")
    }
}

/// One `await p.value` / `await p.result`.
final class Waiter<Value: Sendable>: WaiterBase, @unchecked Sendable {
    /// Written once by the awaiting Task, before its `arrive`.
    var continuation: UnsafeContinuation<Result<Value, any Error>, Never>?
    /// Written once by the decision's winner, before its `arrive`.
    var outcome: Result<Value, any Error>?

    override func sourceSettled(_ source: AnyPromise) {
        decide(unsafeDowncast(source, to: Promise<Value>.self).publishedResult)
    }

    /// The outcome or the cancellation: the first one decides, later ones are dropped.
    func decide(_ result: Result<Value, any Error>) {
        guard electOnce(&statePointer.pointee.decided) else { return }
        outcome = result
        arrive()
    }

    /// One of the two things a resume waits for is done; the second one resumes. The
    /// countdown's full barrier makes the other side's write visible here.
    func arrive() {
        guard countDownReachesZero(&statePointer.pointee.remaining) else { return }
        continuation.unsafelyUnwrapped.resume(returning: outcome.unsafelyUnwrapped)
    }
}

/// The fire callback of a waiter's node (never deferred: resuming a Task only enqueues it).
func waiterFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let waiter = CoreLayout.owner(ofFirstField: node, as: WaiterBase.self)
    guard let source else { preconditionFailure("waiters are never deferred") }
    waiter.takeUnretainedValue().sourceSettled(AnyPromise.owner(ofCore: source).takeUnretainedValue())
    waiter.release()  // the registration's retain
}
