#!/usr/bin/env python3
"""Turns a package-benchmark run into the suite's one table, and gates mallocs per operation
and bytes per held promise.

    bench.py report RESULTS.jmh.json... [--memory MEMORY.json] [--markdown OUT.md]
    bench.py check RESULTS.jmh.json... [--memory MEMORY.json]
    bench.py update-thresholds RESULTS.jmh.json... [--memory MEMORY.json]

`report` prints the side-by-side table, `check` compares our mallocs/op with
Thresholds/mallocs-per-op.json and our bytes with Thresholds/bytes-per-item.json (failing on
a rise), `update-thresholds` rewrites both from a run. MEMORY.json is what
`PromiseMemory --json` prints (Tools/PromiseMemory): bytes per held item of each memory
case, ours and NIO's, measured in one process.

RESULTS is package-benchmark's JMH export (`--format jmh`); given several runs, each
benchmark's best (lowest) median over them is used. Every benchmark is named
`<case>/<impl>` and tagged `ops: N`, the operations one iteration runs (see
Cases/Cases.swift); per-operation figures are the per-iteration medians divided by N.
Wall-clock figures and ratios are printed, never gated: only mallocs/op can fail a check.
Python 3 standard library only.
"""

import json
import os
import platform
import re
import subprocess
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
THRESHOLDS_DIR = os.path.join(HERE, "Thresholds")
THRESHOLDS_FILE = os.path.join(THRESHOLDS_DIR, "mallocs-per-op.json")
BYTES_FILE = os.path.join(THRESHOLDS_DIR, "bytes-per-item.json")

# Memory targets: ours/NIO for bytes per held item, or an absolute bound in bytes.
MEMORY_TARGETS = {
    "mem:root": ("ratio", 1.0),
    "mem:root+2-observers": ("ratio", 1.0),
    "mem:root+2-observers-default": ("ratio", 1.0),
    "mem:root+then": ("ratio", 1.0),
    "mem:root+then-default": ("ratio", 1.0),
    "mem:settled-leaf-of-chain": ("bytes", 5 * 1024 * 1024),
    # Per settled race, while its other input stays pending: constant memory (the input's
    # prune keeps a handful of bare slots, whatever the number of races).
    "mem:settled-race-on-pending-input": ("bytes", 16),
}
# mallinfo2 deltas are exact but for the odd allocation of another thread over 100,000 items.
BYTES_TOLERANCE_RELATIVE = 0.01

OURS = "promise"

# The targets, as (comparison, bound) on ours/baseline. Time cases compare medians
# per operation (lower is better); `contended` compares throughput (higher is better).
TARGETS = {
    ("settle-one", "nio"): ("<=", 0.3),
    ("settle-one", "lock"): ("<=", 0.5),
    ("chain-1000", "nio"): ("<=", 0.4),
    ("fan-out-1000", "nio"): ("<=", 0.5),
    ("contended", "nio-off-loop"): (">=", 3.0),
    ("contended", "lock"): (">=", 1.0),
    ("observe-settled:then", "nio"): ("<=", 1.0),
    ("queue-hop", "queue.async"): ("<=", 1.15),
    ("async-bridge:settled", "continuation"): ("<=", 0.5),
    ("async-bridge:pending", "continuation"): ("<=", 0.5),
}

# Absolute allocation targets for our promise (mallocs per operation).
ALLOC_TARGETS = {
    "alloc:Promise()": 1.0,
    "alloc:then": 1.0,            # closure capturing nothing
    "alloc:then-1-ref": 1.0,      # closure capturing one reference
    "alloc:then-2-captures": 2.0,
    "alloc:whenComplete": 1.0,
}

THROUGHPUT_CASES = {"contended"}

# Cases whose malloc count depends on a race, so they get no threshold: whether the settling
# thread wins before `await p.value` looks (fast path) or not (a waiter is registered).
UNGATED = {"async-bridge:pending"}

