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
/// unless cancelled first. `cancel` is thread-safe.
///
/// `work` (and what it captures: the promise to settle, `delay`'s value) sits in a box
/// that the first of the deadline and `cancel` empties, elected with one CAS (`pc_once`),
/// so a cancel lets go of it at once. A cancelled `DispatchWorkItem` keeps its block until
/// the deadline: a block that captured the promise would keep a settled `timeout` or
/// `delay` output, and its value, alive that long. The block here holds only the box.
/// (It still wakes a thread at the deadline to find nothing to do: Dispatch cannot take a
/// scheduled block back. PromiseNIO's `timeout(_:on:)` schedules on an event loop, which
/// can.)
struct PromiseTimer: @unchecked Sendable {  // DispatchWorkItem is not marked Sendable on Linux
    private let item: DispatchWorkItem
    private let box: TimerWork

    init(after interval: Duration, _ work: @escaping @Sendable () -> Void) {
        let box = TimerWork(work)
        self.box = box
        item = DispatchWorkItem { box.take()?() }
        DispatchQueue.global().asyncAfter(deadline: interval.dispatchDeadline, execute: item)
    }

    func cancel() {
        item.cancel()
        _ = box.take()
    }
}

/// The box of a `PromiseTimer`: its work until the first `take`, nil after it.
/// `@unchecked Sendable`: `work` is written by the initialiser, before the box is shared,
/// and after that only by the one caller the election lets through.
private final class TimerWork: @unchecked Sendable {
    // First stored property: `take` addresses it as the election's word.
    private var taken: UInt = 0
    private var work: (@Sendable () -> Void)?

    init(_ work: @escaping @Sendable () -> Void) {
        self.work = work
    }

    /// The work for the first caller (the deadline or a cancel), nil for the other; the
    /// box lets go of it either way.
    func take() -> (@Sendable () -> Void)? {
        let flag = _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: UInt.self)
        guard electOnce(flag) else { return nil }
        defer { work = nil }
        return work
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
    /// A promise fulfilled with `value` after `interval`; settling it first (a cancel,
    /// or a resolver from outside) cancels the timer.
    static func fulfilling(_ value: Value, after interval: Duration) -> Promise<Value> {
        let promise = Promise<Value>()
        let timer = PromiseTimer(after: interval) { promise.fulfill(value) }
        promise.whenComplete(on: .immediate) { _ in timer.cancel() }
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
    ///
    /// The child waits in this promise's waiter list, not in its observers: once the child
    /// has settled (the timer fired, or anyone settled it), it leaves the list at once, so
    /// a long-lived pending promise timed out again and again keeps none of the children.
    /// When this promise settles, the child settles through the settling thread's
    /// trampoline, with the other timeout children in their registration order, at the
    /// place of the promise's first waiter among its observers, and after the threads and
    /// Tasks waiting on this promise woke: a `wait()` on this promise may return while the
    /// child, made earlier, is still pending for an instant.
    public func timeout(_ interval: Duration) -> Promise<Value> {
        let child = Promise(linkedTo: self)
        let follower = TimeoutFollower(child: child)
        let list = rareState
        guard list.add(follower, on: self) == .listed else {
            child.adoptOutcome(of: self, lookingAbove: self)  // settled already: the child is too
            return child
        }
        let timer = PromiseTimer(after: interval) { child.reject(PromiseError.timedOut) }
        child.whenComplete(on: .immediate) { _ in
            timer.cancel()
            _ = list.remove(follower)
        }
        return child
    }
}
