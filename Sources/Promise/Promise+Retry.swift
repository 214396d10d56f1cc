import Dispatch

// `retry`: attempts, the pause between them (`RetryBackoff`), which errors are worth
// another attempt, and the one step in flight a cancel must reach (`StepInFlight`).

/// How long `Promise.retry` pauses before each new attempt: a fixed delay, or one that
/// grows exponentially up to a cap, each optionally spread by jitter so that many clients
/// failing together do not retry together.
///
/// ```swift
/// let config = Promise.retry(
///     attempts: 5,
///     backoff: .exponential(initial: .milliseconds(100), maximum: .seconds(2), jitter: 0.5)
/// ) { fetchConfig() }
/// ```
///
/// The values may come from configuration: `retry` checks them and rejects with
/// `PromiseError.invalidArgument` (saying which value and why) instead of trapping.
public struct RetryBackoff: Sendable, Equatable {
    /// The pause before the second attempt.
    ///
    /// ```swift
    /// RetryBackoff.exponential(initial: .milliseconds(100), maximum: .seconds(1)).initial   // 0.1 seconds
    /// ```
    public let initial: Duration
    /// Each pause is the previous one times this (1 for a fixed delay).
    ///
    /// ```swift
    /// RetryBackoff.fixed(.seconds(1)).multiplier   // 1.0
    /// ```
    public let multiplier: Double
    /// No pause is longer than this (before jitter).
    ///
    /// ```swift
    /// // 1 s, 2 s, 4 s, 5 s, 5 s...
    /// RetryBackoff.exponential(initial: .seconds(1), maximum: .seconds(5)).maximum   // 5.0 seconds
    /// ```
    public let maximum: Duration
    /// The share of each pause that is random, from 0 (none) to 1 ("full jitter"): a pause
    /// `d` becomes a uniform draw from `d * (1 - jitter) ... d`.
    ///
    /// ```swift
    /// RetryBackoff.fixed(.seconds(2), jitter: 0.5)   // each pause between 1 s and 2 s
    /// ```
    public let jitter: Double

    /// The same pause `delay` before every new attempt (`.zero`: retry at once), spread by
    /// `jitter` (see `jitter`).
    ///
    /// ```swift
    /// let alive = Promise.retry(attempts: 3, backoff: .fixed(.milliseconds(10))) { ping() }
    /// ```
    public static func fixed(_ delay: Duration, jitter: Double = 0) -> RetryBackoff {
        RetryBackoff(initial: delay, multiplier: 1, maximum: delay, jitter: jitter)
    }

    /// Pauses of `initial`, `initial * multiplier`, `initial * multiplier²`... up to
    /// `maximum`, each spread by `jitter` (see `jitter`).
    ///
    /// ```swift
    /// // 100 ms, 200 ms, 400 ms, 800 ms, 1 s, 1 s...; each one 50 to 100 % of that
    /// RetryBackoff.exponential(initial: .milliseconds(100), maximum: .seconds(1), jitter: 0.5)
    /// ```
    public static func exponential(
        initial: Duration,
        multiplier: Double = 2,
        maximum: Duration,
        jitter: Double = 0
    ) -> RetryBackoff {
        RetryBackoff(initial: initial, multiplier: multiplier, maximum: maximum, jitter: jitter)
    }

    /// What is wrong with these values, as the sentence of an `invalidArgument`; nil if
    /// nothing.
    var problem: String? {
        if initial < .zero { return "the first pause (\(initial)) is negative" }
        if maximum < initial { return "the longest pause (\(maximum)) is shorter than the first (\(initial))" }
        if !(multiplier >= 1) || !multiplier.isFinite {
            return "the multiplier (\(multiplier)) must be a finite number of at least 1"
        }
        if !(0...1).contains(jitter) { return "the jitter (\(jitter)) must be between 0 and 1" }
        return nil
    }

    /// The pause before attempt `attempt + 1`, after `attempt` (from 1) failed, before
    /// jitter. Computed in floating point, so that a large attempt number or multiplier
    /// reaches the cap instead of overflowing.
    func pause(afterAttempt attempt: Int) -> Duration {
        guard multiplier > 1, attempt > 1, initial > .zero, initial < maximum else { return initial }
        let seconds = initial.inSeconds * power(multiplier, attempt - 1)
        guard seconds < maximum.inSeconds else { return maximum }
        // Whole nanoseconds (Dispatch's resolution): 0.1 s * 3 is 0.3 s, not 0.30000000000000004.
        // Past Int64's nanoseconds (about 292 years, under a cap set that high), whole
        // seconds: such a pause is past `PromiseTimer.horizon`, and ends the run.
        let nanoseconds = (seconds * 1e9).rounded()
        return nanoseconds < Double(Int64.max) ? .nanoseconds(Int64(nanoseconds)) : .seconds(seconds.rounded())
    }

