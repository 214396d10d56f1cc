// Bridging completion-handler APIs.

extension Promise {
    /// Wraps an API that reports a `Result` to a completion handler.
    ///
    /// ```swift
    /// let data = Promise.wrap { done in loader.load(url, completion: done) }
    /// ```
    ///
    /// `body` runs synchronously, once; a throw rejects. Later calls of the completion
    /// handler are ignored (a promise settles once).
    public static func wrap(
        _ body: (_ completion: @escaping @Sendable (Result<Value, any Error>) -> Void) throws -> Void
    ) -> Promise<Value> {
        let promise = Promise<Value>(madeByLibrary: ())
        do {
            try body { promise.resolve($0) }
        } catch {
            promise.reject(error)
        }
        return promise
    }

    /// Wraps an API that reports a `Result` with a specific error type
    /// (`Result<Data, NetworkError>`): its error rejects the promise as it is.
    ///
    /// ```swift
    /// let data = Promise.wrap { done in client.fetch(url, completion: done) }
    /// ```
    public static func wrap<Failure: Error>(
        _ body: (_ completion: @escaping @Sendable (Result<Value, Failure>) -> Void) throws -> Void
    ) -> Promise<Value> {
        wrap { (done: @escaping @Sendable (Result<Value, any Error>) -> Void) in
            try body { done($0.mapError { $0 }) }
        }
    }

    /// Wraps an API whose completion handler gets an optional value and an optional
    /// error (the Objective-C shape). An error wins; neither rejects with
    /// `PromiseWrapError.neitherValueNorError`.
    ///
    /// ```swift
    /// let image = Promise.wrap { done in legacyFetchImage(named: "logo", completion: done) }
    /// ```
    public static func wrap(
        _ body: (_ completion: @escaping @Sendable (Value?, (any Error)?) -> Void) throws -> Void
    ) -> Promise<Value> {
        wrap { (done: @escaping @Sendable (Result<Value, any Error>) -> Void) in
            try body { value, error in
                if let error {
                    done(.failure(error))
                } else if let value {
                    done(.success(value))
                } else {
                    done(.failure(PromiseWrapError.neitherValueNorError))
                }
            }
        }
    }

    /// Wraps an API whose completion handler only ever gets a value.
    ///
    /// ```swift
    /// let granted = Promise.wrap { done in requestPermission(completion: done) }
    /// ```
    ///
    /// Disfavoured, so a `Result`-shaped completion picks the `Result` overload.
    @_disfavoredOverload
    public static func wrap(
        _ body: (_ completion: @escaping @Sendable (Value) -> Void) throws -> Void
    ) -> Promise<Value> {
        wrap { (done: @escaping @Sendable (Result<Value, any Error>) -> Void) in
            try body { done(.success($0)) }
        }
    }
}

extension Promise where Value == Void {
    /// Wraps an API whose completion handler gets nothing: it only says the work is done
    /// (Google Promises' `wrapCompletion`).
    ///
    /// ```swift
    /// let saved = Promise.wrap { done in store.flush(completion: done) }   // Promise<Void>
    /// ```
    ///
    /// `body` runs synchronously, once; a throw rejects. The first call of the completion
    /// handler fulfils; later calls are ignored.
    public static func wrap(
        _ body: (_ completion: @escaping @Sendable () -> Void) throws -> Void
    ) -> Promise<Void> {
        wrap { (done: @escaping @Sendable (Result<Void, any Error>) -> Void) in
            try body { done(.success(())) }
        }
    }

    /// Wraps an API whose completion handler gets an optional error: `nil` fulfils, an
    /// error rejects (Google Promises' `wrapErrorCompletion`).
    ///
    /// ```swift
    /// let added = Promise.wrap { done in notifications.add(request, withCompletionHandler: done) }
    /// ```
    ///
    /// `body` runs synchronously, once; a throw rejects. Later calls of the completion
    /// handler are ignored.
    public static func wrap(
        _ body: (_ completion: @escaping @Sendable ((any Error)?) -> Void) throws -> Void
    ) -> Promise<Void> {
        wrap { (done: @escaping @Sendable (Result<Void, any Error>) -> Void) in
            try body { error in done(error.map { .failure($0) } ?? .success(())) }
        }
    }
}