# A check allows this much above a threshold: package-benchmark's histograms keep three
# significant digits, so a per-iteration count can read up to 0.1% high.
TOLERANCE_RELATIVE = 0.01
TOLERANCE_ABSOLUTE = 0.01

NAME = re.compile(r"^package\.benchmark\.[^.]+\.(?P<case>[^/]+)/(?P<impl>.+)_\(ops:_(?P<ops>\d+)\)$")


def load(path):
    """{case: {impl: {"ops", "ns", "p25", "p75", "mallocs", "samples"}}} in run order."""
    with open(path) as handle:
        elements = json.load(handle)
    results = OrderedDict()
    for element in elements:
        match = NAME.match(element["benchmark"])
        if not match:
            print("bench.py: skipping unrecognised benchmark %r" % element["benchmark"], file=sys.stderr)
            continue
        ops = int(match.group("ops"))
        metrics = element["secondaryMetrics"]
        wall = metrics.get("Time (wall clock)")
        mallocs = metrics.get("Malloc (total)")
        if wall is None or mallocs is None:
            print("bench.py: %s lacks wall clock or malloc counts" % element["benchmark"], file=sys.stderr)
            continue
        # JMH export: times in microseconds (three decimals, i.e. nanoseconds), counts as is.
        percentiles = wall["scorePercentiles"]
        results.setdefault(match.group("case"), OrderedDict())[match.group("impl")] = {
            "ops": ops,
            "ns": percentiles["50.0"] * 1000.0 / ops,
            "samples": len(wall["rawData"][0]) if wall.get("rawData") else 0,
            "mallocs": mallocs["scorePercentiles"]["50.0"] / ops,
        }
    return results


def load_runs(paths):
    """Several runs of the suite combined: for each benchmark the best (lowest) median time and
    malloc count over the runs. Interference from other processes only ever adds time, so on a
    shared machine the best of a few runs is the steadier estimate."""
    combined = OrderedDict()
    for path in paths:
        for case, impls in load(path).items():
            for impl, figures in impls.items():
                seen = combined.setdefault(case, OrderedDict()).get(impl)
                if seen is None:
                    combined[case][impl] = dict(figures, runs=1)
                else:
                    seen["ns"] = min(seen["ns"], figures["ns"])
                    seen["mallocs"] = min(seen["mallocs"], figures["mallocs"])
                    seen["runs"] += 1
    return combined


def case_order(results):
    """Cases in the order of the suite (Cases.swift), as the run recorded them."""
    wanted = ["settle-one", "chain-1000", "fan-out-1000", "contended", "observe-settled:then",
              "observe-settled:whenComplete", "queue-hop", "async-bridge:settled",
              "async-bridge:pending", "timeout:answered", "alloc:Promise()", "alloc:then", "alloc:then-1-ref",
              "alloc:then-2-captures", "alloc:whenComplete", "alloc:all-8-inputs"]
    known = [case for case in wanted if case in results]
    return known + [case for case in results if case not in wanted]


def fmt_time(ns):
    if ns >= 100_000:
        return "%.0f µs" % (ns / 1000)
    if ns >= 10_000:
        return "%.1f µs" % (ns / 1000)
    if ns >= 1_000:
        return "%.2f µs" % (ns / 1000)
    if ns >= 100:
        return "%.0f ns" % ns
    return "%.1f ns" % ns


def fmt_rate(ns):
    per_second = 1e9 / ns
    return "%.2f M ops/s" % (per_second / 1e6)


def fmt_mallocs(value):
    return "%.2f" % value


