#!/usr/bin/env bash
# The server way: Promise with no package trait, in a statically linked release binary.
#
#   1. builds ServerConsumer/ (-c release --static-swift-stdlib): server-consumer (Promise,
#      `traits: []`) and dispatch-only (the same shape of work without Promise), runs both
#   2. fails if server-consumer links any module of Foundation's family (Foundation,
#      FoundationEssentials, FoundationInternationalization, FoundationNetworking)
#   3. prints both sizes, and fails if server-consumer outgrows dispatch-only by more than
#      SERVER_SIZE_LIMIT_KB (default 2048: measured 965 KB on Linux x86_64, Swift 6.3.1)
#   4. for comparison, the same consumer with the default trait Foundation on (printed,
#      not gated), and Promise with the trait FoundationEssentials alone (must build and
#      give PromiseError its LocalizedError conformance)
#
# Environment: SWIFT (default swift), SWIFT_WARN (compiler flags), BUILD_DIR (default
# .build), SERVER_SIZE_LIMIT_KB.
set -euo pipefail
cd "$(dirname "$0")/.."
swift=${SWIFT:-swift}
build_dir=${BUILD_DIR:-.build}
limit_kb=${SERVER_SIZE_LIMIT_KB:-2048}
read -r -a flags <<< "${SWIFT_WARN:-}"
with_flags() { "$@" ${flags[@]+"${flags[@]}"}; }
nm=$(command -v nm || command -v llvm-nm || true)
[ -n "$nm" ] || { echo "FAIL: neither nm nor llvm-nm is installed" >&2; exit 1; }
size_kb() { echo $(( $(wc -c < "$1") / 1024 )); }

static_build() {  # package path; prints the bin folder
    with_flags "$swift" build --package-path "$1" -c release --static-swift-stdlib >&2
    with_flags "$swift" build --package-path "$1" -c release --static-swift-stdlib --show-bin-path
}

package=IntegrationTests/ServerConsumer
echo "==> $package: Promise with no trait, linked statically (release)"
bin=$(static_build "$package")
"$bin/server-consumer"
"$bin/dispatch-only"

# Swift symbols of a module named M start with $s<length of M>M (the mangling's module
# prefix); `$s10Foundation` alone would also match FoundationEssentials' longer names, so
# each is matched with what follows it.
linked=$("$nm" "$bin/server-consumer" | grep -cE '\$s(10Foundation[0-9A-Z_]|20FoundationEssentials|31FoundationInternationalization|20FoundationNetworking)' || true)
if [ "$linked" != 0 ]; then
    echo "FAIL: server-consumer links $linked symbols of Foundation's modules; built with no trait, Promise must import none" >&2
    exit 1
fi
echo "    ok: no symbol of Foundation, FoundationEssentials, FoundationInternationalization or FoundationNetworking"

server_kb=$(size_kb "$bin/server-consumer")
dispatch_kb=$(size_kb "$bin/dispatch-only")
growth_kb=$((server_kb - dispatch_kb))
echo "    server-consumer ${server_kb} KB, dispatch-only ${dispatch_kb} KB: Promise adds ${growth_kb} KB (limit ${limit_kb} KB)"
if [ "$growth_kb" -gt "$limit_kb" ]; then
    echo "FAIL: Promise adds ${growth_kb} KB to a static binary, more than the ${limit_kb} KB limit" >&2
    exit 1
fi

# The same consumer with the default trait: what turning it off saves.
with_default="$build_dir/server-consumer-default-trait"
rm -rf "$with_default" && mkdir -p "$with_default"
(cd "$package" && tar --exclude=.build --exclude=Package.resolved -cf - .) | tar -xf - -C "$with_default"
sed -i.bak 's|path: "\.\./\.\.", traits: \[\])|path: "'"$(pwd)"'")|' "$with_default/Package.swift"
rm -f "$with_default/Package.swift.bak"
grep -q 'path: "'"$(pwd)"'")' "$with_default/Package.swift" || { echo "FAIL: could not turn the default trait on in $with_default" >&2; exit 1; }
echo "==> the same with the default trait Foundation on (for comparison, not gated)"
bin_default=$(static_build "$with_default")
"$bin_default/server-consumer" >/dev/null
default_kb=$(size_kb "$bin_default/server-consumer")
echo "    server-consumer with the trait Foundation: ${default_kb} KB; without: ${server_kb} KB (saves $((default_kb - server_kb)) KB)"

echo "==> Promise with the trait FoundationEssentials alone"
essentials="$build_dir/trait-foundation-essentials"
with_flags "$swift" build --target Promise --traits FoundationEssentials --scratch-path "$essentials"
objects=$(find "$essentials" -path '*Promise.build/PromiseError.swift.o' | head -n 1)
[ -n "$objects" ] || { echo "FAIL: no PromiseError.swift.o under $essentials" >&2; exit 1; }
# The conformance descriptor of PromiseError to FoundationEssentials' LocalizedError.
symbols=$("$nm" "$objects")  # not piped into grep -q: pipefail would see nm's SIGPIPE
if ! grep -qE '\$s7Promise0A5ErrorO20FoundationEssentials09Localized[A-Z]0AAMc$' <<< "$symbols"; then
    echo "FAIL: with the trait FoundationEssentials, PromiseError does not conform to its LocalizedError" >&2
    grep -i localized <<< "$symbols" >&2 || true
    exit 1
fi
echo "    ok: PromiseError conforms to FoundationEssentials' LocalizedError"
