import Dispatch

// Timers: `after`, `delay`, `timeout`. They hold no thread while waiting (see
// `PromiseTimer`), and are cancelled (so never run) when the promise they would settle
// is cancelled or settles first.

extension Duration {
    /// The dispatch deadline `self` from now (negative durations mean now).
    var dispatchDeadline: DispatchTime {
        let (seconds, attoseconds) = components
        let nanoseconds = seconds > 0 || (seconds == 0 && attoseconds > 0)
            ? seconds.multipliedReportingOverflow(by: 1_000_000_000).partialValue + attoseconds / 1_000_000_000
            : 0
        return .now() + .nanoseconds(Int(clamping: nanoseconds))
    }
}

/// A timer that holds no thread: `work` runs once on a global queue after `interval`,
/// unless cancelled first. `cancel` is thread-safe (it is `DispatchWorkItem.cancel`, which
/// the Linux Dispatch overlay does not mark `Sendable`; hence `@unchecked`).
struct PromiseTimer: @unchecked Sendable {
    private let item: DispatchWorkItem

    init(after interval: Duration, _ work: @escaping @Sendable () -> Void) {
        item = DispatchWorkItem(block: work)
        DispatchQueue.global().asyncAfter(deadline: interval.dispatchDeadline, execute: item)
    }

    func cancel() {
        item.cancel()
    }
}

extension Promise where Value == Void {
    /// A promise fulfilled after `interval`.
    ///
    /// ```swift
    /// Promise.after(.seconds(1)).then { print("a second later") }
    /// ```
    ///
    /// Cancelling it cancels the timer.
    public static func after(_ interval: Duration) -> Promise<Void> {
        .fulfilling((), after: interval)
    }
}

extension Promise {
    /// A promise fulfilled with `value` after `interval`; cancelling it cancels the timer.
    static func fulfilling(_ value: Value, after interval: Duration) -> Promise<Value> {
        let promise = Promise<Value>()
        let timer = PromiseTimer(after: interval) { promise.fulfill(value) }
        promise.onCancel { timer.cancel() }
        return promise
    }

    /// A child that fulfils with this promise's value `interval` after it fulfils; a
    /// rejection passes on at once (as Google Promises' `delay`).
    ///
    /// ```swift
    /// let debounced = query.delay(.milliseconds(300))
    /// ```
    ///
    /// The child is an ordinary pending promise until the timer fires: whoever holds it
    /// may still settle it (an outside `reject` before the time is up wins, and the timer
    /// then does nothing). Cancelling or settling it stops its timer (never the receiver).
    public func delay(_ interval: Duration) -> Promise<Value> {
        Promise(parent: self, context: .immediate, continuation: .handOff { (value: Value, child: Promise<Value>) in
            let timer = PromiseTimer(after: interval) { child.fulfill(value) }
            child.whenComplete(on: .immediate) { _ in timer.cancel() }
        })
    }

    /// A child that settles as this promise does, unless `interval` passes first: then
    /// it rejects with `PromiseError.timedOut`. The receiver itself is untouched (cancel
    /// it yourself if its work should stop).
    ///
    /// ```swift
    /// let page = fetch(url).timeout(.seconds(2))
    /// page.catch { if case PromiseError.timedOut = $0 { showSlowNetworkHint() } }
    /// ```
    public func timeout(_ interval: Duration) -> Promise<Value> {
        let child = map(on: .immediate) { $0 }
        let timer = PromiseTimer(after: interval) { child.reject(PromiseError.timedOut) }
        child.whenComplete(on: .immediate) { _ in timer.cancel() }
        return child
    }
}