def machine_line():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "load unknown"
    try:
        swift = subprocess.run([os.environ.get("SWIFT", "swift"), "--version"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        swift = "swift ?"
    return "%s, %d cores (%s), %s; %s; %s" % (platform.system(), os.cpu_count() or 0, cpu,
                                             platform.release(), swift, load)


def verdict(case, impl, ratio):
    target = TARGETS.get((case, impl))
    if target is None or ratio is None:
        return "", ""
    op, bound = target
    met = ratio <= bound if op == "<=" else ratio >= bound
    return "%s %g" % (op, bound), ("met" if met else "MISSED")


def load_memory(path):
    """{case: {impl: {"bytes", "perItem"}}} from `PromiseMemory --json`, or {} without a path."""
    if not path:
        return OrderedDict()
    with open(path) as handle:
        rows = json.load(handle)
    memory = OrderedDict()
    for row in rows:
        memory.setdefault(row["case"], OrderedDict())[row["impl"]] = {"bytes": row["bytes"],
                                                                        "perItem": row["perItem"]}
    return memory


def fmt_bytes(value):
    if value >= 10 * 1024 * 1024:
        return "%.1f MB" % (value / 1e6)
    if value >= 100_000:
        return "%.0f kB" % (value / 1e3)
    return "%.0f B" % value


def memory_table(memory):
    """The memory rows, ours beside NIO, and how many targets they met and missed."""
    lines = ["| memory case | ours | nio | ours/nio | target | |",
             "|---|---:|---:|---:|---|---|"]
    tally = {"met": 0, "MISSED": 0}
    for case, impls in memory.items():
        ours, nio = impls.get(OURS), impls.get("nio")
        ratio = ours["bytes"] / nio["bytes"] if ours and nio and nio["bytes"] > 0 else None
        kind, bound = MEMORY_TARGETS.get(case, (None, None))
        target, status = "", ""
        if kind == "ratio" and ratio is not None:
            target, status = "<= %g" % bound, ("met" if ratio <= bound else "MISSED")
        elif kind == "bytes" and ours:
            target, status = "<= %s" % fmt_bytes(bound), ("met" if ours["bytes"] <= bound else "MISSED")
        if status:
            tally[status] += 1
        unit = "" if (ours or nio or {}).get("perItem", True) else " kept"
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            case, (fmt_bytes(ours["bytes"]) + unit) if ours else "-", (fmt_bytes(nio["bytes"]) + unit) if nio else "-",
            ("%.2f" % ratio) if ratio is not None else "-", target, status))
    return lines, tally


def report(results, out=None, memory=None):
    rows = []
    header = ["case", "ours (promise)", "baseline", "baseline time", "ours/baseline", "target", "",
              "mallocs/op ours", "mallocs/op baseline"]
    order = ["nio", "nio-off-loop", "lock", "continuation", "queue.async"]
    tally = {"met": 0, "MISSED": 0}
    for case in case_order(results):
        impls = results[case]
        ours = impls.get(OURS)
        throughput = case in THROUGHPUT_CASES
        show = fmt_rate if throughput else fmt_time
        baselines = sorted((impl for impl in impls if impl != OURS),
                           key=lambda impl: order.index(impl) if impl in order else len(order))
        ours_text = show(ours["ns"]) if ours else "-"
        ours_mallocs = fmt_mallocs(ours["mallocs"]) if ours else "-"
        alloc_bound = ALLOC_TARGETS.get(case)
        for index, impl in enumerate(baselines or [None]):
            base = impls.get(impl) if impl else None
            ratio = None
            if ours and base:
                # Throughput ratio for `contended` (ours/baseline ops per second); time ratio else.
                ratio = (base["ns"] / ours["ns"]) if throughput else (ours["ns"] / base["ns"])
            target, status = verdict(case, impl, ratio)
            if alloc_bound is not None and ours and index == 0:
                # Allocation rows: the malloc target is the one that counts.
                target = "<= %g mallocs" % alloc_bound
                status = "met" if ours["mallocs"] <= alloc_bound + TOLERANCE_ABSOLUTE else "MISSED"
            if status:
                tally[status] += 1
            rows.append([case if index == 0 else "", ours_text if index == 0 else "", impl or "-",
                         show(base["ns"]) if base else "-",
                         ("%.2f" % ratio) if ratio is not None else "-", target, status,
                         ours_mallocs if index == 0 else "", fmt_mallocs(base["mallocs"]) if base else "-"])
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---", "---:", "---", "---:", "---:", "---", "---", "---:", "---:"]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    runs = max((figures.get("runs", 1) for impls in results.values() for figures in impls.values()), default=1)
    text = ("Machine: %s\n\n"
            "Medians per operation of package-benchmark iterations%s (per step for chain-1000, per "
            "observer for fan-out-1000; contended in operations per second). ours/baseline < 1 "
            "means ours is faster, except for contended, where it is the throughput ratio (> 1 "
            "means ours is faster). Times are printed, never gated; `make bench-check` gates "
            "mallocs/op and bytes per held item.\n\n%s\n"
            % (machine_line(), (", best of %d runs" % runs) if runs > 1 else "", "\n".join(lines)))
    if memory:
        memory_lines, memory_tally = memory_table(memory)
        text += ("\nMemory (`PromiseMemory`, same machine): bytes per held item, malloc's headers and "
                 "rounding included (glibc's bytes in use over 100,000 items); the last row is what a "
                 "held settled leaf of a 100,000-step chain keeps. Gated by `make bench-check`.\n\n%s\n"
                 % "\n".join(memory_lines))
        for key in tally:
            tally[key] += memory_tally[key]
    print(text)
    print("targets: %d met, %d missed (wall-clock ratios, mallocs for the alloc rows, bytes for the memory rows)"
          % (tally["met"], tally["MISSED"]))
    if out:
        with open(out, "w") as handle:
            handle.write(text)


