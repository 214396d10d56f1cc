import Foundation
import XCTest

/// The stress suite's knobs: iterations per test and a wall-clock cap, from the
/// environment (PROMISE_STRESS_ITERATIONS, PROMISE_STRESS_SECONDS), with defaults that
/// finish well under a minute on two cores.
///
/// Every stress test runs `min(iterations, rounds that fit in seconds)` rounds and checks
/// its invariants after each one. `make stress` raises both knobs; the sanitizer targets
/// lower them (see mk/stress.mk and the README).
enum StressConfiguration {
    static var iterations: Int {
        ProcessInfo.processInfo.environment["PROMISE_STRESS_ITERATIONS"].flatMap(Int.init) ?? 2_000
    }

    static var seconds: Double {
        ProcessInfo.processInfo.environment["PROMISE_STRESS_SECONDS"].flatMap(Double.init) ?? 10
    }

    /// How far the resident set of the memory churn test may grow over the level it had
    /// after its warm-up rounds, in MiB (PROMISE_STRESS_RSS_GROWTH_MIB). The sanitizer
    /// runs raise it: ASan's quarantine and TSan's shadow memory grow with the churn.
    static var rssGrowthLimitMiB: Int {
        ProcessInfo.processInfo.environment["PROMISE_STRESS_RSS_GROWTH_MIB"].flatMap(Int.init) ?? 64
    }

    /// How long one round may take to come to rest (threads done, every handler run,
    /// every promise settled) before it counts as a hang. Generous: sanitizer runs on two
    /// busy cores are slow.
    static let roundTimeout: TimeInterval = 30
}

/// The invariant checks of one round: a failure is reported through XCTest, naming the
/// round, and ends the test after this round (the first failing round is the useful one).
final class RoundChecker {
    let round: Int
    private(set) var failures = 0
    private let file: StaticString
    private let line: UInt

    init(round: Int, file: StaticString, line: UInt) {
        self.round = round
        self.file = file
        self.line = line
    }

    /// Fails the round unless `condition` holds. Only the first few failures of a round
    /// are reported, so that one broken invariant does not print thousands of lines.
    func check(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String) {
        guard !condition() else { return }
        failures += 1
        if failures <= 8 {
            XCTFail("round \(round): \(message())", file: file, line: line)
        }
    }

    func fail(_ message: String) {
        check(false, message)
    }
}

/// Runs `body` round after round until `StressConfiguration.iterations` rounds ran, the
/// `StressConfiguration.seconds` cap passed, or a round failed; then prints the summary
/// line `stress: <name>: <rounds> rounds in <s>s, invariants: <list>` and, when `details`
/// has something to say, a second line with what the rounds hit (how often the race
/// windows were entered, counts, resident set).
///
/// `body` returns false to stop early (a hang it already reported).
func runStressRounds(
    _ name: String,
    invariants: [String],
    file: StaticString = #filePath,
    line: UInt = #line,
    details: () -> String = { "" },
    _ body: (RoundChecker) -> Bool
) {
    let limit = max(1, StressConfiguration.iterations)
    let cap = StressConfiguration.seconds
    let clock = ContinuousClock()
    let start = clock.now
    var rounds = 0
    var failed = false
    while rounds < limit {
        let checker = RoundChecker(round: rounds, file: file, line: line)
        let keepGoing = body(checker)
        rounds += 1
        if checker.failures > 0 || !keepGoing {
            failed = true
            break
        }
        if secondsSince(start, clock) >= cap { break }
    }
    let elapsed = secondsSince(start, clock)
    let verdict = failed ? " (stopped at a failing round)" : ""
    print("stress: \(name): \(rounds) rounds in \(String(format: "%.2f", elapsed))s\(verdict), "
          + "invariants: \(invariants.joined(separator: "; "))")
    let extra = details()
    if !extra.isEmpty { print("stress: \(name): \(extra)") }
    fflush(nil)  // all streams: XCTest prints through the same stdout
}

private func secondsSince(_ start: ContinuousClock.Instant, _ clock: ContinuousClock) -> Double {
    let elapsed = clock.now - start
    let (seconds, attoseconds) = elapsed.components
    return Double(seconds) + Double(attoseconds) / 1e18
}
