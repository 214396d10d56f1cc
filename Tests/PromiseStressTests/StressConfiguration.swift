import Foundation

/// The stress suite's knobs: iterations per test and a wall-clock cap, from the
/// environment (PROMISE_STRESS_ITERATIONS, PROMISE_STRESS_SECONDS), with defaults that
/// finish well under a minute on two cores.
enum StressConfiguration {
    static var iterations: Int {
        ProcessInfo.processInfo.environment["PROMISE_STRESS_ITERATIONS"].flatMap(Int.init) ?? 2_000
    }

    static var seconds: Double {
        ProcessInfo.processInfo.environment["PROMISE_STRESS_SECONDS"].flatMap(Double.init) ?? 10
    }
}
