// swift-tools-version: 6.1
//
// The benchmark suite: its own package, so that the library's Package.swift stays free of
// dependencies. Depends on the library by path, on ordo-one/benchmark (package-benchmark: runs,
// percentiles, malloc counters) and on SwiftNIO (the baseline, behind the trait NIOBaselines).
// Run it with `make bench`.
import PackageDescription

let package = Package(
    name: "PromiseBenchmarks",
    platforms: [.macOS(.v15)],
    // The SwiftNIO baselines (Cases/NIOCases.swift and NIO's rows of PromiseMemory). On by
    // default; `make bench-check`, which gates our promise's figures alone, turns it off
    // and so builds no SwiftNIO (over half of this package's release build).
    traits: [
        .trait(name: "NIOBaselines"),
        .default(enabledTraits: ["NIOBaselines"]),
    ],
    dependencies: [
        .package(name: "Promise", path: ".."),
        .package(url: "https://github.com/ordo-one/benchmark", exact: "1.38.1",
                 traits: ["MallocInterposer"]),
        .package(url: "https://github.com/apple/swift-nio", "2.101.0"..<"2.102.0"),
    ],
    targets: [
        // The cases, shared by the benchmark target and the profiling tool; the "lock"
        // baseline (a Mutex-based promise) lives here too.
        .target(
            name: "BenchmarkCases",
            dependencies: [
                .product(name: "Promise", package: "Promise"),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["NIOBaselines"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["NIOBaselines"])),
            ],
            path: "Cases"
        ),
        // package-benchmark finds benchmark targets by their folder's parent being named
        // `Benchmarks`: this package's own folder.
        .executableTarget(
            name: "PromiseBenchmarks",
            dependencies: [
                "BenchmarkCases",
                .product(name: "Benchmark", package: "benchmark"),
            ],
            path: "PromiseBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // Bytes per held promise, ours beside NIO's (not a benchmark: its folder's parent is
        // Tools); glibc's malloc statistics through a header-only module.
        .systemLibrary(
            name: "CMallocInfo",
            path: "Tools/CMallocInfo"
        ),
        .executableTarget(
            name: "PromiseMemory",
            dependencies: [
                "CMallocInfo",
                .product(name: "Promise", package: "Promise"),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["NIOBaselines"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["NIOBaselines"])),
            ],
            path: "Tools/PromiseMemory"
        ),
        // One case in a loop, for callgrind (not a benchmark: its folder's parent is Tools).
        .executableTarget(
            name: "PromiseProfile",
            dependencies: ["BenchmarkCases"],
            path: "Tools/PromiseProfile"
        ),
    ],
    swiftLanguageModes: [.v6]
)
