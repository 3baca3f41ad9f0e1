#!/usr/bin/env python3
"""Least-squares fits of bench_cluster's measurements (its --csv rows) against nodes and tensors,
and what they predict for larger clusters: python3 tests/bench/cluster_fit.py ROWS.csv [...]."""
import csv
import sys

import numpy as np

FIELDS = ["layout", "table", "tensors", "nodes", "per_node", "declared", "decl_s", "plan_s", "seal_commit_s",
          "lead_recv", "node_sent_max", "node_sent_sum", "lead_rss", "lead_cpu", "node_rss_max", "node_cpu_max",
          "done_commit_s", "blocked_s", "man_bytes", "boxes", "lead_plan_s", "load0", "load1"]
# What is fitted, in the units printed.
METRICS = [("plan_s", 1.0, "planning, last seal to last assign (s)"),
           ("lead_plan_s", 1.0, "leader: last manifest to plan made (s)"),
           ("lead_recv", 1 / 1048576, "leader metadata received (MiB)"),
           ("man_bytes", 1 / 1048576, "of it, manifest and table frames (MiB)"),
           ("node_sent_max", 1 / 1048576, "busiest node's metadata sent (MiB)"),
           ("lead_rss", 1 / 1048576, "leader peak RSS (MiB)"),
           ("lead_cpu", 1.0, "leader CPU (s)"),
           ("done_commit_s", 1.0, "last done to committed (s)")]


def rows(paths):
    out = []
    for p in paths:
        with open(p) as f:
            for r in csv.reader(f):
                if len(r) != len(FIELDS):
                    continue
                d = dict(zip(FIELDS, r))
                for k in FIELDS[2:]:
                    d[k] = float(d[k])
                out.append(d)
    return out


def lstsq(pts, key, scale, feats):
    """Least squares of key (times scale) on the features (name, function of a point); a feature
    the points cannot tell apart from the others is left out. None with fewer than 2 points."""
    pts = [p for p in pts if p[key] >= 0 and p["nodes"] > 1 and p["boxes"] >= 0]
    if len(pts) < 2:
        return None
    y = np.array([p[key] for p in pts]) * scale
    names, cols = ["1"], [np.ones(len(pts))]
    for name, f in feats:
        col = np.array([f(p) for p in pts], dtype=float)
        trial = np.stack(cols + [col], axis=1)
        if len(pts) > len(cols) and np.linalg.matrix_rank(trial) > len(cols):
            names.append(name)
            cols.append(col)
    a = np.stack(cols, axis=1)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    ss = float(((y - a @ coef) ** 2).sum())
    tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    return dict(zip(names, coef)), 1 - ss / tot, len(pts)


def show(c, r2, n):
    return " ".join(f"{v:+.4g}*{k}" if k != "1" else f"{v:.4g}" for k, v in c.items()) + f"  (R^2 {r2:.3f}, {n} pts)"


def main():
    pts = rows(sys.argv[1:])
    if not pts:
        sys.exit("cluster_fit: no rows (bench_cluster --csv FILE writes them)")
    # Against nodes (N) and tensors (T, in units of 1e5), as measured on the scaled model; and against
    # the boxes the leader planned with (B, in 1e6) and T, which is what the leader's work follows.
    # The prediction for real shapes: every node holds a slab of every tensor under FSDP2 or HSDP
    # (merged per node), so B = N x T; the scaled model's dims leave most boxes empty at large N.
    by_n = [("N", lambda p: p["nodes"]), ("T", lambda p: p["tensors"] / 1e5),
            ("N*T", lambda p: p["nodes"] * p["tensors"] / 1e5)]
    by_b = [("B", lambda p: p["boxes"] / 1e6), ("T", lambda p: p["tensors"] / 1e5)]
    for layout in sorted({p["layout"] for p in pts}):
        mine = [p for p in pts if p["layout"] == layout]
        tcounts = sorted({int(p["tensors"]) for p in mine})
        print(f"{layout}: {len(mine)} points, tensors {tcounts}, nodes {sorted({int(p['nodes']) for p in mine})}")
        for key, scale, label in METRICS:
            f = lstsq(mine, key, scale, by_n)
            if not f:
                continue
            print(f"  {label}")
            print(f"    by nodes:  {show(*f)}")
            g = lstsq(mine, key, scale, by_b)
            if not g:
                continue
            print(f"    by boxes:  {show(*g)}")
            c = g[0]
            preds = []
            for nn in (64, 512):
                for tt in tcounts:
                    v = c["1"] + c.get("B", 0) * nn * tt / 1e6 + c.get("T", 0) * tt / 1e5
                    preds.append(f"N={nn} T={tt} (B={nn * tt / 1e6:.2f}M): {v:.4g}")
            print("    predicts (real shapes, B = N x T): " + "; ".join(preds))


if __name__ == "__main__":
    main()
