// The continuations: each returns a new child promise whose `parent` is the receiver
// (except `whenComplete`, which only observes). `on:` defaults to `.default`.
//
// Rules (Promises/A+ adapted to types): a rejection skips success handlers until an
// error handler takes it; a handler that throws rejects the child; a handler that
// returns a promise makes the child follow it; an error handler that returns a value
// fulfils the child. Handlers run at most once, never inside the call that registered
// them (except on `.immediate`), and not at all once the child was settled by someone
// else, except that a cancelled parent still runs error handlers (for clean-up) while
// the child stays cancelled.

extension Promise {
    /// Transforms the value when the promise fulfils (map).
    ///
    /// ```swift
    /// let length = fetchName().then { name in name.count }   // Promise<Int>
    /// ```
    ///
    /// - Parameters:
    ///   - context: where `body` runs (default `.default`).
    ///   - body: the transformation; a throw rejects the child.
    /// - Returns: the child promise, settled with `body`'s result, or rejected with the
    ///   receiver's error without calling `body`.
    ///
    /// Threading: `body` runs once, on `context`, after the receiver fulfils.
    ///
    /// Swift tells this form from the promise-returning one by what `body` returns. A
    /// body of several statements that returns nothing, where the child must be a
    /// `Promise<Void>` (assigned, returned, appended), is taken for the promise-returning
    /// form and fails with "missing return": write `{ value -> Void in ... }`, or `map`.
    @inlinable @discardableResult @_disfavoredOverload
    public func then<U: Sendable>(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (Value) throws -> U
    ) -> Promise<U> {
        DerivedPromise<U>.make(parent: self, context: context, continuation: .map(body))
    }

    /// Chains work that returns a promise (flatMap): the child follows it.
    ///
    /// ```swift
    /// let profile = login().then { token in fetchProfile(token) }   // Promise<Profile>
    /// ```
    ///
    /// Threading: `body` runs once, on `context`; the child then settles on whichever
    /// thread settles the returned promise.
    @inlinable @discardableResult
    public func then<U: Sendable>(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (Value) throws -> Promise<U>
    ) -> Promise<U> {
        DerivedPromise<U>.make(parent: self, context: context, continuation: .flatMap(body))
    }

    /// RXPromise's two-handler form: one handler for each outcome, both producing a `U`.
    ///
    /// ```swift
    /// let text = fetch().then({ data in "got \(data.count) bytes" },
    ///                         { error in "failed: \(error)" })
    /// ```
    ///
    /// Threading: exactly one of the handlers runs, once, on `context`. If the receiver
    /// is cancelled, `onRejected` runs with the cancellation error and the child stays
    /// cancelled whatever it returns.
    ///
    /// Handlers that return promises make a promise of a promise (`Promise<Promise<U>>`),
    /// unlike the one-handler `then`: add `.flatMap { $0 }` to follow the one returned.
    @inlinable @discardableResult
    public func then<U: Sendable>(
        on context: any ExecutionContext = .default,
        _ onFulfilled: @escaping @Sendable (Value) throws -> U,
        _ onRejected: @escaping @Sendable (any Error) throws -> U
    ) -> Promise<U> {
        DerivedPromise<U>.make(parent: self, context: context,
                               continuation: .both(onFulfilled, onRejected))
    }

    /// Transforms the value (the unambiguous spelling of `then` returning a value).
    ///
    /// ```swift
    /// let doubled = Promise(value: 21).map { $0 * 2 }
    /// ```
    @inlinable @discardableResult
    public func map<U: Sendable>(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (Value) throws -> U
    ) -> Promise<U> {
        DerivedPromise<U>.make(parent: self, context: context, continuation: .map(body))
    }

    /// Chains a promise-returning step (the unambiguous spelling of `then` returning a
    /// promise); the child follows the returned promise.
    ///
    /// ```swift
    /// let avatar = user.flatMap { download($0.avatarURL) }
    /// ```
    @inlinable @discardableResult
    public func flatMap<U: Sendable>(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (Value) throws -> Promise<U>
    ) -> Promise<U> {
        DerivedPromise<U>.make(parent: self, context: context, continuation: .flatMap(body))
    }

