// swift-tools-version:6.0
//
// A package that uses Promise exactly as an outside user would: through the library
// product, by path to this repository (a user would name the URL and a version). It is
// built with warnings as errors by `make integration`:
//   consumer         Swift 6 language mode, the API end to end; exits non-zero on a failure
//   consumer-swift5  the same API from Swift 5 language mode (warning-free there too)
//   ConsumerTests    XCTest, a consumer's own tests
import PackageDescription

let package = Package(
    name: "PromiseConsumer",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],  // Duration, Task.sleep(for:)
    dependencies: [
        .package(name: "Promise", path: "../.."),
    ],
    targets: [
        .executableTarget(
            name: "consumer",
            dependencies: [.product(name: "Promise", package: "Promise")]
        ),
        .executableTarget(
            name: "consumer-swift5",
            dependencies: [.product(name: "Promise", package: "Promise")],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .testTarget(
            name: "ConsumerTests",
            dependencies: [.product(name: "Promise", package: "Promise")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
