// swift-tools-version:6.0
//
// The manifest Swift 6.0 reads (6.1 and later read Package.swift). It offers the Promise
// product alone, which depends on nothing but the toolchain and the system library
// libatomic_ops (Debian: libatomic-ops-dev; Homebrew: libatomic_ops).
//
// PromiseNIO is not here: it sits behind a package trait, and traits need tools 6.1.
// Naming SwiftNIO in this manifest without one would make SwiftPM fetch it for every
// consumer of Promise, so Swift 6.0 users of SwiftNIO convert with the few lines of
// Sources/PromiseNIO in their own code, or move to Swift 6.1.
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
        .target(
            name: "Promise",
            dependencies: ["CPromiseCore", "CSwiftRuntime"]
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
    ],
    swiftLanguageModes: [.v6]
)
