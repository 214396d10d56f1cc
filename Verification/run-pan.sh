#!/usr/bin/env bash
# run-pan.sh: one spin verification run of Verification/core.pml (driven by mk/verify.mk).
#
#   run-pan.sh MODE NAME OUTDIR MODEL 'SPIN_DEFINES' 'PAN_CFLAGS' 'PAN_FLAGS'
#
#   MODE pass  the search must be exhaustive and find no error
#   MODE fail  a deliberately broken model: the search must find an error and leave a
#              trail, a few lines of which are replayed with `spin -t -p`
#
# Everything is written under OUTDIR/NAME (the model is copied there, so pan.c and the
# trail never land in the source tree). Environment: SPIN (spin), CC (cc).
set -euo pipefail

if [ $# -ne 7 ]; then
    echo "usage: $0 pass|fail NAME OUTDIR MODEL 'SPIN_DEFINES' 'PAN_CFLAGS' 'PAN_FLAGS'" >&2
    exit 2
fi
mode=$1 name=$2 outdir=$3 model=$4 defines=$5 cflags=$6 panflags=$7
SPIN=${SPIN:-spin}
CC=${CC:-cc}

dir=$outdir/$name
rm -rf "$dir"
mkdir -p "$dir"
cp "$model" "$dir/core.pml"
cd "$dir"

echo "==> $name: spin ${defines:+$defines }-a; $CC $cflags; ./pan $panflags"
# shellcheck disable=SC2086 # the flag strings are word lists on purpose
if ! $SPIN $defines -a core.pml >spin.out 2>&1; then
    cat spin.out
    echo "FAIL $name: spin could not generate the verifier" >&2
    exit 1
fi
# shellcheck disable=SC2086
if ! $CC $cflags -o pan pan.c >cc.out 2>&1; then
    cat cc.out
    echo "FAIL $name: pan.c did not compile" >&2
    exit 1
fi
status=0
# shellcheck disable=SC2086
./pan $panflags >pan.out 2>&1 || status=$?

# What was checked, and how big the search was.
sed -n '/^Full statespace search for:/,/^$/p' pan.out | sed '/^$/d; s/^/    /'
grep -E '^State-vector|states, stored|transitions \(= stored|total actual memory|^pan: elapsed time' pan.out |
    sed 's/^[[:space:]]*/    /'

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.out | tail -n 1)
incomplete=$(grep -E 'Search not completed|max search depth too small|reached -DMEMLIM bound|out of memory|hash table is full|too many processes' pan.out || true)

if [ -z "$errors" ]; then
    tail -n 30 pan.out
    echo "FAIL $name: pan printed no result (exit status $status)" >&2
    exit 1
fi

if [ "$mode" = pass ]; then
    if [ "$errors" -ne 0 ]; then
        grep -m 10 -E '^pan:|assertion violated|acceptance cycle|non-progress|invalid end state' pan.out || true
        echo "FAIL $name: $errors error(s); trail: $dir/core.pml.trail" >&2
        echo "     replay: (cd $dir && $SPIN $defines -t -p core.pml)" >&2
        exit 1
    fi
    if [ -n "$incomplete" ]; then
        echo "$incomplete"
        echo "FAIL $name: the search was not exhaustive" >&2
        exit 1
    fi
    echo "    ok: exhaustive, errors: 0"
    exit 0
fi

# mode fail: the broken model must be caught, with a counterexample.
if [ "$errors" -eq 0 ] || [ ! -f core.pml.trail ]; then
    [ -n "$incomplete" ] && echo "$incomplete"
    echo "FAIL $name: the broken model was NOT caught (errors: $errors, no trail)" >&2
    exit 1
fi
# with -i pan reports each shorter counterexample it finds: the trail is the last one
grep -E '^pan:[0-9]+:' pan.out | tail -n 1 | sed 's/^/    /' || true
echo "    counterexample: spin -t -p, the model's printf lines (full trail: $dir/trail.txt)"
# shellcheck disable=SC2086
$SPIN $defines -t -p core.pml >trail.txt 2>&1 || true
grep -m 40 -E '^Starting|^ +[0-9]+: (pc_|node|cancel|child)|START OF CYCLE|Error|text of failed|trail ends' trail.txt |
    sed 's/^ */      /' || true
echo "    ok: fails as expected, with a counterexample (errors: $errors)"
