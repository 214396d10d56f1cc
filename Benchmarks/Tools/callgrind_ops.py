#!/usr/bin/env python3
"""Instruction counts per operation under callgrind: stable where wall clock is not.

    callgrind_ops.py PROFILE_BINARY CASE [ROUNDS_LOW ROUNDS_HIGH] [--top N]
    callgrind_ops.py PROFILE_BINARY --table [REGEX]

Runs `valgrind --tool=callgrind PROFILE_BINARY CASE ROUNDS` twice and subtracts, so start-up
and one-time costs (symbol binding, metadata instantiation) drop out.

With a CASE ("settle-one/promise"): instructions per operation, the functions with the most
exclusive instructions per operation, and calls per operation of the runtime entry points
that usually explain them (retain/release, allocation, metadata lookups, weak references,
task switches, the C core). With --table: instructions per operation of every case (or of
those whose "<case>/<impl>" matches REGEX), ours against each baseline, as a markdown table.

Instructions are not time: an atomic read-modify-write, a cache miss or a thread hop costs
far more than one instruction, and valgrind runs threads one at a time, so the contended
and cross-thread cases say little here. For single-threaded paths it is the number to
compare across runs on a loaded machine.
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict

WATCH = [
    "swift_retain", "swift_release", "swift_retain_n", "swift_release_n", "swift_bridgeObjectRetain",
    "swift_allocObject", "swift_deallocObject", "malloc", "free", "swift_slowAlloc",
    "swift_getGenericMetadata", "swift_getFunctionTypeMetadata", "__swift_instantiateConcreteTypeFromMangledName",
    "swift_getTypeByMangledNameInContext", "swift_dynamicCast", "swift_conformsToProtocol",
    "swift_weakInit", "swift_weakAssign", "swift_weakLoadStrong", "swift_weakDestroy",
    "swift_isUniquelyReferenced_nonNull_native", "swift_beginAccess",
    "swift_task_alloc", "swift_task_dealloc", "swift_continuation_init", "swift_continuation_resume",
    "swift_continuation_await", "swift_task_switch", "swift_job_run",
    "pc_observe", "pc_publish", "pc_defer", "pc_claim", "pc_state", "pc_children_push", "pc_family_set",
    "dispatch_async", "dispatch_async_f", "_dispatch_continuation_init", "dispatch_block_create_with_qos_class",
    "_dispatch_block_create", "pthread_mutex_lock",
]


def parse(path):
    """(exclusive Ir per function, calls per function, total Ir)."""
    names = {}
    exclusive = defaultdict(int)
    calls = defaultdict(int)
    total = 0
    fn = None
    pending_call = None

    def name_of(token):
        match = re.match(r"\((\d+)\)(?: (.*))?", token)
        if not match:
            return token
        if match.group(2) is not None:
            names[match.group(1)] = match.group(2)
        return names.get(match.group(1), token)

    with open(path, errors="replace") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("fn="):
                fn = name_of(line[3:])
                continue
            if line.startswith("cfn="):
                cfn = name_of(line[4:])
                continue
            if line.startswith(("cfi=", "cfl=", "fi=", "fe=", "fl=", "ob=", "cob=")):
                if line.startswith(("fi=", "fe=", "fl=")):
                    pass
                continue
            if line.startswith("calls="):
                pending_call = int(line[6:].split()[0])
                calls[cfn] += pending_call
                continue
            if line.startswith("summary:"):
                total = int(line.split()[1])
                continue
            if line[0].isdigit() or line[0] in "+-*":
                parts = line.split()
                if len(parts) >= 2 and pending_call is None and fn is not None:
                    try:
                        exclusive[fn] += int(parts[1])
                    except ValueError:
                        pass
                pending_call = None
    return exclusive, calls, total


def run(binary, case, rounds, out, prepare_only=False):
    command = [binary, case, str(rounds)] + (["--prepare-only"] if prepare_only else [])
    subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out] + command,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return parse(out)


def cases(binary):
    """[(id, ops per round, prepared)] from `PROFILE_BINARY list`."""
    listing = subprocess.run([binary, "list"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        fields = line.split("\t")
        found.append((fields[0], int(fields[1].split()[0]), len(fields) > 2 and fields[2] == "prepared"))
    return found


def measured(binary, case, low, high, prepared, tmp):
    """Per-function exclusive instructions, calls and total of rounds high - low. For a prepared
    case, the same for its inputs alone is subtracted (package-benchmark does not measure it)."""
    ex_lo, calls_lo, total_lo = run(binary, case, low, os.path.join(tmp, "lo"))
    ex_hi, calls_hi, total_hi = run(binary, case, high, os.path.join(tmp, "hi"))
    ex = subtract(ex_hi, ex_lo)
    calls = subtract(calls_hi, calls_lo)
    total = total_hi - total_lo
    if prepared:
        pex_lo, pcalls_lo, ptotal_lo = run(binary, case, low, os.path.join(tmp, "plo"), True)
        pex_hi, pcalls_hi, ptotal_hi = run(binary, case, high, os.path.join(tmp, "phi"), True)
        ex = subtract(ex, subtract(pex_hi, pex_lo))
        calls = subtract(calls, subtract(pcalls_hi, pcalls_lo))
        total -= ptotal_hi - ptotal_lo
    return ex, calls, total


def subtract(a, b):
    return {key: a.get(key, 0) - b.get(key, 0) for key in set(a) | set(b)}


def short(name, width=110):
    name = re.sub(r"\s*\[.*\]$", "", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def per_op(binary, case, ops, prepared, low=1, high=3):
    """(instructions per operation, mallocs per operation) of one case."""
    with tempfile.TemporaryDirectory() as tmp:
        _, calls, total = measured(binary, case, low, high, prepared, tmp)
    n = (high - low) * ops
    mallocs = sum(count for name, count in calls.items() if base_name(name) in ("malloc", "calloc", "realloc"))
    return total / n, mallocs / n


def base_name(name):
    return re.sub(r"\s*\[.*\]$", "", name).split(":")[-1].split("'")[0]


def table(binary, pattern):
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import bench  # the case order, baselines and targets of the wall-clock table

    results = {}
    for ident, ops, prepared in cases(binary):
        if pattern and not re.fullmatch(pattern, ident):
            continue
        case, _, impl = ident.partition("/")
        instructions, mallocs = per_op(binary, ident, ops, prepared)
        results.setdefault(case, {})[impl] = {"ir": instructions, "mallocs": mallocs}
        print("  %-40s %9.0f instructions/op" % (ident, instructions), file=sys.stderr)
        mallocs = max(0.0, mallocs)
    print("| case | ours (promise) | baseline | baseline | ours/baseline | mallocs/op ours | baseline |")
    print("|---|---:|---|---:|---:|---:|---:|")
    order = ["nio", "nio-off-loop", "lock", "continuation", "queue.async"]
    for case in bench.case_order(results):
        impls = results[case]
        ours = impls.get(bench.OURS)
        baselines = sorted((i for i in impls if i != bench.OURS),
                           key=lambda i: order.index(i) if i in order else len(order))
        for index, impl in enumerate(baselines or [None]):
            base = impls.get(impl) if impl else None
            cells = [case if index == 0 else "",
                     ("%.0f" % ours["ir"]) if ours and index == 0 else "",
                     impl or "-", ("%.0f" % base["ir"]) if base else "-",
                     ("%.2f" % (ours["ir"] / base["ir"])) if ours and base else "-",
                     ("%.2f" % ours["mallocs"]) if ours and index == 0 else "",
                     ("%.2f" % base["mallocs"]) if base else "-"]
            print("| " + " | ".join(cells) + " |")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[2] == "--table":
        return table(argv[1], argv[3] if len(argv) > 3 else "")
    args = [a for a in argv[1:] if not a.startswith("--")]
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 25
    if "--top" in argv:
        args.remove(str(top))
    if len(args) < 2:
        print(__doc__)
        return 2
    binary, case = args[0], args[1]
    low, high = (int(args[2]), int(args[3])) if len(args) >= 4 else (2, 6)
    ops, prepared = next((o, p) for ident, o, p in cases(binary) if ident == case)
    with tempfile.TemporaryDirectory() as tmp:
        exclusive, calls, total = measured(binary, case, low, high, prepared, tmp)
    n = (high - low) * ops
    print("%s: %.0f instructions per operation (%d ops per round, rounds %d vs %d%s)"
          % (case, total / n, ops, low, high, ", inputs' own cost subtracted" if prepared else ""))
    print("\nexclusive instructions per operation, top %d:" % top)
    diff = {k: v / n for k, v in exclusive.items()}
    for name, value in sorted(diff.items(), key=lambda kv: -kv[1])[:top]:
        if value < 0.5:
            break
        print("  %8.1f  %s" % (value, short(name)))
    print("\ncalls per operation:")
    for watched in WATCH:
        count = sum(value for name, value in calls.items() if base_name(name) == watched)
        if count:
            print("  %8.2f  %s" % (count / n, watched))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
