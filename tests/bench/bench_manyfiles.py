#!/usr/bin/env python3
# Many-files benchmark: one save of 100,000 one-tensor shard files under a cap on open files, checked deep and loaded back under a descriptor limit.
"""One command (python3 with numpy, from a built tree; docs/benchmarks.md):

    nice -n 10 python3 tests/bench/bench_manyfiles.py [--files 100000] [--max-open-files 64] [--nofile 1024]

A daemon on build/bench-manyfiles/root, run under a soft and hard RLIMIT_NOFILE of NOFILE
(prlimit) with --max-open-files CAP, and this process as its only rank. It saves FILES tensors
of 16 F32 values with max_shard_size 64, so every tensor is a file of its own, then:

  save     wall time of shardd.save until the commit (every file fsynced), the daemon's CPU,
           peak RSS (VmHWM) and the most descriptors it held (/proc/PID/fd, sampled every few
           ms), with its metrics files_open_peak and files_reopened
  verify   shardctl verify --deep of the checkpoint: wall time and peak RSS
  load     shardd.load of every tensor in this process under a soft descriptor limit of NOFILE,
           every value compared

--check (the suite's small case) exits 1 when the save did not commit, the check or the load
failed, a value differs, files_open_peak is over CAP, or the daemon's descriptors grew by more
than CAP plus a few of its own. No time is judged.
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
from bench_proc import proc_figures  # noqa: E402

# Descriptors the daemon holds during a save besides shard files: this rank's connection and
# arena, the save's folders, the late file its checksums go into, the O_DIRECT probe.
BESIDES = 12


class FdWatch(threading.Thread):
    """The most descriptors pid holds, sampled until stop()."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.path, self.peak, self.samples, self.done = "/proc/%d/fd" % pid, 0, 0, threading.Event()

    def count(self):
        try:
            return len(os.listdir(self.path))
        except OSError:
            return 0

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, self.count())
            self.samples += 1
            self.done.wait(0.003)

    def stop(self):
        self.done.set()
        self.join()


def metrics(shardctl, socket):
    """{name: value} of the daemon's Prometheus text (unlabelled samples only)."""
    out = subprocess.run([shardctl, "--socket", socket, "metrics"], check=True, capture_output=True,
                         text=True).stdout
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(shardd_[a-z_]+) (\S+)$", out, re.M)}


def run_timed(cmd):
    """(exit status, wall seconds, peak RSS bytes, output) of a child process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, time.perf_counter() - t0, ru.ru_maxrss * 1024, out.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100000)
    ap.add_argument("--max-open-files", type=int, default=64)
    ap.add_argument("--nofile", type=int, default=1024, help="the daemon's and the load's descriptor limit")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-manyfiles"))
    ap.add_argument("--check", action="store_true", help="exit 1 on a wrong result (the suite's case)")
    a = ap.parse_args()
    os.environ.setdefault("SHARDD_BIN", os.path.join(ROOT, "build", "daemon", "shardd"))
    os.environ.setdefault("LIBSHARDD", os.path.join(ROOT, "build", "client", "libshardd.so"))
    shardctl = os.environ.get("SHARDCTL", os.path.join(ROOT, "build", "client", "shardctl"))
    import shardd
    from shardd_daemon import Daemon

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    root = os.path.join(a.work, "root")
    d = Daemon(root=root, tmp=a.work, name="manyfiles", args=["--max-open-files", str(a.max_open_files)],
               wrap=["prlimit", "--nofile=%d:%d" % (a.nofile, a.nofile)])
    wrong = []
    try:
        tensors = {"t.%06d" % i: np.full(16, i, np.float32) for i in range(a.files)}
        print("bench_manyfiles: %d files of one F32[16] tensor, --max-open-files %d, RLIMIT_NOFILE %d, "
              "load average %s" % (a.files, a.max_open_files, a.nofile, " ".join(open("/proc/loadavg").read().split()[:3])))
        watch = FdWatch(d.proc.pid)
        before = watch.count()
        cpu0 = proc_figures(d.proc.pid)[0]
        watch.start()
        t0 = time.perf_counter()
        shardd.save(tensors, "many", socket=d.socket, max_shard_size=64)
        save_s = time.perf_counter() - t0
        watch.stop()
        cpu, hwm = proc_figures(d.proc.pid)[:2]
        m = metrics(shardctl, d.socket)
        path = os.path.join(root, "many")
        nshards = sum(1 for f in os.listdir(path) if f.endswith(".safetensors"))
        if nshards != a.files:
            wrong.append("%d shard files, not %d" % (nshards, a.files))
        print("  save    %8.2f s wall  %6.2f s daemon CPU  peak RSS %6.1f MiB  descriptors %d before, at most %d "
              "during (%d samples)  files_open_peak %d  files_reopened %d" % (
                  save_s, cpu - cpu0, hwm / 2**20, before, watch.peak, watch.samples,
                  m.get("shardd_files_open_peak", -1), m.get("shardd_files_reopened_total", -1)))
        if m.get("shardd_files_open_peak", 0) > a.max_open_files:
            wrong.append("files_open_peak %d over the cap" % m["shardd_files_open_peak"])
        if watch.peak - before > a.max_open_files + BESIDES:
            wrong.append("the daemon's descriptors grew by %d" % (watch.peak - before))

        rc, verify_s, verify_rss, out = run_timed([shardctl, "verify", "--deep", path])
        print("  verify  %8.2f s wall  peak RSS %6.1f MiB  (%s)" % (verify_s, verify_rss / 2**20, out.splitlines()[-1]))
        if rc != 0:
            wrong.append("verify --deep: %s" % out)

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(a.nofile, hard), hard))
        try:
            t0 = time.perf_counter()
            back = shardd.load(path)
            load_s = time.perf_counter() - t0
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        bad = sum(1 for k, v in tensors.items() if k not in back or not np.array_equal(back[k], v)) + \
            len(set(back) - set(tensors))
        print("  load    %8.2f s wall  (soft RLIMIT_NOFILE %d)  %d tensors, %d differ" % (
            load_s, a.nofile, len(back), bad))
        if bad:
            wrong.append("%d tensors read back differ" % bad)
    finally:
        d.stop()
        shutil.rmtree(a.work, ignore_errors=True)
    print("  load average after: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    for w in wrong:
        print("WRONG: %s" % w)
    return 1 if wrong and a.check else 0


if __name__ == "__main__":
    sys.exit(main())