def read_thresholds(path=THRESHOLDS_FILE):
    """A thresholds file: {"<case>/<impl>": max mallocs per operation (or bytes per item)}."""
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        data = json.load(handle)
    return {key: value for key, value in data.items() if not key.startswith("_")}


def check_memory(memory):
    """Our bytes per item against Thresholds/bytes-per-item.json: (checked, failures)."""
    thresholds = read_thresholds(BYTES_FILE)
    failures, checked = [], 0
    if not thresholds:
        print("bench.py: no byte thresholds in %s" % BYTES_FILE, file=sys.stderr)
        return 0, ["(no byte thresholds)"]
    print("\n| memory case | bytes | threshold | |")
    print("|---|---:|---:|---|")
    for key, limit in sorted(thresholds.items()):
        case, _, impl = key.partition("/")
        measured = memory.get(case, {}).get(impl)
        if measured is None:
            print("bench.py: %s has a byte threshold but was not measured" % key, file=sys.stderr)
            failures.append(key)
            continue
        checked += 1
        ok = measured["bytes"] <= limit * (1 + BYTES_TOLERANCE_RELATIVE)
        note = "ok" if ok else "REGRESSION: %.0f bytes more than allowed" % (measured["bytes"] - limit)
        if ok and measured["perItem"] and MEMORY_TARGETS.get(case, (None,))[0] != "bytes" and measured["bytes"] < limit * 0.9:
            note = "ok, improved: `make bench-thresholds` to lock it in"
        print("| %s | %.0f | %.0f | %s |" % (key, measured["bytes"], limit, note))
        if not ok:
            failures.append("%s (%.0f bytes, threshold %.0f)" % (key, measured["bytes"], limit))
    return checked, failures


