// swift-tools-version:6.2
// Small programs a newcomer reads first. A package of its own, so that the library's own
// Package.swift names only what its products need (SwiftNIO behind a trait, for PromiseNIO).
//
//   demo        the guided tour (`make demo`): Promise alone, no NIO
//   server      an HTTP server on SwiftNIO whose handler fans out to promise-returning
//               lookups (`make server-load` loads it with wrk), through the library's
//               PromiseNIO product (the package trait SwiftNIO turns it on); with
//               --engine nio, the same handler on NIO futures only (`make server-compare`)
//   serverTests the two engines answer every request alike; the server's options, a
//               connection's pipeline (on an EmbeddedChannel) and its stop (`make examples-test`)
//
// The documentation of Promise and PromiseNIO is built by the docs-only package in Docs/
// (`make docs`), which holds the swift-docc-plugin dependency.
import PackageDescription

let package = Package(
    name: "PromiseExamples",
    // `Duration` (timeouts) on Apple platforms; NIO's own minimums are lower.
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    dependencies: [
        .package(name: "Promise", path: "..", traits: ["SwiftNIO"]),
        .package(url: "https://github.com/apple/swift-nio", "2.101.0"..<"2.102.0"),
    ],
    targets: [
        .executableTarget(
            name: "demo",
            dependencies: [.product(name: "Promise", package: "Promise")]
        ),
        .executableTarget(
            name: "server",
            dependencies: [
                .product(name: "Promise", package: "Promise"),
                .product(name: "PromiseNIO", package: "Promise"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "serverTests",
            dependencies: [
                "server",
                .product(name: "Promise", package: "Promise"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
