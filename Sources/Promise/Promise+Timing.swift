import Dispatch

// Timers: `after`, `delay`, `timeout`. They hold no thread while waiting (see
// `PromiseTimer`), and are cancelled (so never run) when the promise they would settle
// is cancelled or settles first.

extension Duration {
    /// The dispatch deadline `self` from now: negative durations mean now, and those past
    /// `PromiseTimer.horizon` never (`distantFuture`), rather than wrapping around the
    /// nanoseconds Dispatch counts in (`.seconds(Int64.max)`, "no timeout", would wrap to
    /// a deadline in the past).
    var dispatchDeadline: DispatchTime {
        guard self <= PromiseTimer.horizon else { return .distantFuture }
        // Before `components`, which traps on a duration past Int64's seconds either way.
        guard self > .zero else { return .now() }
        let (seconds, attoseconds) = components
        return .now() + .nanoseconds(Int(seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
    }
}

/// A timer that holds no thread: `work` runs once after its deadline, unless cancelled
/// first. `cancel` is thread-safe.
///
/// Two kinds, one behaviour. By default (`after`, `delay`, `timeout` and `retry` without a
/// `clock:`) an entry on the library's Dispatch timer heap (`TimerHeap`), whose cancel
/// takes it off the heap, with `work`, at once; also with the system's clocks passed as
/// `clock:`. With any other `clock:`, a Task that sleeps on that clock (so a test's manual
/// clock drives it without sleeping), and whose cancel ends the sleep; PromiseNIO's `timeout(_:on:)` schedules on an event loop, which takes its task
/// back too.
///
/// In the last two, and for a timer due at once, `work` (and what it captures: the promise
/// to settle, `delay`'s value) sits in a box that the first of the deadline and `cancel`
/// empties, elected with one CAS (`pc_once`), so a cancel lets go of it before the Task,
/// the loop's task or the lane's block ends.
struct PromiseTimer: Sendable {
    private enum Handle {
        case dispatch(TimerHeap.Entry)
        /// Due at once: sent straight to a timer lane, with the box a cancel empties.
        case sentAtOnce(TimerWork)
        case task(Task<Void, Never>, TimerWork)
        /// Scheduled by the caller (PromiseNIO: a task on an event loop); cancels it.
        case scheduled(@Sendable () -> Void, TimerWork)
        /// An interval past `horizon`: nothing is scheduled, and `work` is not kept.
        case never
    }

    private let handle: Handle

    /// The longest interval a timer counts down: a hundred years (of 365.25 days). A longer
    /// one never elapses: no timer is set, so `timeout(.seconds(Int64.max))` means "no
    /// timeout", as it reads, instead of overflowing the nanoseconds that Dispatch, and the
    /// runtime under `Task.sleep`, count in (about 292 years).
    static let horizon = Duration.seconds(3_155_760_000)

    /// On Dispatch: `work` runs on a timer lane (see `TimerHeap`) `interval` from now.
    init(after interval: Duration, _ work: @escaping @Sendable () -> Void) {
        guard interval <= PromiseTimer.horizon else {
            self = .never
            return
        }
        guard interval > .zero else {
            // Due now (`after(.zero)`, `delay(.zero)`): the heap would only add a hop.
            self.init(sendingAtOnce: work)
            return
        }
        self.init(handle: .dispatch(TimerHeap.shared.schedule(at: interval.dispatchDeadline, work)))
    }

    private init(handle: Handle) {
        self.handle = handle
    }

    /// Due already: `work` goes to a timer lane at once, in a box a cancel empties.
    private init(sendingAtOnce work: @escaping @Sendable () -> Void) {
        let box = TimerWork(work)
        TimerHeap.shared.send { box.take()?() }
        self.init(handle: .sentAtOnce(box))
    }

    /// A timer that never fires. Nothing will ever run its work: keeping it would keep
    /// what it captures (the promise the timer settles, which holds the timer: a cycle),
    /// so a promise whose only resolver is this timer dies when its holder lets go, and
    /// breaks.
    private static var never: PromiseTimer { PromiseTimer(handle: .never) }

    /// On `clock`: `work` runs once `clock` reaches `deadline` (at once if it has). A
    /// deadline more than `horizon` away never comes, as on Dispatch (the clock's own
    /// sleep would trap on it: `ContinuousClock` counts in 64-bit nanoseconds).
    ///
    /// A clock whose sleep throws when the timer was not cancelled (a test clock shut
    /// down, say) cannot time anything: `clockFailed` runs instead of `work`, with its
    /// error, so that the promise the timer would settle settles all the same rather than
    /// leave its callers waiting for ever. So does one whose sleep keeps returning before
    /// its `now` reaches the deadline (see `sleep(on:until:)`): the timer never fires early.
    ///
    /// The system's clocks (`ContinuousClock`, the default, and `SuspendingClock`) time on
    /// the Dispatch heap, as with no `clock:`, counted from now: a Task's sleep and what
    /// runs after it wait for the concurrency pool, which blocked work may hold, where
    /// the heap's lanes do not (code that takes a clock for its tests passes the
    /// continuous clock in production, and must not lose that).
    init<C: Clock>(at deadline: C.Instant, on clock: C, _ work: @escaping @Sendable () -> Void,
                   clockFailed: @escaping @Sendable (any Error) -> Void) where C.Duration == Duration {
        let interval = clock.timeLeft(until: deadline)
        guard interval <= PromiseTimer.horizon else {
            self = .never
            return
        }
        guard interval > .zero else {
            // Due: no sleep (a clock's sleep traps on a deadline past Int64's nanoseconds,
            // in the past as in the future).
            self = PromiseTimer(sendingAtOnce: work)
            return
        }
        if C.self == ContinuousClock.self || C.self == SuspendingClock.self {
            self.init(after: interval, work)
            return
        }
        let box = TimerWork(work)
        self.init(handle: .task(Task {
            do {
                try await PromiseTimer.sleep(on: clock, until: deadline)
            } catch {
                // Cancelled: `cancel` emptied the box first. Otherwise the clock failed.
                if box.take() != nil { clockFailed(error) }
                return
            }
            box.take()?()
        }, box))
    }

    /// On `clock`: `work` runs once `interval` has passed on it, counted from now.
    /// An interval past `horizon` never elapses, as on Dispatch. (`clockFailed`: see
    /// `init(at:on:_:clockFailed:)`.)
    init<C: Clock>(after interval: Duration, on clock: C, _ work: @escaping @Sendable () -> Void,
                   clockFailed: @escaping @Sendable (any Error) -> Void) where C.Duration == Duration {
        guard interval <= PromiseTimer.horizon else {
            self = .never
            return
        }
        guard interval > .zero else {
            // Due, without adding to the clock's now (an interval near the most negative
            // duration would overflow the subtraction that follows).
            self = PromiseTimer(sendingAtOnce: work)
            return
        }
        self.init(at: clock.now.advanced(by: interval), on: clock, work, clockFailed: clockFailed)
    }

    /// How many times in a row a clock's sleep may return before its deadline.
    static let earlyWakeLimit = 8

    /// Sleeps on `clock` until its `now` has reached `deadline`. `Clock`'s contract is that
    /// `sleep(until:)` returns no earlier, but a clock of the caller's may wake early (a
    /// coarse timer, a stub): such a wake is slept again, and a clock that wakes early
    /// `earlyWakeLimit` times for one deadline cannot time anything, which throws
    /// `PromiseError.invalidArgument` rather than fire the timer early or spin.
    static func sleep<C: Clock>(on clock: C, until deadline: C.Instant) async throws {
        for _ in 0..<earlyWakeLimit {
            try await clock.sleep(until: deadline, tolerance: nil)
            if clock.now >= deadline { return }
            // A clock may answer a cancel by returning, not throwing: no sleep again then.
            try Task.checkCancellation()
        }
        throw PromiseError.invalidArgument(
            "the clock \(C.self) returned from sleep(until:) before its deadline \(earlyWakeLimit) times in a row, so it cannot time anything")
    }

    /// Scheduled by the caller: `schedule` arranges for its `fire` to run once `interval`
    /// (not negative: a negative interval means now) has passed, and returns what cancels
    /// that. An interval past `horizon` is never scheduled.
    init(after interval: Duration,
         scheduling schedule: (_ interval: Duration, _ fire: @escaping @Sendable () -> Void) -> @Sendable () -> Void,
         _ work: @escaping @Sendable () -> Void) {
        guard interval <= PromiseTimer.horizon else {
            self = .never
            return
        }
        let box = TimerWork(work)
        self.init(handle: .scheduled(schedule(max(interval, .zero)) { box.take()?() }, box))
    }

    func cancel() {
        switch handle {
        case .dispatch(let entry):
            TimerHeap.shared.cancel(entry)
        case .sentAtOnce(let box):
            _ = box.take()
        case .task(let task, let box):
            _ = box.take()  // first: the Task, woken by the cancel, then finds nothing to fail
            task.cancel()
        case .scheduled(let cancel, let box):
            cancel()
            _ = box.take()
        case .never:
            break
        }
    }
}

/// The box of a clock's, a caller's or a due-at-once `PromiseTimer`: its work until the first
/// `take`, nil after it.
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
    /// Cancelling it cancels the timer. An interval longer than a hundred years never
    /// elapses (no timer is set): the promise waits for its holder, and once nobody holds
    /// it, it is freed and its observers receive `PromiseError.brokenPromise`.
    public static func after(_ interval: Duration) -> Promise<Void> {
        .fulfilling(()) { fire, _ in PromiseTimer(after: interval, fire) }
    }

    /// A promise fulfilled once `interval` has passed on `clock`: a test passes a clock it
    /// advances by hand, and the promise fulfils without anyone sleeping.
    ///
    /// ```swift
    /// let due = Promise.after(.seconds(30), clock: testClock)   // fulfils when testClock is advanced
    /// ```
    ///
    /// Cancelling it cancels the timer. If the clock's `sleep` throws although the timer
    /// was not cancelled, the promise rejects with that error: a clock that cannot sleep
    /// cannot time it. A `sleep` that returns before the clock's `now` reaches the
    /// deadline is asked again; one that does so eight times in a row rejects the promise
    /// with `PromiseError.invalidArgument` (it never fulfils early). On `ContinuousClock`
    /// or `SuspendingClock` it is timed as `after(_:)` is (see `timeout(_:clock:)`).
    public static func after(_ interval: Duration, clock: some Clock<Duration>) -> Promise<Void> {
        .fulfilling(()) { PromiseTimer(after: interval, on: clock, $0, clockFailed: $1) }
    }
}

extension Promise {
    /// A promise fulfilled with `value` when the timer `startTimer` starts fires (rejected
    /// if its clock fails); settling it first (a cancel, or a resolver from outside)
    /// cancels the timer.
    static func fulfilling(
        _ value: Value,
        startTimer: (_ fire: @escaping @Sendable () -> Void, _ clockFailed: @escaping @Sendable (any Error) -> Void) -> PromiseTimer
    ) -> Promise<Value> {
        let promise = Promise<Value>(madeByLibrary: ())
        let timer = startTimer({ promise.fulfill(value) }, { promise.reject($0) })
        OutcomeHook { _ in timer.cancel() }.register(on: promise)
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
    /// An interval longer than a hundred years never elapses: the child waits for its
    /// holder, and once nobody holds it, it is freed and its observers receive
    /// `PromiseError.brokenPromise`.
    public func delay(_ interval: Duration) -> Promise<Value> {
        delay { fire, _ in PromiseTimer(after: interval, fire) }
    }

    /// `delay(_:)` timed on `clock`: the interval starts when this promise fulfils, at that
    /// moment's `clock.now`.
    ///
    /// ```swift
    /// let debounced = query.delay(.milliseconds(300), clock: testClock)
    /// ```
    ///
    /// If the clock's `sleep` throws although the timer was not cancelled, or keeps
    /// returning before its deadline (as for `Promise.after(_:clock:)`), the child rejects
    /// with that error. On `ContinuousClock` or `SuspendingClock` it is timed as
    /// `delay(_:)` is (see `timeout(_:clock:)`).
    public func delay(_ interval: Duration, clock: some Clock<Duration>) -> Promise<Value> {
        delay { PromiseTimer(after: interval, on: clock, $0, clockFailed: $1) }
    }

    private func delay(
        startingTimer startTimer: @escaping @Sendable (_ fire: @escaping @Sendable () -> Void,
                                                       _ clockFailed: @escaping @Sendable (any Error) -> Void) -> PromiseTimer
    ) -> Promise<Value> {
        DerivedPromise<Value>.make(parent: self, context: .immediate, continuation: .handOff { (value: Value, child: Promise<Value>) in
            let timer = startTimer({ child.fulfill(value) }, { child.reject($0) })
            OutcomeHook { _ in timer.cancel() }.register(on: child)
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
    /// child, made earlier, is still pending for an instant. On a promise that has settled
    /// already, the child settles as it did before this returns (no timer is set).
    ///
    /// An interval longer than a hundred years never elapses: `.seconds(Int64.max)` means
    /// no timeout. A child that timed out and whose error nobody read is reported to
    /// `PromiseDiagnostics` as an unhandled rejection when it is freed, as any rejection.
    ///
    /// Threading: the timer's work (the child's rejection, and the `.immediate` handlers
    /// it runs) goes, once due, to one of a few serial queues of the library's own, not
    /// to Dispatch's global pool: a timeout fires on time even while every thread of that
    /// pool is blocked (`wait()` inside many handlers on `.default`, say), and a `wait()`
    /// on the child from one of those threads returns. The child's handlers on other
    /// contexts run when their context does. `.immediate` handlers on the child run on
    /// that queue: one that blocks holds it, and other timers go to the others (eight in
    /// all). Keep them short, as always.
    public func timeout(_ interval: Duration) -> Promise<Value> {
        timeout(interval) { fire, _ in PromiseTimer(after: interval, fire) }
    }

    /// `timeout(_:)` timed on `clock`.
    ///
    /// ```swift
    /// let page = fetch(url).timeout(.seconds(2), clock: testClock)
    /// ```
    ///
    /// If the clock's `sleep` throws although the timer was not cancelled, or keeps
    /// returning before its deadline (as for `Promise.after(_:clock:)`), the child rejects
    /// with that error (unless this promise settled it first): a clock that cannot sleep
    /// cannot time it out. On `ContinuousClock` or `SuspendingClock` it is timed as
    /// `timeout(_:)` is, so it too fires while Dispatch's global pool is blocked, counted
    /// on Dispatch's clock (which, as `SuspendingClock`, does not count time the machine
    /// sleeps); on another clock, by a Task that sleeps on it, which runs on the
    /// concurrency pool.
    public func timeout(_ interval: Duration, clock: some Clock<Duration>) -> Promise<Value> {
        timeout(interval) { PromiseTimer(after: interval, on: clock, $0, clockFailed: $1) }
    }

    /// A child that settles as this promise does, unless `deadline` comes first: then it
    /// rejects with `PromiseError.timedOut`. One deadline for a whole request, however many
    /// steps it takes, instead of a relative timeout recomputed at each step; a deadline
    /// already past (or now) rejects the child at once, before this returns, unless this
    /// promise had settled. A deadline more than a hundred years away never comes.
    ///
    /// ```swift
    /// let deadline = ContinuousClock.now + .seconds(2)
    /// let user = fetchUser(id).timeout(until: deadline)
    /// let cart = user.then { fetchCart(for: $0) }.timeout(until: deadline)
    /// ```
    ///
    /// Timed on Dispatch, as `timeout(_:)`; see `timeout(_:)` for what the child keeps.
    public func timeout(until deadline: ContinuousClock.Instant) -> Promise<Value> {
        let interval = ContinuousClock().timeLeft(until: deadline)
        return timeout(interval, rejectingAtOnceIfPast: true) { fire, _ in PromiseTimer(after: interval, fire) }
    }

    /// `timeout(until:)` with a deadline on `clock` (a clock that fails: as
    /// `timeout(_:clock:)`).
    ///
    /// ```swift
    /// let user = fetchUser(id).timeout(until: testClock.now.advanced(by: .seconds(2)), clock: testClock)
    /// ```
    public func timeout<C: Clock>(until deadline: C.Instant, clock: C) -> Promise<Value> where C.Duration == Duration {
        let interval = clock.timeLeft(until: deadline)
        return timeout(interval, rejectingAtOnceIfPast: true) { PromiseTimer(at: deadline, on: clock, $0, clockFailed: $1) }
    }

    /// `timeout(_:)` with a timer the caller schedules: `schedule` arranges for its `fire`
    /// to run once the interval it is given has passed (never negative), and returns what
    /// cancels that; an interval longer than a hundred years is never scheduled. For
    /// PromiseNIO's `timeout(_:on:)`, which schedules on an event loop: the child is the
    /// same as `timeout(_:)`'s (its place in this promise's waiter list, what it keeps,
    /// the cycle check's view of it).
    package func timeout(
        _ interval: Duration,
        scheduling schedule: (_ interval: Duration, _ fire: @escaping @Sendable () -> Void) -> @Sendable () -> Void
    ) -> Promise<Value> {
        timeout(interval) { fire, _ in PromiseTimer(after: interval, scheduling: schedule, fire) }
    }

    /// - Parameters:
    ///   - interval: how long the timer runs. Past `PromiseTimer.horizon` it sets no timer:
    ///     then only this promise settles the child (for the cycle check).
    ///   - rejectingAtOnceIfPast: for a deadline: one already past (`interval <= .zero`)
    ///     rejects the child before this returns, if this promise is still pending.
    private func timeout(_ interval: Duration, rejectingAtOnceIfPast: Bool = false,
                         startingTimer startTimer: (_ fire: @escaping @Sendable () -> Void,
                                                    _ clockFailed: @escaping @Sendable (any Error) -> Void) -> PromiseTimer) -> Promise<Value> {
        let child = DerivedPromise<Value>(linkedTo: self, settledBesidesParent: interval <= PromiseTimer.horizon)
        guard isPending else {
            // Settled already: so is the child, before this returns (also inside a handler,
            // where the waiter list would settle it only once the handler returned), and
            // no timer is set.
            child.adoptOutcome(of: self, lookingAbove: self)
            return child
        }
        if rejectingAtOnceIfPast && interval <= .zero {
            // Settled early, as by the timer: it leaves this promise as such children do,
            // and counts as reading this promise's error (see the hook below).
            child.reject(PromiseError.timedOut)
            noteErrorSeen()
            return child
        }
        let follower = TimeoutFollower(child: child)
        let list = rareState
        guard list.add(follower, on: self) == .listed else {
            child.adoptOutcome(of: self, lookingAbove: self)  // settled already: the child is too
            return child
        }
        let timer = startTimer({ child.reject(PromiseError.timedOut) }, { child.reject($0) })
        // The library's own hook, not an observer of the child's outcome: a timed-out
        // child nobody reads is reported as any unread rejection, and its description
        // shows no observer waiting. (Not generic over the value either: a `whenComplete`
        // here cost three runtime metadata lookups per timeout.)
        //
        // A child settled before this promise (timed out, cancelled, settled by hand)
        // counts as reading this promise's error, as a combinator does its inputs': a
        // backend that fails after its request timed out is no unhandled rejection. Found
        // through the child's link up, which holds no reference: this promise may still
        // die pending and break the child.
        OutcomeHook { child in
            timer.cancel()
            if list.remove(follower) { child.parentIfAlive?.noteErrorSeen() }
        }.register(on: child)
        return child
    }
}

extension Clock where Duration == Swift.Duration {
    /// How long from `now` until `deadline`: `.zero` once it has come. Compares before it
    /// subtracts: `duration(to:)` traps where the difference overflows, as it does from a
    /// deadline near the most negative duration.
    func timeLeft(until deadline: Instant) -> Duration {
        let now = self.now
        return now < deadline ? now.duration(to: deadline) : .zero
    }
}
