// swift-tools-version:6.0
//
// A docs-only package: it exists so that `make docs` can run the swift-docc-plugin on the
// Promise and PromiseNIO modules while the library's own Package.swift stays free of it.
//
// `Sources` is a symbolic link to the library's Sources/, and the targets below repeat
// the library's (keep them in step with ../../Package.swift). PromiseNIO is built as the
// library builds it with its SwiftNIO trait on, and Promise with its default trait
// Foundation on: the `SwiftNIO` and `Foundation` conditions are defined here. Nothing
// depends on this package; it builds only the modules it documents.
//
//   swift package --package-path Examples/Docs \
//       --allow-writing-to-directory OUT generate-documentation --target Promise \
//       --output-path OUT --warnings-as-errors
import PackageDescription

let package = Package(
    name: "PromiseDocs",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    products: [
        .library(name: "Promise", targets: ["Promise"]),
        .library(name: "PromiseNIO", targets: ["PromiseNIO"]),
    ],
    dependencies: [
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", exact: "1.5.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CAtomicOps",
            pkgConfig: "atomic_ops",
            providers: [.apt(["libatomic-ops-dev"]), .brew(["libatomic_ops"])]
        ),
        .target(name: "CPromiseCore", dependencies: ["CAtomicOps"]),
        .systemLibrary(name: "CSwiftRuntime"),
        .target(
            name: "Promise",
            dependencies: ["CPromiseCore", "CSwiftRuntime"],
            swiftSettings: [.define("Foundation")]
        ),
        .target(
            name: "PromiseNIO",
            dependencies: ["Promise", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: [.define("SwiftNIO")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
