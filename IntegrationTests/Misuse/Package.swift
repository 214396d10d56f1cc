// swift-tools-version:6.0
//
// Code that must not compile: each target misuses Promise in a way the compiler is meant
// to reject, and `make integration` (check-misuse.sh) fails if one of them builds, or fails
// for another reason than the one expected.
//
//   wait-in-async  `wait()` from async code: it would block a thread of Swift
//                  concurrency's pool, so it is `noasync` (as SwiftNIO's `wait()`)
//   void-then-several-statements, void-recover-several-statements,
//   recover-returning-nothing, non-awaiting-closure-untyped
//                  closures Swift reads otherwise than they say (the rules' list of
//                  them: a change of compiler that accepts one shows here)
import PackageDescription

let promise: Target.Dependency = .product(name: "Promise", package: "Promise")

let package = Package(
    name: "PromiseMisuse",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    dependencies: [
        .package(name: "Promise", path: "../.."),
    ],
    targets: [
        "wait-in-async",
        "void-then-several-statements",
        "void-recover-several-statements",
        "recover-returning-nothing",
        "non-awaiting-closure-untyped",
    ].map { .executableTarget(name: $0, dependencies: [promise]) },
    swiftLanguageModes: [.v6]
)
