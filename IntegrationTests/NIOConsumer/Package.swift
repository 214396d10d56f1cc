// swift-tools-version:6.2
//
// A server-side package that uses PromiseNIO exactly as an outside user would: it enables
// the Promise package's SwiftNIO trait and names the PromiseNIO product. By path to this
// repository here; `make integration` also builds a copy that names the repository by a
// git URL (a user would write the URL and a version). Built with warnings as errors.
//   nio-consumer   event loops as contexts, the conversions both ways, hop(to:) and a
//                  cancelled scheduled task; exits non-zero on a failure
import PackageDescription

let package = Package(
    name: "PromiseNIOConsumer",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    dependencies: [
        .package(name: "Promise", path: "../..", traits: ["SwiftNIO"]),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
    ],
    targets: [
        .executableTarget(
            name: "nio-consumer",
            dependencies: [
                .product(name: "Promise", package: "Promise"),
                .product(name: "PromiseNIO", package: "Promise"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
