// swift-tools-version:6.2
//
// Two library products:
//
//   Promise      the promise library. Depends on nothing but the toolchain and the system
//                library libatomic_ops (Debian: libatomic-ops-dev; Homebrew: libatomic_ops).
//   PromiseNIO   SwiftNIO integration: EventLoop as an ExecutionContext, Promise <->
//                EventLoopFuture. Behind the package trait `SwiftNIO`, off by default.
//
// Why a trait: SwiftPM fetches every package a manifest names, whichever products a
// consumer uses (a plain second product would check SwiftNIO and its four dependencies
// out for everybody), while a dependency named only under a trait that is off is neither
// fetched nor built, from SwiftPM 6.2 on (6.1 has traits but still fetches such a
// dependency). So a package that wants only Promise writes
//
//     .package(url: "https://github.com/OWNER/Promise.git", from: "1.0.0")
//
// and gets no SwiftNIO, and a server package enables the trait:
//
//     .package(url: "https://github.com/OWNER/Promise.git", from: "1.0.0", traits: ["SwiftNIO"])
//     ... .product(name: "PromiseNIO", package: "Promise")
//
// Hence swift-tools-version 6.2. Swift 6.0 and 6.1 read Package@swift-6.0.swift instead
// (SwiftPM picks the newest manifest its tools can read), which offers the Promise product
// alone. In this repository, `make` enables the trait (`swift build --traits SwiftNIO`), so
// PromiseNIO is built and tested with the rest.
// Package@swift-6.0.swift repeats the targets below but PromiseNIO's: keep it in step.
import PackageDescription

let package = Package(
    name: "Promise",
    // `Duration` (timeouts, delays) needs these; Linux has no minimum.
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    products: [
        .library(name: "Promise", targets: ["Promise"]),
        .library(name: "PromiseNIO", targets: ["PromiseNIO"]),
    ],
    traits: [
        .trait(
            name: "SwiftNIO",
            description: "Builds PromiseNIO against SwiftNIO (NIOCore): event loops as execution contexts, Promise <-> EventLoopFuture."
        ),
    ],
    dependencies: [
        // Fetched only when a package enables the SwiftNIO trait. The floor is the release
        // CI builds and tests against.
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CAtomicOps",
            pkgConfig: "atomic_ops",
            providers: [.apt(["libatomic-ops-dev"]), .brew(["libatomic_ops"])]
        ),
        .target(
            name: "CPromiseCore",
            dependencies: ["CAtomicOps"]
        ),
        // swift_tryRetain, declared in C for the overlay's unowned links (UnownedLink):
        // header only, kept out of the C core, whose tests link without the Swift runtime.
        .systemLibrary(
            name: "CSwiftRuntime"
        ),
        .target(
            name: "Promise",
            dependencies: ["CPromiseCore", "CSwiftRuntime"]
        ),
        // Without the trait this module holds only markers that say how to enable it.
        .target(
            name: "PromiseNIO",
            dependencies: [
                "Promise",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
            ]
        ),
        .testTarget(
            name: "PromiseTests",
            dependencies: ["Promise", "CPromiseCore"]
        ),
        // Hammering: concurrent registration, settling and cancellation; bounded by
        // PROMISE_STRESS_ITERATIONS / PROMISE_STRESS_SECONDS (see README).
        .testTarget(
            name: "PromiseStressTests",
            dependencies: ["Promise", "CPromiseCore"]
        ),
        // Runs with the trait on (`make test`); empty without it.
        .testTarget(
            name: "PromiseNIOTests",
            dependencies: [
                "Promise",
                "PromiseNIO",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
