// Timers racing what makes them unneeded: a `timeout` whose deadline (0 to 1 ms) lands
// while another thread fulfils or cancels the source, and a `delay` cancelled as its timer
// fires. The timer heap decides which of the deadline and the cancel comes first;
// whichever wins, the output settles exactly once, with an outcome one of them could
// give, and nothing is left alive afterwards. Every other round the deadline is a minute
// away, so the settle or cancel must win and the outputs must be freed at once, not at the
// deadline. And timeouts an hour long, settled at once round after round, keep no memory
// until their deadlines: the resident set stays flat. Run under TSan by `make tsan`.
import Dispatch
import Foundation
import Promise
import XCTest

final class TimerStressTests: XCTestCase {
    func testDeadlinesRaceFulfilmentsAndCancels() {
        let crew = Crew(size: 2)
        defer { crew.stop() }
        var timedOut = 0, passedThrough = 0, cancelled = 0, delayed = 0

        runStressRounds("timers racing settles and cancels", invariants: [
            "a timeout output ends timed out, with the source's value, or cancelled: never pending",
            "a delay output ends with its value or cancelled: never pending",
            "every output of the round is freed, without waiting for a deadline",
        ], details: {
            "timeouts timed out: \(timedOut), passed the value through: \(passedThrough), cancelled: \(cancelled); delays fulfilled: \(delayed)"
        }) { checker in
            let round = checker.round
            let farDeadline = round % 2 == 1
            let interval = farDeadline ? Duration.seconds(60) : Duration.microseconds(round % 1_000)
            weak var weakTimeout: Promise<[Int]>?
            weak var weakDelay: Promise<[Int]>?
            do {
                let source = Promise<[Int]>()
                let timeout = source.timeout(interval)
                let delay = Promise(value: [round]).delay(interval)
                weakTimeout = timeout
                weakDelay = delay
                let finished = crew.play { seat in
                    var random = StressRandom(round: round, seat: seat)
                    crew.barrier.arriveAndWait()
                    for _ in 0..<random.below(2_000) { _ = random.next() }
                    if seat == 0 {
                        if round % 3 == 0 { timeout.cancel() } else { source.fulfill([round]) }
                    } else {
                        delay.cancel()
                    }
                }
                checker.check(finished, "round hung")
                switch Result(catching: { try timeout.wait(timeout: .seconds(20)) }) {
                case .success(let value):
                    checker.check(value == [round], "timeout passed through \(value)")
                    passedThrough += 1
                case .failure(PromiseError.timedOut):
                    checker.check(!farDeadline, "timed out a minute early")
                    timedOut += 1
                case .failure(let error):
                    checker.check(timeout.isCancelled && error is CancellationError, "timeout ended \(error)")
                    cancelled += 1
                }
                switch Result(catching: { try delay.wait(timeout: .seconds(20)) }) {
                case .success(let value):
                    checker.check(value == [round] && !farDeadline, "delay fulfilled with \(value)")
                    delayed += 1
                case .failure(let error):
                    checker.check(delay.isCancelled, "delay ended \(error)")
                }
            }
            // Whatever won, the boxes let go: nothing waits for a timer's deadline (up to a
            // minute away).
            let freed = (0..<2_000).contains { _ in
                if weakTimeout == nil && weakDelay == nil { return true }
                usleep(500)
                return false
            }
            checker.check(freed, "an output outlived its settling and its timer")
            return true
        }
    }

    /// Two hundred timeouts an hour long per round, on sources fulfilled at once: each
    /// timer is cancelled as its output settles and must leave nothing behind. With one
    /// `asyncAfter` per timer, Dispatch kept each cancelled item, about 650 bytes, until
    /// its deadline: the resident set grew by that much per timer, round after round.
    func testCancelledTimersKeepNoMemoryUntilTheirDeadlines() {
        let perRound = 200
        let warmup = max(3, min(100, StressConfiguration.iterations / 10))
        let growthLimit = StressConfiguration.rssGrowthLimitMiB << 20
        var baseline = 0, peak = 0, timers = 0
        let mib = { (bytes: Int) in String(format: "%.1f MiB", Double(bytes) / 1_048_576) }
        XCTAssertNotNil(residentSetBytes(), "cannot read /proc/self/statm")

        runStressRounds("cancelled timers", invariants: [
            "every output passes its source's value through",
            "resident set within the growth limit of its post-warm-up level",
        ], details: {
            "\(timers) timers set and cancelled; resident set after warm-up \(mib(baseline)), peak \(mib(peak)) "
                + "(limit: warm-up level + \(StressConfiguration.rssGrowthLimitMiB) MiB)"
        }) { checker in
            let round = checker.round
            for _ in 0..<perRound {
                let source = Promise<Int>()
                let output = source.timeout(.seconds(3_600))
                source.fulfill(round)
                checker.check(output.isFulfilled, "a timeout output was left \(output.state)")
            }
            timers += perRound
            guard let rss = residentSetBytes() else { return true }
            if round + 1 == warmup { baseline = rss }
            if round + 1 > warmup {
                peak = max(peak, rss)
                checker.check(rss <= baseline + growthLimit,
                              "resident set \(mib(rss)) grew more than \(StressConfiguration.rssGrowthLimitMiB) MiB "
                                  + "over its post-warm-up level \(mib(baseline)) after \(timers) cancelled timers")
            }
            return true
        }
    }
}
