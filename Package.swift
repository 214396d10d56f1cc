// swift-tools-version:6.2
//
// Two library products:
//
//   Promise      the promise library. Depends on nothing but the toolchain and the system
//                library libatomic_ops (Debian: libatomic-ops-dev; Homebrew: libatomic_ops).
//   PromiseNIO   SwiftNIO integration: EventLoop as an ExecutionContext, Promise <->
//                EventLoopFuture. Behind the package trait `SwiftNIO`, off by default.
//
// Promise imports nothing of Foundation's family unless a trait asks for it:
//
//   Foundation            on by default: OperationQueue as an ExecutionContext, and
//                         PromiseError's LocalizedError conformance
//   FoundationEssentials  LocalizedError alone, from FoundationEssentials, for a server
//                         that links FoundationEssentials anyway
//
// A statically linked server lists the traits it wants, which drops the defaults
// (`traits: []`, or `traits: ["SwiftNIO"]`): its binary then links no Foundation (about
// 57 MB less) and no FoundationEssentials (about 11 MB less); make integration measures
// it (IntegrationTests/ServerConsumer).
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
        .default(enabledTraits: ["Foundation"]),
        .trait(
            name: "Foundation",
            description: "OperationQueue as an ExecutionContext, and LocalizedError for Promise's errors. Imports Foundation; on by default."
        ),
        .trait(
            name: "FoundationEssentials",
            description: "LocalizedError for Promise's errors from FoundationEssentials, without Foundation: for servers that link FoundationEssentials anyway."
        ),
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
