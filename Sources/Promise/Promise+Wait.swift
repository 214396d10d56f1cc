import CPromiseCore
import Dispatch

extension Promise {
    /// Blocks the calling thread until the promise settles, then returns its value or
    /// throws its error (a cancelled promise throws its cancellation reason).
    ///
    /// ```swift
    /// let answer = try Promise<Int>(on: .default) { 42 }.wait()
    /// ```
    ///
    /// Blocking is the one cold path that sleeps: an already settled promise returns at
    /// once; a pending one parks the thread on a semaphore that an observer signals.
    /// Never wait inside a handler for work that needs the same thread or queue (an
    /// `.immediate` handler, a serial queue the promise settles on): it deadlocks.
    ///
    /// Unavailable from async code (`noasync`, as SwiftNIO's `wait()`): it would block one
    /// of the few threads Swift concurrency runs every Task on. There, `await p.value`.
    @available(*, noasync, message: "wait() blocks a thread of Swift concurrency's pool; use 'await promise.value'")
    public func wait() throws -> Value {
        try awaitResult(deadline: .distantFuture).get()
    }

    /// Like `wait()`, but gives up after `timeout` and throws `PromiseError.timedOut`
    /// (the promise itself is untouched). A wait that gave up leaves nothing behind, so
    /// polling a long-lived pending promise runs in constant memory. A timeout of zero or
    /// less is a poll: it returns the outcome if the promise has settled, and otherwise
    /// throws at once, without parking the thread or registering anything. A timeout
    /// longer than a hundred years never elapses, as `wait()`.
    ///
    /// ```swift
    /// let page = try fetch(url).wait(timeout: .seconds(1))
    /// ```
    ///
    /// Unavailable from async code, as `wait()` is.
    @available(*, noasync, message: "wait(timeout:) blocks a thread of Swift concurrency's pool; use 'await promise.value'")
    public func wait(timeout: Duration) throws -> Value {
        try awaitResult(deadline: timeout.dispatchDeadline).get()
    }

    /// Cold path (documented above): an entry of the promise's waiter list (see
    /// `RareState`), which a wait that timed out leaves at once, so polling a long-lived
    /// pending promise runs in constant memory.
    private func awaitResult(deadline: DispatchTime) throws -> Result<Value, any Error> {
        if let settled = settledResult { return settled }
        // A poll: parking on a semaphore only to time out costs Dispatch tens of
        // microseconds on Linux, and the waiter list a rare-state object.
        if deadline != .distantFuture && deadline <= .now() { throw PromiseError.timedOut }
        let waiter = BlockingWaiter<Value>()
        let list = rareState
        guard list.add(waiter, on: self) == .listed else { return settledResult.unsafelyUnwrapped }
        if waiter.signal.wait(timeout: deadline) == .timedOut {
            if list.remove(waiter) { throw PromiseError.timedOut }
            waiter.signal.wait()  // the outcome came first: its signal is on its way
        }
        return waiter.result.unsafelyUnwrapped
    }
}
