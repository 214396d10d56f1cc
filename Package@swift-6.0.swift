// swift-tools-version:6.0
//
// The manifest Swift 6.0 and 6.1 read (6.2 and later read Package.swift, whose tools
// version is too new for them). It offers the Promise product alone, which depends on
// nothing but the toolchain and the system library libatomic_ops (Debian:
// libatomic-ops-dev; Homebrew: libatomic_ops).
//
// PromiseNIO is not here: it sits behind a package trait, and only SwiftPM 6.2 and later
// leave a dependency behind a trait that is off unfetched. Naming SwiftNIO here would make
// SwiftPM fetch it for every consumer of Promise, so users of SwiftNIO on Swift 6.0 or 6.1
// convert with the few lines of Sources/PromiseNIO in their own code, or move to 6.2.
//
// A manifest cannot share code with another, so the targets below repeat Package.swift's
// (all of them but PromiseNIO and its tests): keep the two in step.
import PackageDescription

let package = Package(
    name: "Promise",
    // `Duration` (timeouts, delays) needs these; Linux has no minimum.
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    products: [
        .library(name: "Promise", targets: ["Promise"]),
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
        // This manifest declares no traits: the Foundation trait (OperationQueue as a
        // context, LocalizedError) is always on here, as it is by default in Package.swift.
        .target(
            name: "Promise",
            dependencies: ["CPromiseCore", "CSwiftRuntime"],
            swiftSettings: [.define("Foundation")]
        ),
        .testTarget(
            name: "PromiseTests",
            dependencies: ["Promise", "CPromiseCore"],
            swiftSettings: [.define("Foundation")]
        ),
        // Hammering: concurrent registration, settling and cancellation; bounded by
        // PROMISE_STRESS_ITERATIONS / PROMISE_STRESS_SECONDS (see README).
        .testTarget(
            name: "PromiseStressTests",
            dependencies: ["Promise", "CPromiseCore"],
            swiftSettings: [.define("Foundation")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
