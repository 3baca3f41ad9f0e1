#!/usr/bin/env python3
# Torch tensors through shardd: rank processes with torchrun's environment, on one node and on two, read back bit for bit.
"""Runs real daemons (two with peer listeners sharing one root for the
multi-node saves) and rank processes that save torch tensors split as
torch.tensor_split splits them; checkpoints are read back with the
independent reader of test_binding.py and compared byte for byte.

Environment as for test_binding.py. Exits 77 (skipped, for meson) when torch
is missing. Run as `test_torch.py --worker JSON` it is one rank.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

try:
    import torch
except ImportError:
    print("torch is not installed (scripts/deps.sh shardd_venv makes the venv that has it): skipping")
    sys.exit(77)

import suite
import shardd
import shardd.torch as st
from test_binding import WAIT, Daemon, read_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "torch_tp_train.py")

# Every dtype this torch shares with safetensors (1.13 has no float8 and no uint16/32/64).
DTYPES = [d for d in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "complex64", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, d)]


def raw(t):
    """The row-major bytes of a tensor, as safetensors stores them."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def random_tensor(dtype, shape, gen):
    """Random values of any dtype: random bytes reinterpreted (bool from 0/1)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    b = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=gen)
    return b.view(dtype).reshape(shape)


def split_globals():
    """Global tensors and the dim each is split along (None: a replica every rank puts)."""
    g = torch.Generator().manual_seed(11)
    return {
        "rows": (torch.randn(3, 5, generator=g), 0),           # 4 ranks: 1,1,1,0; 3 ranks: 1,1,1
        "cols": (torch.randn(6, 7, generator=g).bfloat16(), 1),  # 4: 2,2,2,1; 3: 3,2,2
        "ids": (torch.randint(-9, 9, (2,), generator=g), 0),    # 4: 1,1,0,0; 3: 1,1,0
        "mask": (torch.rand(5, 2, generator=g) > 0.5, 0),       # 4: 2,1,1,1; 3: 2,2,1
        "mlp.t": (torch.randn(4, 9, generator=g).half().t(), 0),  # a transposed (strided) source
        "cplx": (torch.randn(3, 2, generator=g, dtype=torch.complex64), 1),  # 4: 1,1,0,0
        "step": (torch.tensor(7), None),
    }


def rank_state(rank, world_size):
    return {name: t if dim is None else st.split(t, dim, rank, world_size)
            for name, (t, dim) in split_globals().items()}


def worker(args):
    """One rank: everything else (rank, nodes, leader, socket) comes from the environment."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    r = st.save_state_dict(rank_state(rank, world), args["dir"], write_mode=args.get("write_mode"),
                           timeout=WAIT)
    print(json.dumps(r))
    return 0


def run_ranks(envs, args):
    """Starts one worker per environment, all at once; returns their parsed results."""
    procs = []
    for env in envs:
        full = dict(os.environ, **{k: str(v) for k, v in env.items()})
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(args)],
                                      env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    for p in procs:
        so, se = p.communicate(timeout=4 * WAIT)
        if p.returncode != 0:
            raise AssertionError("rank exited %d:\n%s" % (p.returncode, se.decode()))
        out.append(json.loads(so.decode().strip().splitlines()[-1]))
    return out


class TorchTestCase(unittest.TestCase):
    def assertCheckpointHolds(self, folder, expected):
        arrays, dtypes, _, _ = read_checkpoint(folder)
        self.assertEqual(sorted(arrays), sorted(expected))
        for name, t in expected.items():
            self.assertEqual(list(arrays[name].shape), list(t.shape), name)
            self.assertEqual(arrays[name].tobytes(), raw(t), name)
        return dtypes


