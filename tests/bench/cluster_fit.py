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


def fit(points, key, scale):
    """y = a + b*nodes + c*tensors + d*nodes*tensors/1e5, by least squares over the points that
    measured key; the terms the points cannot tell apart (one tensor count) are left out."""
    pts = [p for p in points if p[key] >= 0 and p["nodes"] > 1]
    if len(pts) < 2:
        return None
    n = np.array([p["nodes"] for p in pts])
    t = np.array([p["tensors"] for p in pts]) / 1e5
    y = np.array([p[key] for p in pts]) * scale
    cols, names = [np.ones_like(n), n], ["1", "N"]
    if len(set(t)) > 1:
        cols += [t, n * t]
        names += ["T", "N*T"]
    a = np.stack(cols, axis=1)
    if len(pts) < a.shape[1]:
        a, names = a[:, :2], names[:2]
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    pred = a @ coef
    ss = float(((y - pred) ** 2).sum())
    tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    return dict(zip(names, coef)), 1 - ss / tot, len(pts)


def predict(c, nodes, tensors):
    t = tensors / 1e5
    return c.get("1", 0) + c.get("N", 0) * nodes + c.get("T", 0) * t + c.get("N*T", 0) * nodes * t


def main():
    pts = rows(sys.argv[1:])
    if not pts:
        sys.exit("cluster_fit: no rows (bench_cluster --csv FILE writes them)")
    for layout in sorted({p["layout"] for p in pts}):
        mine = [p for p in pts if p["layout"] == layout]
        tcounts = sorted({int(p["tensors"]) for p in mine})
        print(f"{layout}: {len(mine)} points, tensors {tcounts}, nodes {sorted({int(p['nodes']) for p in mine})}")
        for key, scale, label in METRICS:
            f = fit(mine, key, scale)
            if not f:
                continue
            c, r2, n = f
            terms = " ".join(f"{v:+.4g}*{k}" if k != "1" else f"{v:.4g}" for k, v in c.items())
            preds = "  ".join(f"N={nn},T={tt}: {predict(c, nn, tt):.4g}" for nn in (64, 512) for tt in tcounts)
            print(f"  {label:42s} = {terms}  (T in 1e5 tensors; R^2 {r2:.3f}, {n} pts)")
            print(f"  {'':42s}   predicts {preds}")


if __name__ == "__main__":
    main()
