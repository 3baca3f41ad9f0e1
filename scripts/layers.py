#!/usr/bin/env python3
"""Who calls whom between source files, read from the built objects: cycles and floor breaches."""
# Reads `nm` of every object of daemon/, proto/ and client/ in a meson build tree.
# An edge A -> B means A's object uses a symbol that B's object defines. A cycle (two files that
# reach each other) or an edge that climbs to a higher floor is printed and fails the check.
import collections
import os
import subprocess
import sys

# The floors of the house (HACKING.md). A file may only call files on its own floor or below.
FLOORS = [
    ("proto", 1),
    ("daemon/region", 2), ("daemon/staging", 2), ("daemon/writer", 2), ("daemon/owner", 2), ("daemon/rootlock", 2),
    ("daemon/pathsafe", 2), ("daemon/publish", 2), ("daemon/pubfill", 2), ("daemon/peer", 2),
    ("daemon/log", 2), ("daemon/crashpoint", 2), ("daemon/sdnotify", 2), ("daemon/listener", 2),
    ("daemon/acceptor", 2), ("daemon/retention", 2), ("daemon/direct", 2), ("daemon/fileset", 2),
    ("daemon/fdpool", 2),
    ("daemon/cluster_plan", 2),  # pure planning: the longer prefix keeps it below the cluster it serves
    ("daemon/save", 3), ("daemon/planner", 3),
    ("daemon/cluster", 4),
    ("daemon/session", 5), ("daemon/ops", 5),
    ("daemon/main", 6), ("daemon/config", 6), ("daemon/metrics", 6),
]


MAX_LINES = 850


def floor_of(src):
    best = None
    for prefix, floor in FLOORS:
        if src.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, floor)
    return best[1] if best else None


def objects(build):
    for root, _, files in os.walk(build):
        rel = os.path.relpath(root, build)
        if rel.startswith(("meson-private", "tests", "build-")):
            continue
        for f in files:
            if f.endswith(".c.o") and rel.split(os.sep)[0] in ("daemon", "proto", "client"):
                path = os.path.join(root, f)
                # meson names objects DIR/libX.a.p/SUBDIR_FILE.c.o or FILE.c.o
                yield path


def source_name(obj):
    base = os.path.basename(obj)[:-len(".c.o")]
    top = next((t for t in ("daemon", "client", "proto") if f"/{t}/" in obj), "proto")
    base = base.split("_", 1)[1] if base.startswith(top + "_") else base
    return f"{top}/{base}"


def nm(obj, *flags):
    out = subprocess.run(["nm", "-P", *flags, obj], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    build = args[0] if args else "build"
    defined, used = {}, collections.defaultdict(set)
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for obj in objects(build):
        src = source_name(obj)
        if not os.path.exists(os.path.join(top, src + ".c")):
            continue  # left in a reused build tree by a file since removed
        for sym in nm(obj, "--defined-only", "-g"):
            defined.setdefault(sym, src)
        used[src].update(nm(obj, "-u"))
    edges = collections.defaultdict(set)
    for src, syms in used.items():
        for sym in syms:
            dst = defined.get(sym)
            if dst and dst != src:
                edges[src].add(dst)
    problems = 0
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a < b and a in edges.get(b, ()):
                print(f"cycle: {a} <-> {b}")
                problems += 1
            fa, fb = floor_of(a), floor_of(b)
            if fa is not None and fb is not None and fb > fa:
                print(f"climbs: {a} (floor {fa}) -> {b} (floor {fb})")
                problems += 1
    # longer loops: strongly connected components of more than one file
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(set(edges) | {d for s in edges.values() for d in s}):
        if v not in index:
            strong(v)
    for comp in comps:
        print("loop: " + " -> ".join(comp))
        problems += 1
    # No source file much past 800 lines (the house rule; 850 is the hard stop).
    for sub in ("daemon", "proto", "client", "include/shardd", "client/python/shardd"):
        folder = os.path.join(top, sub)
        for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if f.endswith((".c", ".h", ".py")):
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    print(f"too long: {sub}/{f} has {n} lines (at most {MAX_LINES})")
                    problems += 1
    if "-v" in sys.argv:
        for a in sorted(edges):
            print(f"{a}: {' '.join(sorted(edges[a]))}")
    if not used:
        print(f"layers: no daemon or proto objects under {build}: build it first")
        return 1
    print(f"layers: {len(used)} files, {sum(len(v) for v in edges.values())} edges, {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