class OneNode(TorchTestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.client = shardd.Client(cls.d.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        rc = cls.d.stop()
        if rc != 0:
            raise AssertionError("shardd exited %d:\n%s" % (rc, cls.d.final_log))

    def path(self, *parts):
        return os.path.join(self.d.root, *parts)

    def ranks_save(self, world_size, dir):
        envs = [{"RANK": r, "WORLD_SIZE": world_size, "LOCAL_RANK": r,
                 "LOCAL_WORLD_SIZE": world_size, "SHARDD_SOCKET": self.d.socket}
                for r in range(world_size)]
        results = run_ranks(envs, {"dir": dir})
        self.assertEqual({r["state"] for r in results}, {"committed"})
        self.assertEqual({r["tensors"] for r in results}, {7})
        dtypes = self.assertCheckpointHolds(self.path(dir), {n: t for n, (t, _) in split_globals().items()})
        self.assertEqual((dtypes["cols"], dtypes["mask"], dtypes["cplx"]), ("BF16", "BOOL", "C64"))

    def test_four_ranks_uneven_and_empty_pieces(self):
        # Needs empty slices in the daemon (rank 3 holds no row of "rows", ranks 2, 3 nothing of "ids").
        self.assertEqual([p.shape[0] for p in torch.tensor_split(torch.zeros(3), 4)], [1, 1, 1, 0])
        self.ranks_save(4, "tp4/step-1")

    def test_three_ranks_uneven_and_empty_pieces(self):
        self.ranks_save(3, "tp3/step-1")

    def test_every_dtype_contiguous_or_not(self):
        g = torch.Generator().manual_seed(3)
        tensors = {}
        for i, name in enumerate(DTYPES):
            base = random_tensor(name, (6, 5), g)
            tensors[name] = base
            # Each view over its own copy: views of one memory under two names are tied weights.
            tensors[name + ".t"] = base.clone().t()                  # transposed
            tensors[name + ".step"] = base.clone()[1::2, ::3]         # strided both ways
            tensors[name + ".bcast"] = base.clone()[:1].expand(4, 5)  # stride 0
        tensors["conj"] = random_tensor("complex64", (3,), g).conj()  # a lazy conjugate view
        tensors["neg"] = torch.randn(4, generator=g)._neg_view()      # a lazy negative view
        tensors["scalar.bf16"] = torch.tensor(-2.5, dtype=torch.bfloat16)
        tensors["empty.bf16"] = torch.zeros(0, 3, dtype=torch.bfloat16)
        tensors["grad"] = torch.randn(3, requires_grad=True) * 2
        self.assertFalse(tensors["bfloat16.t"].is_contiguous())
        self.assertTrue(tensors["conj"].is_conj() and tensors["neg"].is_neg())
        r = shardd.save(tensors, "dtypes", client=self.client, timeout=WAIT)
        self.assertEqual(r["tensors"], len(tensors))
        self.assertCheckpointHolds(self.path("dtypes"), {
            n: t.resolve_conj().resolve_neg() for n, t in tensors.items()})
        # The views were read, not changed.
        self.assertTrue(tensors["conj"].is_conj())

    def test_bf16_slices_of_a_strided_view(self):
        full = torch.arange(40, dtype=torch.float32).reshape(8, 5).bfloat16()
        view = full.t()  # (5, 8), non-contiguous
        a, b = st.split(view, 1, 0, 2), st.split(view, 1, 1, 2)
        self.assertFalse(a.array.is_contiguous())
        with shardd.Client(self.d.socket) as other:
            p = shardd.save({"w": a}, "bf16", client=self.client, rank=0, world_size=2, wait=False)
            shardd.save({"w": b}, "bf16", client=other, rank=1, world_size=2, timeout=WAIT)
            p.wait(WAIT)
        self.assertEqual(read_checkpoint(self.path("bf16"))[1]["w"], "BF16")
        self.assertCheckpointHolds(self.path("bf16"), {"w": view})

    def test_cuda_like_path_without_a_gpu(self):
        """What a CUDA tensor goes through, short of a GPU: torch copies it, nothing else touches it."""
        calls = []

        class Watched(torch.Tensor):
            # Every torch call that reaches the tensor; .numpy() or .cpu() would mean a second copy.
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                calls.append(getattr(func, "__name__", str(func)))
                return super().__torch_function__(func, types, args, kwargs or {})

            def numpy(self, *a, **k):
                raise AssertionError("save() went through numpy")

        src = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6).t().as_subclass(Watched)
        a = self.client.arena(4096)
        r = shardd.save({"x": src}, "cudalike", arena=a, timeout=WAIT)
        self.assertEqual(r["tensors"], 1)
        self.assertNotIn("cpu", calls)
        self.assertNotIn("contiguous", calls)
        self.assertEqual(calls.count("copy_"), 1, calls)
        self.assertCheckpointHolds(self.path("cudalike"), {"x": src.as_subclass(torch.Tensor)})
        # A CPU tensor never asks for page-locked memory.
        self.assertFalse(a.pinned)
        if not torch.cuda.is_available():
            # No GPU: nothing is registered, even when asked.
            self.assertFalse(a.pin())
            self.assertFalse(a.pinned)
        else:  # where a GPU is lent: the real thing
            g = torch.arange(10, dtype=torch.float16, device="cuda")[::2]
            shardd.save({"g": g}, "cuda", arena=a, timeout=WAIT)
            self.assertTrue(a.pinned)
            self.assertCheckpointHolds(self.path("cuda"), {"g": g})
        a.close()

    def test_meta_and_sparse_tensors_are_refused(self):
        with self.assertRaises(ValueError) as cm:
            shardd.save({"m": torch.empty(3, device="meta")}, "meta", client=self.client)
        self.assertIn("'m'", str(cm.exception))
        with self.assertRaises(ValueError):
            shardd.save({"s": torch.eye(2).to_sparse()}, "sparse", client=self.client)
        self.assertEqual([s["save"] for s in self.client.status()["saves"]], [])

    def test_state_dict_helper(self):
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))
        sd = model.state_dict()
        with shardd.Client(self.d.socket) as other:
            ranks = []
            for rank, client in enumerate((self.client, other)):
                part = dict(sd)
                # Column-parallel first layer as a triple, row-parallel last one as a Slice.
                w0 = torch.tensor_split(sd["0.weight"], 2, 0)
                part["0.weight"] = (w0[rank], tuple(sd["0.weight"].shape), (3 * rank, 0))
                part["2.weight"] = st.split(sd["2.weight"], 1, rank, 2)
                ranks.append(st.save_state_dict(part, "model", client=client, rank=rank,
                                                world_size=2, wait=False))
            for p in ranks:
                self.assertEqual(p.wait(WAIT)["tensors"], len(sd))
        self.assertCheckpointHolds(self.path("model"), dict(sd))
        with self.assertRaises(TypeError):
            st.state_dict_tensors({"x": [1, 2]})
        with self.assertRaises(ValueError):
            st.state_dict_tensors({"x": (torch.ones(1), (1,))})

    def test_tp_training_example(self):
        p = subprocess.run([sys.executable, EXAMPLE, "--socket", self.d.socket,
                            "--dir", "example", "--ranks", "3", "--steps", "6", "--every", "2"],
                           env=dict(os.environ), capture_output=True, timeout=8 * WAIT)
        self.assertEqual(p.returncode, 0, p.stdout.decode() + p.stderr.decode())
        out = p.stdout.decode()
        self.assertEqual(sorted(os.listdir(self.path("example"))),
                         ["step-000002", "step-000004", "step-000006"], out)
        self.assertIn("reloaded step-000006 into a fresh model: equal", out)


