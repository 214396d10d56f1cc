import CPromiseCore

// Aggregates over several promises. Lock-free: each input registers one slot of a
// single shared allocation, a countdown word decides who finishes, and the output's claim
// CAS elects the first input that decides the outcome early (see `Aggregator`).
//
// Cancelling an aggregate cancels its inputs that are still pending, with the same
// reason. An input that was cancelled counts as a failure with its cancellation reason:
// the aggregate rejects (it does not cancel its other inputs: never sideways).

extension Promise {
    /// Fulfils with every input's value, in input order, once all fulfil; rejects with
    /// the first error as soon as any input fails.
    ///
    /// ```swift
    /// let pages = Promise.all([fetch(a), fetch(b), fetch(c)])   // Promise<[Page]>
    /// ```
    ///
    /// `all([])` fulfils at once with `[]`.
    ///
    /// - Complexity: O(n) for n inputs, one allocation for all their observers.
    public static func all(_ promises: [Promise<Value>]) -> Promise<[Value]> {
        let output = Promise<[Value]>(madeByLibrary: ())
        guard !promises.isEmpty else {
            output.fulfill([])
            return output
        }
        let count = promises.count
        return aggregate(promises, into: output, countdown: count, settledEarlyBy: .failure) { [unowned(unsafe) output] aggregator, _, input in
            if input.isFulfilled {
                guard aggregator.countDown() else { return }
                output.fulfill(aggregator.values(as: Value.self))
            } else {
                output.reject(input.failureOrCancellation)
            }
        }
    }

    /// Fulfils, once every input has settled, with each one's outcome in input order.
    /// Never rejects. A cancelled input reads as `.failure(reason)`.
    ///
    /// ```swift
    /// let outcomes = Promise.allSettled([fetch(a), fetch(b)])
    /// outcomes.then { $0.filter { (try? $0.get()) != nil }.count }
    /// ```
    ///
    /// `allSettled([])` fulfils at once with `[]`.
    public static func allSettled(_ promises: [Promise<Value>]) -> Promise<[Result<Value, any Error>]> {
        let output = Promise<[Result<Value, any Error>]>(madeByLibrary: ())
        guard !promises.isEmpty else {
            output.fulfill([])
            return output
        }
        let count = promises.count
        return aggregate(promises, into: output, countdown: count, settledEarlyBy: .nothing) { [unowned(unsafe) output] aggregator, _, _ in
            guard aggregator.countDown() else { return }
            output.fulfill(aggregator.results(as: Value.self))
        }
    }

    /// Fulfils with the first input to fulfil; rejects with
    /// `PromiseError.allRejected(errors)` (every error, in input order) if none does.
    ///
    /// ```swift
    /// let fastest = Promise.any([mirrorA.fetch(path), mirrorB.fetch(path)])
    /// ```
    ///
    /// `any([])` rejects at once with `PromiseError.allRejected([])`.
    public static func any(_ promises: [Promise<Value>]) -> Promise<Value> {
        let output = Promise<Value>(madeByLibrary: ())
        guard !promises.isEmpty else {
            output.reject(PromiseError.allRejected([]))
            return output
        }
        let count = promises.count
        return aggregate(promises, into: output, countdown: count, settledEarlyBy: .fulfilment) { [unowned(unsafe) output] aggregator, index, input in
            if input.isFulfilled {
                output.fulfill(aggregator.value(at: index, as: Value.self))
            } else if aggregator.countDown() {
                let errors = (0..<count).map { aggregator.settledInput(at: $0).failureOrCancellation }
                output.reject(PromiseError.allRejected(errors))
            }
        }
    }

