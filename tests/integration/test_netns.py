#!/usr/bin/env python3
# Three hosts in network namespaces on one bridge, one daemon each, one shared root: loss, partitions, frozen nodes.
"""Every multi-node test elsewhere runs on loopback, where a lost node is a
reset connection at once. Here each daemon lives in its own network
namespace, whose eth0 is a TAP device of a userspace switch (`--switch`, a
process of this file that forwards Ethernet frames between the hosts and
can hold each one a while), ranks run inside their host's namespace, and
the network misbehaves:

  lossy      20 ms each way (the switch), 1% of packets dropped on every
             host (nft numgen) and 200 Mbit/s (tbf): the save completes
             byte-exact, its recorded checksum that of the bytes on disk
  partition  host 2 cut off (nft drops everything) while its rank holds its
             seal: every rank on every host fails within the peer timeout,
             nothing is published, the earlier checkpoint is untouched, and
             once healed the daemons serve the next save
  frozen     host 2's daemon SIGSTOPped mid-save: the same; after SIGCONT
             the next save commits
  leader     the leader stalls (SHARDD_TEST_STALL_AT) after every node's
             files are durable, before the index, and is cut off meanwhile:
             nothing is half-published, and once healed the next save works

This kernel has no netem (CONFIG_NET_SCH_NETEM is not set: `tc qdisc add ...
netem` says "Specified qdisc kind is unknown"), nor fq for timestamped
departures, so the latency is the switch's: a frame is written to the other
host's TAP 20 ms after it was read from the sender's. Needs root, iproute2,
nftables and /dev/net/tun; exits 77 (skipped, for meson) with the reason
otherwise.

Environment as for client/python/tests/test_binding.py. `--rank JSON` is one rank.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "tests"))
import suite  # noqa: E402
from shardd_daemon import Daemon  # noqa: E402
from st_reader import checked_checksums  # noqa: E402

PEER_TIMEOUT = 3
SUBNET = "10.213.7."
PORT = 7077


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def can_run():
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, nft)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (the switch between the hosts is made of TAP devices)"
    for tool in ("ip", "nft", "tc"):
        if not shutil.which(tool):
            return "%s is missing (Debian: iproute2, nftables)" % tool
    probe = "sdt-probe-%d" % os.getpid()
    r = sh("ip", "netns", "add", probe, check=False)
    if r.returncode:
        return "ip netns add fails here: %s" % r.stderr.strip()
    sh("ip", "netns", "del", probe, check=False)
    return None


class Net:
    """Three hosts, 10.213.7.1-3/24, whose eth0 is a TAP device held by the switch process: a
    userspace link that forwards Ethernet frames between them and can hold each one a while."""

    def __init__(self, hosts=3):
        tag = "sdt%d" % (os.getpid() % 100000)
        self.hosts = ["%s-h%d" % (tag, i) for i in range(hosts)]
        for h in self.hosts:
            sh("ip", "netns", "add", h)
            self.ns(h, "ip", "link", "set", "lo", "up")
        self.switch = subprocess.Popen([sys.executable, __file__, "--switch"] + self.hosts, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
        line = self.switch.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("the switch did not start: %r" % line)
        for i, h in enumerate(self.hosts):
            self.ns(h, "ip", "addr", "add", "%s%d/24" % (SUBNET, i + 1), "dev", "eth0")
            self.ns(h, "ip", "link", "set", "eth0", "up")
            self.ns(h, "nft", "add", "table", "inet", "shardd")
            self.ns(h, "nft", "add", "chain", "inet", "shardd", "in",
                    "{ type filter hook input priority 0; }")
            self.ns(h, "nft", "add", "chain", "inet", "shardd", "out",
                    "{ type filter hook output priority 0; }")

    def delay(self, ms):
        """Every frame from now on reaches the other host ms milliseconds after it was sent."""
        self.switch.stdin.write("delay %g\n" % ms)
        self.switch.stdin.flush()
        if self.switch.stdout.readline().strip() != "ok":
            raise RuntimeError("the switch did not take the delay")

    def rtt_ms(self, i, j, port):
        """The shortest of 5 TCP connects from host i to host j's port (one round trip each), in ms."""
        probe = ("import socket, time\nbest = 1e9\nfor _ in range(5):\n    t = time.monotonic()\n"
                 "    socket.create_connection((%r, %d), 10).close()\n    best = min(best, time.monotonic() - t)\n"
                 "print(best * 1000)" % (self.addr(j), port))
        return float(self.ns(self.hosts[i], sys.executable, "-c", probe).stdout)

    @staticmethod
    def ns(name, *cmd):
        return sh("ip", "netns", "exec", name, *cmd)

    def addr(self, i):
        return "%s%d" % (SUBNET, i + 1)

    def cut(self, i):
        """Host i hears nothing and says nothing on eth0 (its loopback still works)."""
        for chain, way in (("in", "iifname"), ("out", "oifname")):
            self.ns(self.hosts[i], "nft", "add", "rule", "inet", "shardd", chain, way, "eth0", "drop")

    def heal(self, i):
        for chain in ("in", "out"):
            self.ns(self.hosts[i], "nft", "flush", "chain", "inet", "shardd", chain)

    def lossy(self, percent, rate="200mbit"):
        for h in self.hosts:
            self.ns(h, "nft", "add", "rule", "inet", "shardd", "in", "numgen", "random", "mod", "100",
                    "<", str(percent), "drop")
            self.ns(h, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb",
                    "latency", "100ms")

    def clean(self):
        self.delay(0)
        for i, h in enumerate(self.hosts):
            self.heal(i)
            sh("ip", "netns", "exec", h, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def close(self):
        self.switch.stdin.close()  # its end: the TAP devices go with it
        self.switch.wait(10)
        for h in self.hosts:
            sh("ip", "netns", "del", h, check=False)


def switch_main(hosts):
    """The link between the hosts (run as `--switch NS...`): a TAP device named eth0 in each host's
    namespace, frames forwarded by destination MAC (flooded until it is learnt), each one written
    out `delay` after it was read. This kernel has no netem, so the latency lives here. stdin takes
    `delay MS` lines (answered `ok`); its end stops the switch."""
    import ctypes
    import fcntl
    import heapq
    import select
    import struct

    CLONE_NEWNET, TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x40000000, 0x400454CA, 0x0002, 0x1000
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    taps = []
    for h in hosts:
        ns = os.open("/var/run/netns/" + h, os.O_RDONLY)
        if libc.setns(ns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns " + h)
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", b"eth0", IFF_TAP | IFF_NO_PI))
        taps.append(fd)
        os.close(ns)
    libc.setns(home, CLONE_NEWNET)
    print("ready", flush=True)
    where, queue, seq, delay = {}, [], 0, 0.0
    while True:
        wait = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        ready, _, _ = select.select(taps + [sys.stdin], [], [], wait)
        if sys.stdin in ready:
            line = sys.stdin.readline()
            if not line:
                return 0
            delay = float(line.split()[1]) / 1000
            print("ok", flush=True)
        now = time.monotonic()
        for i, fd in enumerate(taps):
            if fd not in ready:
                continue
            while True:
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                where[frame[6:12]] = i
                to = [where[frame[:6]]] if frame[:6] in where else [k for k in range(len(taps)) if k != i]
                for k in to:
                    if k != i:
                        seq += 1
                        heapq.heappush(queue, (now + delay, seq, k, frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, k, frame = heapq.heappop(queue)
            try:
                os.write(taps[k], frame)
            except OSError:
                pass  # a host whose link is down drops it, as a cable would


def host_daemon(net, i, root, token, tmp, env=None):
    """shardd inside host i's namespace, peer listener on its address, the shared root."""
    return Daemon(root=root, wrap=["ip", "netns", "exec", net.hosts[i]], env=env, tmp=tmp, name="h%d" % i,
                  args=["--peer-listen", "%s:%d" % (net.addr(i), PORT), "--peer-token-file", token,
                        "--peer-timeout", str(PEER_TIMEOUT), "--node-name", "h%d" % i])


def expected(world):
    """The global tensors the ranks split by rows: a few MiB, so bytes cross the links."""
    import numpy as np

    rng = np.random.default_rng(5)
    tensors = {"embed": rng.standard_normal((world * 64, 2048)).astype(np.float32),
               "mlp.up": rng.integers(0, 2**15, (world * 96, 1024)).astype(np.int16),
               "norm": rng.standard_normal((2048,)).astype(np.float32)}
    return tensors


def rank_main(args):
    """One rank inside its host's namespace: its rows of every tensor, a seal that may wait."""
    import shardd

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = {}
    for name, t in expected(world).items():
        if t.ndim == 1:
            out[name] = t
        else:
            rows = t.shape[0] // world
            out[name] = shardd.Slice(t[rank * rows:(rank + 1) * rows], t.shape, (rank * rows, 0))
    hold = args.get("hold")
    if hold and rank == args.get("hold_rank"):
        seal = shardd.Client.seal

        def held(self, save):
            open(hold + ".ready", "w").close()
            while not os.path.exists(hold + ".go"):
                time.sleep(0.02)
            return seal(self, save)
        shardd.Client.seal = held
    t0 = time.monotonic()
    try:
        r = shardd.save(out, args["dir"], timeout=args.get("timeout", 60), join_timeout=20, idle_timeout=20,
                        overwrite=args.get("overwrite", False))
        return {"state": r["state"], "seconds": time.monotonic() - t0}
    except shardd.ShardError as e:
        return {"error": e.name, "message": e.message, "seconds": time.monotonic() - t0}


class Hosts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="shardd-netns-")
        os.chmod(cls.tmp, 0o755)
        cls.root = os.path.join(cls.tmp, "root")
        cls.token = os.path.join(cls.tmp, "token")
        with open(cls.token, "w") as f:
            f.write("netns-test-shared-secret-0123456789abcdef\n")
        os.chmod(cls.token, 0o600)
        cls.net = Net()
        cls.daemons = [host_daemon(cls.net, i, cls.root, cls.token, cls.tmp) for i in range(3)]
        cls.counts = {"saves": 0, "committed": 0, "partitions": 0, "freezes": 0, "errors": 0}

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons:
            d.stop()
        cls.net.close()
        print("netns: %s" % ", ".join("%s %d" % kv for kv in cls.counts.items()))
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def tearDown(self):
        self.net.clean()

    def ranks(self, dir, daemons=None, **extra):
        """One rank per host, as torchrun would start them; returns the processes."""
        daemons = daemons or self.daemons
        procs = []
        for i in range(3):
            env = dict(os.environ, RANK=str(i), WORLD_SIZE="3", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       NNODES="3", NODE_RANK=str(i), SHARDD_SOCKET=daemons[i].socket,
                       SHARDD_LEADER="%s:%d" % (self.net.addr(0), PORT))
            args = dict({"dir": dir}, **extra)
            procs.append(subprocess.Popen(["ip", "netns", "exec", self.net.hosts[i], sys.executable, __file__,
                                           "--rank", json.dumps(args)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        self.counts["saves"] += 1
        return procs

    def results(self, procs, timeout=90):
        out = []
        for p in procs:
            so, se = p.communicate(timeout=timeout)
            self.assertEqual(p.returncode, 0, se)
            out.append(json.loads(so.strip().splitlines()[-1]))
        return out

    def committed(self, dir, procs):
        res = self.results(procs)
        self.assertEqual([r.get("state") for r in res], ["committed"] * 3, res)
        self.counts["committed"] += 1
        self.assertHolds(dir)
        return res

    def assertHolds(self, dir):
        import numpy as np
        import shardd

        got = shardd.load(os.path.join(self.root, dir))
        want = expected(3)
        self.assertEqual(sorted(got), sorted(want))
        for k, v in want.items():
            self.assertTrue(np.array_equal(got[k], v), k)
        # One file (its checksum in its header), rows from all three hosts forwarded to its owner.
        self.assertEqual(list(checked_checksums(os.path.join(self.root, dir))), ["model.safetensors"])

    def snapshot(self, dir):
        path = os.path.join(self.root, dir)
        return {f: (os.stat(os.path.join(path, f)).st_mtime_ns, open(os.path.join(path, f), "rb").read())
                for f in sorted(os.listdir(path))}

    def assertNothingPublished(self, dir):
        self.assertFalse(os.path.exists(os.path.join(self.root, dir)), dir)
        parent = os.path.dirname(os.path.join(self.root, dir))
        stray = [f for f in os.listdir(parent) if f.startswith(".shardd-tmp-")] if os.path.isdir(parent) else []
        self.assertEqual(stray, [], "temporary folders left after the failure")

    def await_sealed(self, dir, hosts):
        """Until the rank on each of `hosts` has sealed the save into `dir` and waits (its daemon's
        status; a busy machine can take longer than any fixed pause)."""
        import shardd

        deadline = time.monotonic() + 30
        for i in hosts:
            with shardd.Client(self.daemons[i].socket) as c:
                while not any(s["dir"] == dir and s["ranks_sealed"] >= 1 for s in c.status()["saves"]):
                    self.assertLess(time.monotonic(), deadline, "host %d's rank never sealed %s" % (i, dir))
                    time.sleep(0.02)

    def held_failure(self, dir, act, undo, frozen=False):
        """Host 2's rank holds its seal; `act` breaks host 2; every rank must fail within the peer timeout.

        frozen: host 2's daemon is stopped, so its own rank cannot hear anything until it runs
        again: the other hosts' ranks must fail in time, then `undo` thaws it and its rank must
        get an error too, never a commit."""
        hold = os.path.join(self.tmp, dir.replace("/", "_"))
        procs = self.ranks(dir, hold=hold, hold_rank=2)
        deadline = time.monotonic() + 30
        while not os.path.exists(hold + ".ready"):
            self.assertLess(time.monotonic(), deadline, "rank 2 never reached its seal")
            time.sleep(0.02)
        self.await_sealed(dir, (0, 1))
        t0 = time.monotonic()
        act()
        open(hold + ".go", "w").close()
        try:
            res = self.results(procs[:2] if frozen else procs)
            took = time.monotonic() - t0
        finally:
            undo()
        if frozen:
            res += self.results(procs[2:], timeout=3 * PEER_TIMEOUT + 10)
        for r in res:
            self.assertIn("error", r, res)
        self.counts["errors"] += len(res)
        # The peer timeout, a heartbeat period of slack and the ranks' own start.
        self.assertLess(took, 3 * PEER_TIMEOUT + 3, res)
        self.assertNothingPublished(dir)
        return res, took

    def test_1_lossy_link_byte_exact(self):
        self.net.delay(20)
        self.net.lossy(1)
        rtt = self.net.rtt_ms(1, 0, PORT)
        self.assertGreaterEqual(rtt, 40, "20 ms each way")
        t0 = time.monotonic()
        self.committed("ns/lossy", self.ranks("ns/lossy"))
        print("lossy link: 20 ms each way (a TCP connect's round trip %.1f ms), 1%% of packets dropped, 200 Mbit/s: "
              "committed byte-exact in %.1f s" % (rtt, time.monotonic() - t0))

    def test_2_partition_then_heal(self):
        self.committed("ns/before", self.ranks("ns/before"))
        before = self.snapshot("ns/before")
        res, took = self.held_failure("ns/cut", lambda: self.net.cut(2), lambda: self.net.heal(2))
        self.counts["partitions"] += 1
        print("partition: every rank failed in %.1f s: %s" % (took, [(r["error"], r["message"]) for r in res]))
        self.assertEqual(self.snapshot("ns/before"), before, "the earlier checkpoint changed")
        time.sleep(PEER_TIMEOUT)  # the failure's retry window (PEERS.md) passes
        self.committed("ns/after-heal", self.ranks("ns/after-heal"))

    def test_3_frozen_node(self):
        pid = self.daemons[2].proc.pid
        res, took = self.held_failure("ns/frozen", lambda: os.kill(pid, signal.SIGSTOP),
                                      lambda: os.kill(pid, signal.SIGCONT), frozen=True)
        self.counts["freezes"] += 1
        print("frozen node: hosts 0 and 1 failed in %.1f s, host 2 after SIGCONT: %s"
              % (took, [(r["error"], r["message"]) for r in res]))
        time.sleep(PEER_TIMEOUT)
        self.committed("ns/after-thaw", self.ranks("ns/after-thaw"))

    def test_4_leader_cut_before_the_index(self):
        # A second set of daemons whose leader stalls 4 s where it is about to write the index.
        tmp = tempfile.mkdtemp(prefix="stall-", dir=self.tmp)
        for d in self.daemons:
            d.stop()
        stalled = [host_daemon(self.net, i, self.root, self.token, tmp,
                              env={"SHARDD_TEST_STALL_AT": "lead_index:1:4000"} if i == 0 else None)
                   for i in range(3)]
        try:
            procs = self.ranks("ns/leader-cut", daemons=stalled)
            deadline = time.monotonic() + 30
            while "stall point lead_index" not in stalled[0].logtext():
                self.assertLess(time.monotonic(), deadline, "the leader never reached the index:\n"
                                + stalled[0].logtext())
                time.sleep(0.02)
            self.net.cut(0)
            self.counts["partitions"] += 1
            try:
                res = self.results(procs)
            finally:
                self.net.heal(0)
            path = os.path.join(self.root, "ns/leader-cut")
            # Whole or absent: a visible folder must pass the strict reader with every byte right.
            if os.path.exists(path):
                self.assertHolds("ns/leader-cut")
            print("leader cut before the index: folder %s, ranks: %s"
                  % ("published whole" if os.path.exists(path) else "absent",
                     [r.get("state") or r.get("error") for r in res]))
            time.sleep(PEER_TIMEOUT)
            self.committed("ns/after-leader", self.ranks("ns/after-leader", daemons=stalled))
        finally:
            for d in stalled:
                d.stop()
            type(self).daemons = [host_daemon(self.net, i, self.root, self.token, self.tmp) for i in range(3)]


def rank(args):
    print(json.dumps(rank_main(args)), flush=True)
    return 0


def main():
    if sys.argv[1:2] == ["--switch"]:
        return switch_main(sys.argv[2:])
    if sys.argv[1:2] != ["--rank"]:
        why = can_run()
        if why:
            print("test_netns: skipped: %s" % why)
            return 77
    return suite.run(__name__, rank, flag="--rank")


if __name__ == "__main__":
    sys.exit(main())