class TwoNodes(TorchTestCase):
    """Two daemons with peer listeners on loopback, sharing one root: a job spanning two nodes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="shardd-py-nodes-")
        token = os.path.join(cls.tmp, "token")
        with open(token, "w") as f:
            f.write("python-two-node-test-secret-0123456789\n")
        os.chmod(token, 0o600)
        root = os.path.join(cls.tmp, "root")
        cls.nodes = []
        for i in range(2):
            cls.nodes.append(Daemon(root=root, args=[
                "--peer-listen", "127.0.0.1:0", "--peer-token-file", token, "--peer-timeout", "5",
                "--node-name", "node%d" % i]))
        cls.root = root
        with shardd.Client(cls.nodes[0].socket) as c:
            cls.leader = c.status()["peers"]["listen"]

    @classmethod
    def tearDownClass(cls):
        logs = []
        for d in cls.nodes:
            if d.stop() != 0:
                logs.append(d.final_log)
        if logs:
            raise AssertionError("a daemon failed:\n" + "\n".join(logs))

    def envs(self, world_size, local_world_size, **extra):
        """torchrun's variables for world_size ranks, local_world_size per node."""
        out = []
        for r in range(world_size):
            node = r // local_world_size
            env = {"RANK": r, "WORLD_SIZE": world_size, "LOCAL_RANK": r % local_world_size,
                   "LOCAL_WORLD_SIZE": local_world_size, "GROUP_RANK": node,
                   "GROUP_WORLD_SIZE": world_size // local_world_size, "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": 29500, "SHARDD_SOCKET": self.nodes[node].socket}
            env.update(extra)
            out.append(env)
        return out

    def peers(self, node):
        with shardd.Client(self.nodes[node].socket) as c:
            return c.status()["peers"]

    def test_torchrun_environment_across_two_nodes(self):
        port = self.leader.rsplit(":", 1)[1]
        before = [self.peers(0), self.peers(1)]
        results = run_ranks(self.envs(4, 2, SHARDD_PEER_PORT=port), {"dir": "nodes/step-1"})
        after = [self.peers(0), self.peers(1)]
        # Node 0 led the save, and node 1's ranks' bytes reached the files through node 1's daemon.
        self.assertEqual(after[0]["saves_led"] - before[0]["saves_led"], 1)
        self.assertEqual(after[1]["saves_led"], before[1]["saves_led"])
        moved = sum(after[1][k] - before[1][k] for k in ("bytes_local", "bytes_forwarded"))
        self.assertGreater(moved, 0)
        self.assertEqual({r["state"] for r in results}, {"committed"})
        self.assertEqual({(r["tensors"], r["bytes"]) for r in results}, {(7, results[0]["bytes"])})
        self.assertCheckpointHolds(os.path.join(self.root, "nodes", "step-1"),
                                   {n: t for n, (t, _) in split_globals().items()})

    def test_leader_from_shardd_leader_and_shared_writes(self):
        # NNODES/NODE_RANK as other launchers set them, the leader given whole, every node writing in place.
        envs = self.envs(2, 1, SHARDD_LEADER=self.leader)
        for env in envs:
            env.update(NNODES=2, NODE_RANK=env.pop("GROUP_RANK"), MASTER_ADDR="192.0.2.1")
        results = run_ranks(envs, {"dir": "nodes/shared", "write_mode": "shared"})
        self.assertEqual({r["state"] for r in results}, {"committed"})
        self.assertCheckpointHolds(os.path.join(self.root, "nodes", "shared"),
                                   {n: t for n, (t, _) in split_globals().items()})

    def test_client_begin_with_explicit_nodes(self):
        full = torch.arange(12, dtype=torch.int32).reshape(4, 3)
        clients = [shardd.Client(d.socket) for d in self.nodes]
        try:
            arenas = [c.arena(4096) for c in clients]
            for rank, (c, a) in enumerate(zip(clients, arenas)):
                c.begin("explicit", "nodes/explicit", rank=rank, world_size=2, nnodes=2, node_rank=rank,
                        leader=self.leader, write_mode="owner")
                piece = full[2 * rank:2 * rank + 2]
                c.put_copy("explicit", "w", "I32", [4, 3], a, 0, piece.numpy(), start=[2 * rank, 0],
                           count=[2, 3])
            for c in clients:
                c.seal("explicit")
            self.assertEqual([c.wait("explicit", WAIT)["tensors"] for c in clients], [1, 1])
            with self.assertRaises(ValueError):
                clients[0].begin("x", "nodes/x", rank=0, world_size=2, nnodes=2)
            with self.assertRaises(shardd.ShardError) as cm:
                clients[0].begin("x", "nodes/x", rank=0, world_size=2, nnodes=2, node_rank=2,
                                 leader=self.leader)
            self.assertIn("node_rank", cm.exception.message)
        finally:
            for c in clients:
                c.close()
        self.assertCheckpointHolds(os.path.join(self.root, "nodes", "explicit"), {"w": full})

    def test_file_series_and_file_parts_across_two_nodes(self):
        # The leader plans another prefix's tensors as files of their own and joins each rank's part
        # of a file, in rank order, whichever node the rank saved through.
        full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        errors = [None, None]

        def rank(r):
            try:
                with shardd.Client(self.nodes[r].socket) as c:
                    shardd.save({"w": shardd.Slice(full[2 * r:2 * r + 2], (4, 6), (2 * r, 0)),
                                 "opt.w": shardd.Slice(full[2 * r:2 * r + 2] * 2, (4, 6), (2 * r, 0))},
                                "nodes/series", client=c, save_id="nodes-series", rank=r, world_size=2, nnodes=2,
                                node_rank=r, leader=self.leader, prefixes={"opt.w": "optim"},
                                file_parts={"parts.txt": "rank %d\n" % r}, timeout=WAIT)
            except shardd.ShardError as e:
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * WAIT)
        self.assertEqual(errors, [None, None])
        folder = os.path.join(self.root, "nodes", "series")
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            self.assertEqual(json.load(f)["weight_map"], {"w": "model.safetensors", "opt.w": "optim.safetensors"})
        with open(os.path.join(folder, "parts.txt")) as f:
            self.assertEqual(f.read(), "rank 0\nrank 1\n")
        self.assertCheckpointHolds(folder, {"w": full, "opt.w": full * 2})
        p = subprocess.run([os.environ["SHARDCTL"], "verify", "--deep", folder], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


def main():
    return suite.run(__name__, worker)


if __name__ == "__main__":
    sys.exit(main())