    /// `pause(afterAttempt:)` with the jitter drawn from `random` (for tests: a run draws
    /// from the system's generator, `jittered(_:draw:)`).
    func pause(afterAttempt attempt: Int, using random: inout some RandomNumberGenerator) -> Duration {
        let pause = self.pause(afterAttempt: attempt)
        guard jitter > 0, pause > .zero else { return pause }
        return jittered(pause, draw: Double.random(in: 0...1, using: &random))
    }

    /// `pause` spread by the jitter, `draw` (from 0 to 1) saying where in its share.
    func jittered(_ pause: Duration, draw: Double) -> Duration {
        guard jitter > 0, pause > .zero else { return pause }
        return pause * (1 - jitter * draw)
    }
}

extension Duration {
    /// The duration in seconds, as a floating-point number. By division, not through
    /// `components`, which traps on a duration past `Int64.max` seconds (a cap read from
    /// configuration may be one).
    fileprivate var inSeconds: Double {
        self / .seconds(1)
    }
}

/// SplitMix64 (Steele, Lea and Flood): a generator with 64 bits of state of its own, for
/// spread, not secrecy (`retry`'s jitter, and tests). Not the system generator: it is an
/// empty struct, and ThreadSanitizer's builds crash instrumenting an `inout` of it (its
/// address is whatever a register held), which every draw from it takes.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) {
        state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// `base` to the power `exponent` (at least 0), by squaring: `pow` would need Foundation
/// or the C library. Overflows to infinity, which the cap then replaces.
private func power(_ base: Double, _ exponent: Int) -> Double {
    var result = 1.0, factor = base, remaining = exponent
    while remaining > 0 {
        if remaining & 1 == 1 { result *= factor }
        factor *= factor
        remaining >>= 1
    }
    return result
}

/// The step a `retry` waits for (an attempt, or the pause before the next): the one
/// promise a cancel of the output must reach. One per run, reached from the output's hook
/// (`OutcomeHook`), so a run of any length holds nothing of its finished steps. The step is
/// held weakly: the output looks down at its input, which its own resolver keeps alive (a
/// strong link here would also close a cycle through the step's observer, which holds the
/// run).
///
/// Threading: its spin lock (`SpinLocked`), taken once per step and once when the output
/// settles (cold paths: never on the register, settle or fire path of any promise).
final class StepInFlight: SpinLocked, @unchecked Sendable {
    private weak var step: AnyPromise?
    /// Whether `step` is a pause, the run's own timer promise (not an attempt the user's
    /// code returned).
    private var stepIsPause = false
    private var cancelReason: (any Error)?
    private var left = false

    /// Makes `step` the one in flight (`isPause`: the run's own pause); cancels it at once
    /// if the output was cancelled before it started, or, a pause, if the output settled
    /// otherwise. (An attempt is the user's: the run's observer on it gives up, see
    /// `StepObserver`.)
    func start(_ step: AnyPromise, isPause: Bool = false) {
        let (reason, left): ((any Error)?, Bool) = withLock {
            if cancelReason == nil && !self.left {
                self.step = step
                stepIsPause = isPause
            }
            return (cancelReason, self.left)
        }
        if let reason {
            step.cancelOwnedWork(reason: reason)
        } else if left && isPause {
            step.cancel()  // the output settled as the pause was made: the run's own, it goes
        }
    }

    /// For the cycle check (`RetryRun`'s `WaitedOnByOutput`): the output waits on the
    /// attempt in flight alone. None between two attempts, or during a pause (a timer
    /// settles it).
    func appendLinkedInputs(to inputs: inout [AnyPromise], limit: Int) -> (complete: Bool, unlinked: Bool) {
        guard limit > 0, let step = withLock({ stepIsPause ? nil : step }) else { return (true, false) }
        inputs.append(step)
        return (true, false)
    }