def check(results, memory=None):
    thresholds = read_thresholds()
    if not thresholds:
        print("bench.py: no thresholds in %s" % THRESHOLDS_DIR, file=sys.stderr)
        return 1
    failures, checked, missing = [], 0, []
    print("| benchmark | mallocs/op | threshold | |")
    print("|---|---:|---:|---|")
    for key, limit in sorted(thresholds.items()):
        case, _, impl = key.partition("/")
        measured = results.get(case, {}).get(impl)
        if measured is None:
            missing.append(key)
            continue
        checked += 1
        allowed = limit * (1 + TOLERANCE_RELATIVE) + TOLERANCE_ABSOLUTE
        ok = measured["mallocs"] <= allowed
        note = "ok" if ok else "REGRESSION"
        if ok and measured["mallocs"] < limit - 0.5:
            note = "ok, improved: `make bench-thresholds` to lock it in"
        print("| %s | %.3f | %g | %s |" % (key, measured["mallocs"], limit, note))
        if not ok:
            failures.append(key)
    for key in missing:
        print("bench.py: %s has a threshold but was not in this run" % key, file=sys.stderr)
    memory_checked, memory_failures = check_memory(memory) if memory is not None else (0, [])
    if failures:
        print("\nbench-check: FAILED: mallocs per operation above threshold: %s" % ", ".join(failures))
    if memory_failures:
        print("\nbench-check: FAILED: bytes per held item above threshold: %s" % ", ".join(memory_failures))
    if failures or memory_failures:
        print("(an intended change? `make bench-thresholds` rewrites %s and %s from a run)"
              % (os.path.relpath(THRESHOLDS_FILE, os.path.dirname(HERE)),
                 os.path.relpath(BYTES_FILE, os.path.dirname(HERE))))
        print("bench-check: %d passed, %d failed" % (checked + memory_checked - len(failures) - len(memory_failures),
                                                     len(failures) + len(memory_failures)))
        return 1
    if missing:
        print("\nbench-check: FAILED: %d thresholded benchmarks missing from the run" % len(missing))
        return 1
    print("\nbench-check: %d passed, 0 failed" % (checked + memory_checked))
    return 0


def update_memory_thresholds(memory):
    data = OrderedDict()
    data["_comment"] = ("Maximum bytes per held item of our promise in each memory case (the settled leaf: "
                        "bytes it keeps; the settled race: bytes kept per race), checked by `make "
                        "bench-check` (bench.py check). Rewritten by `make bench-thresholds`.")
    for case, impls in memory.items():
        if OURS not in impls:
            continue
        kind, bound = MEMORY_TARGETS.get(case, (None, None))
        if kind == "bytes":
            # An absolute bound (what a held leaf keeps: a few hundred bytes that other
            # threads' allocations move around; what a settled race keeps: about nothing):
            # the gate is the target itself.
            data["%s/%s" % (case, OURS)] = bound
        else:
            data["%s/%s" % (case, OURS)] = round(impls[OURS]["bytes"])
    with open(BYTES_FILE, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    print("wrote %s (%d thresholds)" % (BYTES_FILE, len(data) - 1))


def update_thresholds(results, memory=None):
    data = OrderedDict()
    data["_comment"] = ("Maximum mallocs per operation of our promise in each benchmark, checked by "
                        "`make bench-check` (bench.py check). Rewritten by `make bench-thresholds`.")
    for case in case_order(results):
        ours = results[case].get(OURS)
        if ours is not None and case not in UNGATED:
            # Round to the count a run reads (histogram precision), two decimals.
            data["%s/%s" % (case, OURS)] = round(ours["mallocs"] + 1e-9, 2)
    os.makedirs(THRESHOLDS_DIR, exist_ok=True)
    with open(THRESHOLDS_FILE, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    print("wrote %s (%d thresholds)" % (THRESHOLDS_FILE, len(data) - 1))
    if memory:
        update_memory_thresholds(memory)
    return 0


def main(argv):
    if len(argv) < 3 or argv[1] not in ("report", "check", "update-thresholds"):
        print(__doc__, file=sys.stderr)
        return 2
    args = argv[2:]

    def option(name):
        nonlocal args
        if name not in args:
            return None
        value = args[args.index(name) + 1]
        args = args[:args.index(name)] + args[args.index(name) + 2:]
        return value

    out = option("--markdown")
    memory_path = option("--memory")
    results = load_runs(args)
    if not results:
        print("bench.py: no benchmark results in %s" % " ".join(args), file=sys.stderr)
        return 1
    memory = load_memory(memory_path) if memory_path else None
    if argv[1] == "report":
        report(results, out, memory)
        return 0
    if argv[1] == "check":
        return check(results, memory)
    return update_thresholds(results, memory)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
