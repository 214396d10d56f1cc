// Combinators that run user work one step at a time: `sequence` here, `retry` in
// Promise+Retry.swift; both wait for one step at a time (`StepInFlight`).

/// The step a `sequence` or `retry` waits for: the one promise a cancel of the output must
/// reach. One per run, registered once with the output's `onCancel`, so a run of any
/// length holds nothing of its finished steps. The step is held weakly: the output looks
/// down at its input, which its own resolver keeps alive (a strong link here would also
/// close a cycle through the step's observer, which holds the run).
///
/// Threading: a spin lock in one word (`withWordLock`), taken once per step and once per
/// cancel, never around a call out (cold paths: never on the register, settle or fire
/// path of any promise).
final class StepInFlight: @unchecked Sendable {
    // First stored property, so that its address is known without a lookup.
    private final var lockWord: UInt = 0
    private weak var step: AnyPromise?
    private var cancelReason: (any Error)?

    private func withLock<T>(_ body: () -> T) -> T {
        withWordLock(_getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: UInt.self), body)
    }

    /// Makes `step` the one in flight; cancels it at once if the output was cancelled
    /// before it started.
    func start(_ step: AnyPromise) {
        let reason: (any Error)? = withLock {
            if cancelReason == nil { self.step = step }
            return cancelReason
        }
        if let reason { step.cancel(reason: reason) }
    }

    /// The output was cancelled: cancels the step in flight, and any that starts later.
    func cancel(reason: any Error) {
        let step: AnyPromise? = withLock {
            cancelReason = reason
            defer { self.step = nil }
            return self.step
        }
        step?.cancel(reason: reason)
    }
}

/// The values `sequence` has collected. Touched by one step at a time: each step starts
/// only after the previous one's promise settled, which orders the accesses.
private final class Collected<Value: Sendable>: @unchecked Sendable {
    var values: [Value] = []
}

extension Promise {
    /// Runs `work` on each input in turn, starting the next step when the previous
    /// promise fulfilled; fulfils with all values in order, or rejects with the first
    /// error (no later step starts).
    ///
    /// ```swift
    /// let uploaded = Promise.sequence(files) { file in upload(file) }   // Promise<[Receipt]>
    /// ```
    ///
    /// Cancelling the result cancels the step in flight and starts no other. The run holds
    /// only the step in flight: each finished step is freed as soon as nobody else holds it.
    ///
    /// Threading: `work` runs on `context`, once per input, never two at a time.
    public static func sequence<Inputs: Sequence>(
        on context: any ExecutionContext = .default,
        _ inputs: Inputs,
        _ work: @escaping @Sendable (Inputs.Element) throws -> Promise<Value>
    ) -> Promise<[Value]> where Inputs.Element: Sendable {
        let items = Array(inputs)
        let output = Promise<[Value]>()
        let collected = Collected<Value>()
        collected.values.reserveCapacity(items.count)
        let inFlight = StepInFlight()
        output.onCancel(withReason: { inFlight.cancel(reason: $0) })

        @Sendable func step(_ index: Int) {
            guard index < items.count else {
                output.fulfill(collected.values)
                return
            }
            context.execute {
                guard output.isPending else { return }  // cancelled: start nothing more
                let current: Promise<Value>
                do {
                    current = try work(items[index])
                } catch {
                    output.reject(error)
                    return
                }
                inFlight.start(current)
                current.whenComplete(on: .immediate) { result in
                    switch result {
                    case .success(let value):
                        collected.values.append(value)
                        step(index + 1)
                    case .failure(let error):
                        output.reject(error)
                    }
                }
            }
        }
        step(0)
        return output
    }
}
