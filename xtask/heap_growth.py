#!/usr/bin/env python3
"""Live-heap growth in a heaptrack profile, by allocation site.

Usage: heap_growth.py PROFILE.zst WARMUP_MINUTES [TOP]

Reads heaptrack's interpreted trace (`zstdcat` must be on PATH), takes the bytes still
allocated at the first timestamp past the warm-up and at the end, and prints the totals
and the allocation sites whose live bytes grew most between the two. Made for the soak
(`JUNCTION_SOAK_WRAP="heaptrack -o target/bench/heap-%r" cargo xtask bench --soak N`):
heaptrack_print reports what is live at the end, not what grew after the warm-up.

Trace lines used (heaptrack's interpreted format): `s LEN TEXT` a string, `i IP MODULE
[FUNCTION FILE LINE ...]` an instruction pointer, `t IP PARENT` a trace, `a SIZE TRACE`
an allocation kind, `+ KIND` / `- KIND` one allocation or free of it, `c MS` the time.
"""

import collections
import subprocess
import sys

SKIP = ("alloc::", "core::", "hashbrown", "__rust", "std::sys", "malloc", "RawVec")


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, warmup_ms = sys.argv[1], int(float(sys.argv[2]) * 60000)
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    strings, ips, traces, kinds = [None], [None], [None], []
    live = collections.Counter()
    snap, now = None, 0
    with subprocess.Popen(
        ["zstdcat", path], stdout=subprocess.PIPE, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            k = line[:1]
            if k == "+":
                live[int(line[2:], 16)] += 1
            elif k == "-":
                live[int(line[2:], 16)] -= 1
            elif k == "a":
                _, size, trace = line.split()
                kinds.append((int(size, 16), int(trace, 16)))
            elif k == "c":
                now = int(line[2:], 16)
                if snap is None and now >= warmup_ms:
                    snap = collections.Counter(live)
            elif k == "s":
                rest = line[2:].rstrip("\n")
                strings.append(rest.split(" ", 1)[1] if " " in rest else "")
            elif k == "i":
                p = line.split()
                ips.append(int(p[3], 16) if len(p) > 3 else None)
            elif k == "t":
                p = line.split()
                traces.append((int(p[1], 16), int(p[2], 16)))
    if snap is None:
        print(f"{path}: the profile ends at {now} ms, before the warm-up", file=sys.stderr)
        return 1

    def by_site(counts):
        out = collections.Counter()
        for kind, n in counts.items():
            size, trace = kinds[kind]
            out[trace] += size * n
        return out

    before, after = by_site(snap), by_site(live)
    print(f"{path}: {now / 60000:.1f} min")
    print(f"live heap at {warmup_ms / 60000:.1f} min: {sum(before.values())} B")
    print(f"live heap at the end: {sum(after.values())} B")
    growth = collections.Counter({t: after[t] - before[t] for t in set(before) | set(after)})
    grown = [(t, g) for t, g in growth.most_common(top) if g > 0]
    print(f"sites that grew: {sum(1 for g in growth.values() if g > 0)}, "
          f"by {sum(g for g in growth.values() if g > 0)} B in all")
    for trace, g in grown:
        print(f"\n+{g} B (live at the end: {after[trace]} B)")
        frames = 0
        while trace and frames < 8:
            ip, trace = traces[trace]
            fn = ips[ip]
            name = strings[fn] if fn else "?"
            if not any(s in name for s in SKIP):
                print("   ", name[:120])
                frames += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
