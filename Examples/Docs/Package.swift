// swift-tools-version:6.0
//
// A docs-only package: it exists so that `make docs` can run the swift-docc-plugin on the
// Promise module while the library's own Package.swift stays free of dependencies.
//
// `Sources` is a symbolic link to the library's Sources/, and the targets below repeat
// the library's (keep them in step with ../../Package.swift). Nothing depends on this
// package; it builds only the module it documents.
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
    ],
    dependencies: [
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", exact: "1.5.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CAtomicOps",
            pkgConfig: "atomic_ops",
            providers: [.apt(["libatomic-ops-dev"]), .brew(["libatomic_ops"])]
        ),
        .target(name: "CPromiseCore", dependencies: ["CAtomicOps"]),
        .systemLibrary(name: "CSwiftRuntime"),
        .target(name: "Promise", dependencies: ["CPromiseCore", "CSwiftRuntime"]),
    ],
    swiftLanguageModes: [.v6]
)
