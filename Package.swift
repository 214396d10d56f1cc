// swift-tools-version:6.0
//
// The library product depends on nothing but the toolchain and the system library
// libatomic_ops (Debian: libatomic-ops-dev; Homebrew: libatomic_ops).
import PackageDescription

let package = Package(
    name: "Promise",
    products: [
        .library(name: "Promise", targets: ["Promise"]),
    ],
    targets: [
        .target(
            name: "CPromiseCore",
            linkerSettings: [.linkedLibrary("atomic_ops")]
        ),
        .target(
            name: "Promise",
            dependencies: ["CPromiseCore"]
        ),
        .testTarget(
            name: "PromiseTests",
            dependencies: ["Promise", "CPromiseCore"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