    /// Settles like the first input to settle, either way (a cancelled first input
    /// rejects it with the cancellation reason).
    ///
    /// ```swift
    /// let answer = Promise.race([query(primary), query(replica)])
    /// ```
    ///
    /// `race([])` rejects at once with `PromiseError.invalidArgument`: a race nobody can
    /// win would leave its caller waiting for ever (JavaScript's stays pending; PromiseKit's
    /// rejects with `badInput`, and so does this one).
    public static func race(_ promises: [Promise<Value>]) -> Promise<Value> {
        guard !promises.isEmpty else {
            return Promise.madeByLibrary(rejectedWith: PromiseError.invalidArgument(
                "Promise.race needs at least one promise, and was given none: nothing could ever settle it"))
        }
        let output = Promise<Value>(madeByLibrary: ())
        return aggregate(promises, into: output, countdown: promises.count, settledEarlyBy: .anyOutcome) { [unowned(unsafe) output] aggregator, index, input in
            if input.isFulfilled {
                output.fulfill(aggregator.value(at: index, as: Value.self))
            } else {
                output.reject(input.failureOrCancellation)
            }
        }
    }

    /// Combines this promise with others of any types into one promise of a tuple:
    /// fulfils once all fulfil, rejects with the first error.
    ///
    /// ```swift
    /// let screen = user.and(settings, avatar)   // Promise<(User, Settings, Data)>
    /// screen.then { user, settings, avatar in render(user, settings, avatar) }
    /// ```
    public func and<each Other: Sendable>(
        _ others: repeat Promise<each Other>
    ) -> Promise<(Value, repeat each Other)> {
        var inputs: [AnyPromise] = [self]
        for other in repeat each others { inputs.append(other) }
        let output = Promise<(Value, repeat each Other)>(madeByLibrary: ())
        return Self.aggregate(inputs, into: output, countdown: inputs.count, settledEarlyBy: .failure) { [unowned(unsafe) output] aggregator, _, input in
            guard input.isFulfilled else {
                output.reject(input.failureOrCancellation)
                return
            }
            guard aggregator.countDown() else { return }
            var index = 0
            func next<T: Sendable>(_ type: T.Type) -> T {
                index += 1
                return aggregator.value(at: index, as: type)
            }
            output.fulfill((aggregator.value(at: 0, as: Value.self), repeat next((each Other).self)))
        }
    }

    /// Wires `inputs` to `output` through an `Aggregator`, forwarding the output's
    /// cancellation to the inputs still pending.
    ///
    /// Ownership: the aggregator is the output's resolver, so it holds the output
    /// strongly until the output has settled (each policy reaches it `unowned(unsafe)`:
    /// the aggregator outlives every policy call) and is itself held by the inputs it
    /// observes; a caller that keeps only a child of the output still gets its value. Once
    /// the output has settled the aggregator drops it and every settled input (see
    /// `Aggregator.slotFired`): at once when the policy settled it or a cancel did, and when
    /// its holder settled it (`settledRootLetsGoOfItsInputs`). The output reaches the
    /// aggregator through its rare state, which holds the aggregator's memory, not the
    /// aggregator (`recordAggregator`), so no cycle forms: once the inputs are gone
    /// (settled or dropped), the aggregator and an unreferenced output are freed. Through
    /// that link a cancel of the output reaches the inputs still pending (`cancel`), and
    /// the cycle check sees what the output waits on (`wouldWaitOnItself`).
    ///
    /// The inputs are read through a buffer of `AnyPromise`, the same references rebound,
    /// not converted with `as [AnyPromise]`: without Objective-C bridging, that upcast
    /// copies the array with a dynamic cast per element, in code generic over the value.
    static func aggregate<Input: AnyPromise, Output: Sendable>(
        _ inputs: [Input],
        into output: Promise<Output>,
        countdown: Int,
        settledEarlyBy: Aggregator.SettledEarlyBy,
        _ inputSettled: @escaping Aggregator.InputSettled
    ) -> Promise<Output> {
        inputs.withUnsafeBufferPointer { typed in
            typed.withMemoryRebound(to: AnyPromise.self) { inputs in
                let aggregator = Aggregator(inputs: inputs, output: output, countdown: countdown,
                                            settledEarlyBy: settledEarlyBy, inputSettled: inputSettled)
                output.recordAggregator(aggregator)
                aggregator.start(inputs)
            }
        }
        return output
    }
}