    /// The output was cancelled: cancels the step in flight, and any that starts later.
    func cancel(reason: any Error) {
        let step: AnyPromise? = withLock {
            cancelReason = reason
            defer { self.step = nil }
            return self.step
        }
        step?.cancelOwnedWork(reason: reason)
    }

    /// The output settled otherwise (the run fulfilled or rejected it, or its holder did),
    /// or locked in to follow another promise: an attempt in flight goes on, but the run's observer on it gives up
    /// (`StepObserver`), so that an attempt that lives on keeps the run only until its
    /// next prune; a pause, the run's own, is cancelled, which lets go of the run at once.
    func leave() {
        let (step, isPause): (AnyPromise?, Bool) = withLock {
            left = true
            defer { self.step = nil }
            return (self.step, stepIsPause)
        }
        if isPause { step?.cancel() } else { step?.runStoppedWatching() }
    }
}

/// A `retry` run: it holds the output it settles, and every closure of the run holds it,
/// while the output's hook does not. So if they all let go while the output is pending (a
/// context that drops an attempt or a `shouldRetry` call unrun), nothing can go on with
/// it: the deinit rejects the output with `PromiseError.brokenPromise`.
///
/// It also holds the user's code (`body`, `shouldRetry`, and the pause maker with its
/// clock), and lets go of it when the output settles or locks in to follow another
/// promise: an attempt that lives on keeps the run until its next prune (`StepObserver`),
/// but none of that code or its captures.
private final class RetryRun<Value: Sendable>: SpinLocked, WaitedOnByOutput, @unchecked Sendable {
    typealias Code = (body: @Sendable () throws -> Promise<Value>,
                      shouldRetry: (@Sendable (any Error) -> Bool)?,
                      makePause: @Sendable (Duration) -> Promise<Void>)
    let output = Promise<Value>(madeByLibrary: ())
    let inFlight = StepInFlight()
    /// Under the lock; nil once the output settled.
    private var userCode: Code?

    /// The run's jitter draws (`nextJitterDraw`), under the lock.
    private var jitterRandom: SplitMix64

    init(_ code: Code) {
        userCode = code
        jitterRandom = SplitMix64(seed: 0)  // seeded below, once the run has an address
        super.init()
        jitterRandom = SplitMix64(seed: DispatchTime.now().uptimeNanoseconds ^ UInt64(UInt(bitPattern: ObjectIdentifier(self).hashValue)))
    }

    /// A draw from 0 up to 1 for the jitter, from the run's own generator, seeded from the
    /// clock and the run's address: spread is all a jitter needs (see `SplitMix64`).
    func nextJitterDraw() -> Double {
        Double(withLock { jitterRandom.next() } >> 11) * 0x1p-53
    }

    /// The user's code, or nil once the output settled.
    var code: Code? { withLock { userCode } }

    /// The latest attempt started and the latest failure decided (`shouldRetry`), under the
    /// lock: so that a context that runs its work twice (a broken contract) starts each
    /// attempt, and asks about each failure, once.
    private var attemptsStarted = 0
    private var failuresDecided = 0

    /// The user's code for attempt `number`, or nil if that attempt started already or the
    /// output settled.
    func codeForAttempt(_ number: Int) -> Code? {
        withLock {
            guard number > attemptsStarted else { return nil }
            attemptsStarted = number
            return userCode
        }
    }

    /// Whether this run is the first to decide on the failure of attempt `number`.
    func claimDecision(_ number: Int) -> Bool {
        withLock {
            guard number > failuresDecided else { return false }
            failuresDecided = number
            return true
        }
    }

    /// The output settled: passes a cancel on to the step in flight, or has the run's
    /// observer on it leave, and lets go of the user's code.
    func outputSettled(_ output: AnyPromise) {
        if output.isCancelled {
            inFlight.cancel(reason: output.failureOrCancellation)
        } else {
            inFlight.leave()
        }
        letGoOfUserCode()
    }

    private func letGoOfUserCode() {
        let code = withLock { () -> Code? in
            defer { userCode = nil }
            return userCode
        }
        _ = consume code  // released outside the lock
    }

    // The cycle check's view of the run (`WaitedOnByOutput`): the attempt in flight.

    func appendLinkedInputs(to inputs: inout [AnyPromise], limit: Int) -> (complete: Bool, unlinked: Bool) {
        inFlight.appendLinkedInputs(to: &inputs, limit: limit)
    }

    /// The output settles as its attempts go, none of them settling it early for sure.
    var settledEarlyBy: Aggregator.SettledEarlyBy { .nothing }

