#!/usr/bin/env bash
# Builds and runs the two outside packages of IntegrationTests/ the way a user's package
# would see this repository, and checks what each one fetched.
#
#   check-consumers.sh path   as committed: both name the repository by path ("../..");
#                             then PromiseNIO itself with its trait off (the markers of
#                             TraitOff.swift), which must build without SwiftNIO
#   check-consumers.sh git    copies of both that name it by a git URL and a version: a
#                             bare clone of the committed HEAD, tagged 1.0.0 (asked for
#                             exactly), in $BUILD_DIR/integration-git (uncommitted changes
#                             are not in it)
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
# "${flags[@]}" of an empty array is an error under `set -u` in bash 3.2 (macOS).
with_flags() { "$@" ${flags[@]+"${flags[@]}"}; }

# Fails if SwiftNIO was fetched or built into the build folder $1, or pinned in the
# Package.resolved $2 (if given).
no_nio() {
    local build=$1 resolved=${2:-} found
    found=$( { ls -d "$build"/checkouts/swift-nio* 2>/dev/null || true
               [ -z "$resolved" ] || grep -l 'swift-nio' "$resolved" 2>/dev/null || true
               find "$build" \( -name 'NIOCore.build' -o -name 'NIOCore.swiftmodule' \) 2>/dev/null || true; } )
    if [ -n "$found" ]; then
        echo "FAIL: $build builds no SwiftNIO code, yet SwiftNIO was fetched or built for it:" >&2
        echo "$found" >&2
        exit 1
    fi
    echo "    ok: no SwiftNIO checkout, pin or module in $build"
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
        # exact: a clone of a repository that has real 1.x tags would otherwise resolve
        # to the newest of them. (-i.bak: BSD and GNU sed both take it.)
        sed -i.bak "s|\.package(name: \"Promise\", path: \"\.\./\.\.\"|.package(url: \"file://$work/Promise.git\", exact: \"1.0.0\"|" "$work/$name/Package.swift"
        rm -f "$work/$name/Package.swift.bak"
        grep -q "file://$work/Promise.git" "$work/$name/Package.swift" || { echo "FAIL: could not point $name at the git URL" >&2; exit 1; }
    done
    consumer="$work/Consumer"
    nio_consumer="$work/NIOConsumer"
    ;;
*)
    echo "usage: check-consumers.sh path|git" >&2; exit 2 ;;
esac

echo "==> $consumer: Promise alone ($mode)"
with_flags "$swift" build --package-path "$consumer" --build-tests
with_flags "$swift" test --package-path "$consumer" --skip-build --disable-swift-testing
bin=$(with_flags "$swift" build --package-path "$consumer" --show-bin-path)
"$bin/consumer-swift5" >/dev/null
echo "    ok: consumer-swift5"
"$bin/consumer"
no_nio "$consumer/.build" "$consumer/Package.resolved"

echo "==> $nio_consumer: PromiseNIO with the SwiftNIO trait ($mode)"
# Both modes build in the path copy's folder: the git copy resolves and builds Promise
# from its URL, and finds SwiftNIO, which is the same in both, already built (a
# minute less on two cores).
nio_build=IntegrationTests/NIOConsumer/.build
with_flags "$swift" build --package-path "$nio_consumer" --scratch-path "$nio_build"
bin=$(with_flags "$swift" build --package-path "$nio_consumer" --scratch-path "$nio_build" --show-bin-path)
"$bin/nio-consumer"

if [ "$mode" = path ]; then
    # What a package that names PromiseNIO but forgets the trait compiles: the markers.
    # This is the root package, which checks out whatever its Package.resolved pins (the
    # trait builds pinned SwiftNIO), so only the modules are checked here; what a consumer
    # fetches is checked above.
    echo "==> PromiseNIO with its trait off: builds without SwiftNIO"
    with_flags "$swift" build --target PromiseNIO --scratch-path "$build_dir/no-trait"
    built=$(find "$build_dir/no-trait" \( -name 'NIOCore.build' -o -name 'NIOCore.swiftmodule' \) 2>/dev/null || true)
    if [ -n "$built" ]; then
        echo "FAIL: PromiseNIO with its trait off built SwiftNIO:" >&2
        echo "$built" >&2
        exit 1
    fi
    echo "    ok: PromiseNIO's markers built, no SwiftNIO module"
fi
