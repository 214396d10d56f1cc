#!/usr/bin/env bash
# Builds and runs the two outside packages of IntegrationTests/ the way a user's package
# would see this repository, and checks what each one fetched.
#
#   check-consumers.sh path   as committed: both name the repository by path ("../..")
#   check-consumers.sh git    copies of both that name it by a git URL and a version: a
#                             bare clone of the committed HEAD, tagged 1.0.0, in
#                             $BUILD_DIR/integration-git (uncommitted changes are not in it)
#
# Consumer       depends on Promise alone: it must build and pass with no SwiftNIO checked
#                out, pinned or built (SwiftNIO sits behind the SwiftNIO package trait)
# NIOConsumer    enables that trait and uses PromiseNIO
#
# Environment: SWIFT (default swift), SWIFT_WARN (compiler flags, e.g. warnings as
# errors), BUILD_DIR (default .build).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: check-consumers.sh path|git}
swift=${SWIFT:-swift}
build_dir=${BUILD_DIR:-.build}
read -r -a flags <<< "${SWIFT_WARN:-}"

# Fails if SwiftNIO was fetched, pinned or built for the package at $1.
no_nio() {
    local pkg=$1 found
    found=$( { ls -d "$pkg"/.build/checkouts/swift-nio* 2>/dev/null || true
               grep -l 'swift-nio' "$pkg"/Package.resolved 2>/dev/null || true
               find "$pkg"/.build \( -name 'NIOCore.build' -o -name 'NIOCore.swiftmodule' \) 2>/dev/null || true; } )
    if [ -n "$found" ]; then
        echo "FAIL: $pkg depends on Promise alone, yet SwiftNIO was fetched or built:" >&2
        echo "$found" >&2
        exit 1
    fi
    echo "    ok: no SwiftNIO checkout, pin or module in $pkg/.build"
}

case $mode in
path)
    consumer=IntegrationTests/Consumer
    nio_consumer=IntegrationTests/NIOConsumer
    ;;
git)
    root=$(pwd)
    work="$root/$build_dir/integration-git"
    rm -rf "$work" && mkdir -p "$work"
    git clone -q --bare "$root" "$work/Promise.git"
    git -C "$work/Promise.git" tag -f 1.0.0 HEAD >/dev/null
    echo "    git URL: file://$work/Promise.git at 1.0.0 = $(git -C "$work/Promise.git" rev-parse --short HEAD) (the committed HEAD)"
    for name in Consumer NIOConsumer; do
        mkdir -p "$work/$name"
        (cd "IntegrationTests/$name" && tar --exclude=.build --exclude=Package.resolved -cf - .) | tar -xf - -C "$work/$name"
        sed -i "s|\.package(name: \"Promise\", path: \"\.\./\.\.\"|.package(url: \"file://$work/Promise.git\", from: \"1.0.0\"|" "$work/$name/Package.swift"
        grep -q "file://$work/Promise.git" "$work/$name/Package.swift" || { echo "FAIL: could not point $name at the git URL" >&2; exit 1; }
    done
    consumer="$work/Consumer"
    nio_consumer="$work/NIOConsumer"
    ;;
*)
    echo "usage: check-consumers.sh path|git" >&2; exit 2 ;;
esac

echo "==> $consumer: Promise alone ($mode)"
"$swift" build --package-path "$consumer" --build-tests "${flags[@]}"
"$swift" test --package-path "$consumer" --skip-build --disable-swift-testing "${flags[@]}"
bin=$("$swift" build --package-path "$consumer" --show-bin-path "${flags[@]}")
"$bin/consumer-swift5" >/dev/null && echo "    ok: consumer-swift5"
"$bin/consumer"
no_nio "$consumer"

echo "==> $nio_consumer: PromiseNIO with the SwiftNIO trait ($mode)"
"$swift" build --package-path "$nio_consumer" "${flags[@]}"
bin=$("$swift" build --package-path "$nio_consumer" --show-bin-path "${flags[@]}")
"$bin/nio-consumer"
