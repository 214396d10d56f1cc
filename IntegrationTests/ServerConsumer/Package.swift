// swift-tools-version:6.2
//
// A server that links statically (`swift build -c release --static-swift-stdlib`) and
// depends on Promise with no package trait, which drops the default one (Foundation):
//
//   server-consumer  a few promises, `then`, `all`, `race`, `await`; exits non-zero on a
//                    wrong answer
//   dispatch-only    the same shape of work on Dispatch alone: the size to compare with
//
// `make integration` builds both the same way, checks that server-consumer links no
// module of Foundation's family, and fails if it outgrows dispatch-only by more than the
// limit in check-server-size.sh. (Tools 6.2: a dependency's traits.)
import PackageDescription

let package = Package(
    name: "PromiseServerConsumer",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    dependencies: [
        .package(name: "Promise", path: "../..", traits: []),
    ],
    targets: [
        .executableTarget(
            name: "server-consumer",
            dependencies: [.product(name: "Promise", package: "Promise")]
        ),
        .executableTarget(name: "dispatch-only"),
    ],
    swiftLanguageModes: [.v6]
)
