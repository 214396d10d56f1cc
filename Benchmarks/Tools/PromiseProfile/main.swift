// Runs one benchmark case in a loop, without package-benchmark: a small release binary for
// `valgrind --tool=callgrind` (instruction counts are stable on a loaded machine).
//
//   PromiseProfile list
//   PromiseProfile <case/impl> [rounds] [--prepare-only]   e.g. PromiseProfile settle-one/promise 20
//
// `list` prints each case with its operations per round, and "prepared" for the cases whose
// inputs package-benchmark builds outside the measurement (`--prepare-only` runs just that).
import BenchmarkCases
import Foundation

let prepareOnly = CommandLine.arguments.contains("--prepare-only")
let arguments = CommandLine.arguments.dropFirst().filter { $0 != "--prepare-only" }
guard let id = arguments.first, id != "list" else {
    for benchmarkCase in allCases {
        print("\(benchmarkCase.id)\t\(benchmarkCase.ops) ops/round\(benchmarkCase.isPrepared ? "\tprepared" : "")")
    }
    exit(0)
}
guard let benchmarkCase = allCases.first(where: { $0.id == id }) else {
    FileHandle.standardError.write("unknown case \(id); `PromiseProfile list` names them\n".data(using: .utf8)!)
    exit(2)
}
let rounds = arguments.dropFirst().first.flatMap { Int($0) } ?? 10
benchmarkCase.run(rounds: rounds, prepareOnly: prepareOnly)
print("\(benchmarkCase.id): \(rounds) rounds of \(benchmarkCase.ops) ops")