    /// The output locked in to follow another promise: no attempt can settle it any more.
    func outputLockedIn() {
        inFlight.leave()
        letGoOfUserCode()
    }

    deinit {
        output.breakOnALaneIfPending()
    }
}

extension Promise {
    /// Calls `body` until the promise it returns fulfils, at most `attempts` times in
    /// all, waiting `delay` between attempts; rejects with the last error.
    ///
    /// ```swift
    /// let config = Promise.retry(attempts: 3, delay: .milliseconds(10)) { fetchConfig() }
    /// ```
    ///
    /// `retry(attempts:backoff:clock:on:shouldRetry:_:)` with `.fixed(delay)`, every error
    /// retried, timed on Dispatch.
    public static func retry(
        attempts: Int,
        delay: Duration = .zero,
        on context: any ExecutionContext = .default,
        _ body: @escaping @Sendable () throws -> Promise<Value>
    ) -> Promise<Value> {
        // Named as the caller named it: this overload has no backoff to speak of.
        guard delay >= .zero else {
            return Promise.madeByLibrary(rejectedWith: PromiseError.invalidArgument(
                "Promise.retry's delay between attempts (\(delay)) is negative"))
        }
        return retry(attempts: attempts, backoff: .fixed(delay), on: context, shouldRetry: nil,
                     pause: { Promise<Void>.after($0) }, body)
    }

    /// Calls `body` until the promise it returns fulfils, at most `attempts` times in
    /// all, pausing as `backoff` says between attempts; rejects with the last error, or at
    /// once with an error `shouldRetry` declines.
    ///
    /// ```swift
    /// let order = Promise.retry(
    ///     attempts: 4,
    ///     backoff: .exponential(initial: .milliseconds(50), maximum: .seconds(1), jitter: 1),
    ///     shouldRetry: { ($0 as? HTTPError)?.isTransient ?? false }
    /// ) { placeOrder() }
    /// ```
    ///
    /// Cancelling the result cancels the attempt in flight (or the pause between two
    /// attempts, whose timer then lets go of the run) and starts no other. A cancelled
    /// attempt is not retried. The run holds only the attempt in flight. (An attempt that
    /// the context was already starting as the cancel came may still call `body`; the
    /// promise it returns is cancelled at once if it is still pending. Only waiting on
    /// `body` could rule that out.)
    ///
    /// `attempts` below 1, or a `backoff` with values out of range (both may come from
    /// configuration), call `body` never and return a promise rejected with
    /// `PromiseError.invalidArgument`, which says what was wrong. A pause longer than a
    /// hundred years (under a cap set that high) would never elapse: the run ends there,
    /// rejected with the last attempt's error, as when the attempts run out.
    ///
    /// Threading: `body` and `shouldRetry` run on `context`. The pauses are timed on
    /// `clock` when one is given (a test passes a clock it advances by hand), on Dispatch
    /// otherwise; a clock whose `sleep` throws during a pause (other than for the run's own
    /// cancel), or keeps returning before its deadline (as for `Promise.after(_:clock:)`),
    /// ends the run, rejected with that error. On `.immediate`, attempts that fail
    /// at once with no pause between them
    /// all run before `retry` returns (without growing the stack): keep `attempts` bounded.
    public static func retry<C: Clock>(
        attempts: Int,
        backoff: RetryBackoff,
        clock: C,
        on context: any ExecutionContext = .default,
        shouldRetry: (@Sendable (any Error) -> Bool)? = nil,
        _ body: @escaping @Sendable () throws -> Promise<Value>
    ) -> Promise<Value> where C.Duration == Duration {
        retry(attempts: attempts, backoff: backoff, on: context, shouldRetry: shouldRetry,
              pause: { Promise<Void>.after($0, clock: clock) }, body)
    }

    /// `retry(attempts:backoff:clock:on:shouldRetry:_:)` with its pauses timed on Dispatch.
    ///
    /// ```swift
    /// let config = Promise.retry(attempts: 3, backoff: .fixed(.milliseconds(10)), shouldRetry: { !($0 is AuthError) }) {
    ///     fetchConfig()
    /// }
    /// ```
    public static func retry(
        attempts: Int,
        backoff: RetryBackoff,
        on context: any ExecutionContext = .default,
        shouldRetry: (@Sendable (any Error) -> Bool)? = nil,
        _ body: @escaping @Sendable () throws -> Promise<Value>
    ) -> Promise<Value> {
        retry(attempts: attempts, backoff: backoff, on: context, shouldRetry: shouldRetry,
              pause: { Promise<Void>.after($0) }, body)
    }

