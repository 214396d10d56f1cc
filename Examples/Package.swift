// swift-tools-version:6.0
// Small programs a newcomer reads first. A package of its own, so the library's own
// Package.swift stays free of dependencies.
import PackageDescription

let package = Package(
    name: "PromiseExamples",
    dependencies: [
        .package(name: "Promise", path: ".."),
    ],
    targets: [
        .executableTarget(
            name: "demo",
            dependencies: [.product(name: "Promise", package: "Promise")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
