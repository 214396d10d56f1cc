import CPromiseCore

extension AnyPromise {
    /// Cancels the promise if it is still pending: it settles as `.cancelled` with a
    /// `CancellationError`. Does nothing to a promise that has already settled.
    ///
    /// Cancellation flows down, never up or sideways: children registered with `then`
    /// and friends end cancelled with the same reason (their error handlers still run,
    /// for clean-up), while the parent and siblings are untouched. Handlers registered
    /// later on a cancelled promise yield cancelled children.
    ///
    /// ```swift
    /// let image = download(url).then { decode($0) }
    /// image.cancel()            // `download` keeps going; `image` is cancelled
    /// image.root.cancel()       // the whole tree, from the top
    /// ```
    public final func cancel() {
        cancel(reason: CancellationError())
    }

    /// Cancels the promise with `reason` as its error (see `cancel()`).
    ///
    /// A promise that follows another one (a handler returned it, or `resolve(with:)`)
    /// is cancelled too: it stops following.
    public final func cancel(reason: any Error) {
        _ = settleFailure(reason, as: PC_CANCELLED)
    }

    /// Registers `body` to run once if and when this promise is cancelled: the resolver
    /// side's hook to stop the work behind it (RXPromise's pattern). Runs at once if the
    /// promise is already cancelled; never runs if it settles any other way.
    ///
    /// ```swift
    /// func download(_ url: URL) -> Promise<Data> {
    ///     let promise = Promise<Data>()
    ///     let task = session.dataTask(with: url) { data, _, error in
    ///         if let data { promise.fulfill(data) } else { promise.reject(error!) }
    ///     }
    ///     promise.onCancel { task.cancel() }   // cancelling the promise stops the download
    ///     task.resume()
    ///     return promise
    /// }
    /// ```
    ///
    /// Threading: `body` runs on the thread that cancels (inline, through the core's
    /// trampoline), so keep it short and non-blocking.
    public final func onCancel(_ body: @escaping @Sendable () -> Void) {
        CancelObserver(body: body).register(on: self)
    }
}