    /// Turns a rejection into a value: the error is handled and the child fulfils.
    ///
    /// ```swift
    /// let config = loadConfig().recover { _ in .defaults }
    /// ```
    ///
    /// A fulfilled receiver passes its value through without calling `body`. A throw
    /// rejects the child with the thrown error. A cancelled receiver still calls `body`
    /// (for clean-up), but the child stays cancelled.
    ///
    /// On a `Promise<Void>`, a body of several statements that returns nothing fits this
    /// form and the promise-returning one alike, and Swift calls the use ambiguous: write
    /// `{ error -> Void in ... }`. On any other promise, a body that returns nothing (a
    /// log line, meant as `catch`) is a type error that Swift 6.3 reports only as "failed
    /// to produce diagnostic for expression": to observe an error and pass it on, use
    /// `catch`; to handle it, return a value.
    @inlinable @discardableResult
    public func recover(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (any Error) throws -> Value
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context, continuation: .recover(body))
    }

    /// Turns a rejection into another promise that the child follows.
    ///
    /// ```swift
    /// let page = fetch(primary).recover { _ in fetch(mirror) }
    /// ```
    @inlinable @discardableResult
    public func recover(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (any Error) throws -> Promise<Value>
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context, continuation: .flatRecover(body))
    }

    /// Replaces a rejection's error; values pass through.
    ///
    /// ```swift
    /// let user = fetchUser().mapError { APIError.network(underlying: $0) }
    /// ```
    @inlinable @discardableResult
    public func mapError(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (any Error) -> any Error
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context, continuation: .mapError(Value.self, body))
    }

    /// Observes a rejection (or cancellation) without handling it: the child settles
    /// exactly as the receiver did.
    ///
    /// ```swift
    /// fetch().catch { error in log.error("fetch failed: \(error)") }
    /// ```
    @inlinable @discardableResult
    public func `catch`(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (any Error) -> Void
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context, continuation: .tapError(Value.self, body))
    }

    /// Runs `body` whatever the outcome (fulfilled, rejected or cancelled); the child
    /// settles exactly as the receiver did.
    ///
    /// ```swift
    /// spinner.start()
    /// fetch().always(on: .main) { MainActor.assumeIsolated { spinner.stop() } }
    /// ```
    @inlinable @discardableResult
    public func always(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable () -> Void
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context, continuation: .always(Value.self, body))
    }

    /// A child that settles as this promise did, on `context`, with no handler of the
    /// user's (PromiseNIO's `hop(to:)`). Unlike an `always` with an empty body, it has no
    /// error side for a cancel to run: cancelled, it waits for nothing, and so leaves a
    /// long-lived parent at its next prune.
    package func passOn(on context: any ExecutionContext) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context,
                                   continuation: .always(Value.self, hasErrorSide: false) {})
    }

    /// Checks the value: `false` rejects the child with `PromiseError.validationFailure`,
    /// a throw rejects it with the thrown error, `true` passes the value on.
    ///
    /// ```swift
    /// let positive = Promise(value: 5).validate { $0 > 0 }
    /// ```
    @inlinable @discardableResult
    public func validate(
        on context: any ExecutionContext = .default,
        _ predicate: @escaping @Sendable (Value) throws -> Bool
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: context, continuation: .validate(predicate))
    }

    /// Observes the outcome without creating a child promise: the cheapest way to
    /// consume a result.
    ///
    /// ```swift
    /// fetch().whenComplete { result in
    ///     if case .success(let data) = result { cache.store(data) }
    /// }
    /// ```
    ///
    /// A cancelled promise delivers `.failure(reason)`.
    ///
    /// Threading: `body` runs once, on `context`, after the promise settles.
    @inlinable @inline(__always)  // inlined, `body` is stored without a reabstraction thunk (an allocation)
    public func whenComplete(
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable (Result<Value, any Error>) -> Void
    ) {
        let immediate = context.isImmediate
        // On a settled promise, with nothing firing on this thread, an immediate observer
        // runs now, as registering it would, without a box (the trampoline scope still
        // runs what it triggers after it returns).
        if immediate, let tag = beginInlineObservation() {
            body(result(published: tag))
            endInlineObservation()
            return
        }
        // The first observer of a root on `.immediate` or `.default` lives in the promise
        // itself (no allocation); the others, and observers of children, in a node
        // (`.immediate`) or a box each.
        if immediate || context.isDefault, claimFirstObserverSlot() {
            fillFirstObserverSlot(.completion(Value.self, body), immediate: immediate)
        } else {
            if immediate {
                registerCompletionNode(CompletionNode.make(body: body))
            } else if context.isDefault {
                DefaultQueueCompletionObserver(body: body).register(on: self)
            } else {
                QueuedCompletionObserver(context: context, body: body).register(on: self)
            }
        }
    }
}
