// The benchmark suite: every case of `BenchmarkCases.allCases`, for our promise and for each
// baseline, under package-benchmark. Each iteration runs `ops` operations (the tag); wall
// clock and malloc counts are recorded per iteration, and `bench.py` divides by `ops`.
//
// Run through `make bench` (the table) or `make bench-check` (the malloc thresholds).
// PROMISE_BENCH_MAX_ITERATIONS lowers the iterations per benchmark: bench-check reads only
// malloc counts, which are the same in every iteration, so it runs a few.
import Benchmark
import BenchmarkCases
import Foundation

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .mallocCountTotal, .throughput],  // throughput: the JMH export wants it
        timeUnits: .nanoseconds,
        warmupIterations: 3,
        scalingFactor: .one,
        maxDuration: .milliseconds(1_200),
        maxIterations: ProcessInfo.processInfo.environment["PROMISE_BENCH_MAX_ITERATIONS"].flatMap(Int.init) ?? 1_000
    )

    for benchmarkCase in allCases {
        let configuration = Benchmark.Configuration(tags: ["ops": "\(benchmarkCase.ops)"])
        switch benchmarkCase.body {
        case .sync(let run):
            Benchmark(benchmarkCase.id, configuration: configuration) { _ in
                run()
            }
        case .async(let run):
            Benchmark(benchmarkCase.id, configuration: configuration) { _ async in
                await run()
            }
        case .prepared(let prepare):
            Benchmark(benchmarkCase.id, configuration: configuration) { benchmark in
                let measured = prepare()
                benchmark.startMeasurement()
                measured()
                benchmark.stopMeasurement()
                sink(measured)  // inputs are freed after the measurement
            }
        }
    }
}