    private static func retry(
        attempts: Int,
        backoff: RetryBackoff,
        on context: any ExecutionContext,
        shouldRetry: (@Sendable (any Error) -> Bool)?,
        pause makePause: @escaping @Sendable (Duration) -> Promise<Void>,
        _ body: @escaping @Sendable () throws -> Promise<Value>
    ) -> Promise<Value> {
        guard attempts >= 1 else {
            return Promise.madeByLibrary(rejectedWith: PromiseError.invalidArgument(
                "Promise.retry needs at least one attempt, and was given \(attempts)"))
        }
        if let problem = backoff.problem {
            return Promise.madeByLibrary(rejectedWith: PromiseError.invalidArgument("Promise.retry's backoff is out of range: \(problem)"))
        }
        let run = RetryRun<Value>((body, shouldRetry, makePause))
        let inFlight = run.inFlight
        run.output.recordRun(run)  // for the cycle check
        // Weakly: the run holds the output (a strong link back would be a cycle).
        OutcomeHook { [weak run] output in
            output.forgetRun()
            run?.outputSettled(output)
        }.register(on: run.output)

        @Sendable func attempt(_ number: Int) {
            context.execute {
                // Settled or locked in: no more attempts (and the code is let go once settled).
                guard run.output.isFreeToSettle, let body = run.codeForAttempt(number)?.body else { return }
                let current: Promise<Value>
                do {
                    current = try body()
                } catch {
                    current = Promise.madeByLibrary(rejectedWith: error)
                }
                inFlight.start(current)
                // `current` weakly: its own observer must not keep it alive (a cycle while it
                // is pending); when this runs, its firing holds it.
                StepObserver<Value>(until: run.output) { [weak current] result in
                    switch result {
                    case .success(let value):
                        run.output.fulfill(value)
                    case .failure(let error):
                        if number >= attempts || current?.isCancelled == true {
                            run.output.reject(error)
                            return
                        }
                        guard let code = run.code else { return }  // settled meanwhile
                        guard let shouldRetry = code.shouldRetry else { return pauseThenRetry(after: number, failedWith: error) }
                        // The predicate is user code too: it runs on `context`, as `body` does.
                        context.execute {
                            // Settled meanwhile, or asked already (a context running it twice).
                            guard run.output.isFreeToSettle, run.claimDecision(number) else { return }
                            if shouldRetry(error) { pauseThenRetry(after: number, failedWith: error) } else { run.output.reject(error) }
                        }
                    }
                }.register(on: current)
                // An attempt that waits on the output would never settle it.
                run.output.rejectAsCycleIfWaited(onBy: current)
                // Settled or locked in meanwhile, after `leave` had looked for this step:
                // give up now.
                if !run.output.isFreeToSettle { current.runStoppedWatching() }
            }
        }

        /// Pauses as the backoff says after failed attempt `number`, then makes the next.
        @Sendable func pauseThenRetry(after number: Int, failedWith error: any Error) {
            let planned = backoff.pause(afterAttempt: number)
            guard planned <= PromiseTimer.horizon else {
                // A pause that never elapses: no attempt can come after it. The run ends
                // here, as when the attempts run out, rather than leave its caller waiting
                // for ever. Decided before the jitter, so that one configuration always
                // does the same.
                run.output.reject(error)
                return
            }
            let delay = backoff.jittered(planned, draw: run.nextJitterDraw())
            if delay <= .zero {
                attempt(number + 1)
                return
            }
            // The pause is the step in flight: cancelling the output cancels its timer,
            // which lets go of the run at once.
            guard run.output.isFreeToSettle, let makePause = run.code?.makePause else { return }  // settled meanwhile
            let pause = makePause(delay)
            inFlight.start(pause, isPause: true)
            StepObserver<Void>(until: run.output) { result in
                // (Cancelled, only the output's cancel does, and then the box does not run.)
                switch result {
                case .success: attempt(number + 1)
                // The clock could not time the pause (its sleep threw): no attempt can come
                // after it, and its error says why.
                case .failure(let clockError): run.output.reject(clockError)
                }
            }.register(on: pause)
        }
        attempt(1)
        return run.output
    }
}
