#!/usr/bin/env python3
# DTensors through shardd: boxes against torch's own layout math, gloo ranks saving and resharding every placement.
"""The boxes shardd.torch computes for a DTensor are checked against
torch's compute_local_shape_and_global_offset on every coordinate of many
meshes, shapes and placements, and shown to tile the tensor exactly once.
Then 4 real gloo ranks build DTensors with distribute_tensor (Shard on any
dim, uneven and empty, Replicate, _StridedShard as FSDP2 over TP makes it,
a strided shard that leaves gaps, HSDP, one dim over two mesh dims), save
them through a real daemon, and load them back into other placements; the
files are read with safetensors and compared bit for bit. A Partial DTensor
is refused by name with nothing published, and a rank killed mid-save gives
the other client_lost naming it. load_state_dict's batched reader fills
contiguous, transposed, strided and misaligned views with the bytes the
strict reader's box reads give, and refuses a shard swapped in after open.

Environment as for test_binding.py. Exits 77 (skipped) without torch >= 2.4
or safetensors. Run as `test_dtensor.py --worker JSON` it is one rank.
"""
import itertools
import json
import os
import signal
import sys
import time
import unittest

try:
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from safetensors import safe_open
except ImportError as e:
    print("torch >= 2.4 with DTensor, or safetensors, is missing (%s): skipping; scripts/deps.sh "
          "shardd_venv makes the venv that has them" % e)
    sys.exit(77)

import suite
import shardd
import shardd.torch as st
from shardd._dtensor import placement_boxes
from test_binding import Daemon
from torch_world import answer, WAIT, init, raw, run_world, seeded, start_world, finish_world

S, R, SS = Shard, Replicate, _StridedShard


def globals_():
    """name -> (global tensor, mesh shape, saved placements, loaded placements)."""
    return {
        "s0": (seeded((10, 6), torch.float32, 1), (4,), [S(0)], [S(1)]),        # 3,3,3,1 rows
        "s1": (seeded((5, 3), torch.bfloat16, 2), (4,), [S(1)], [S(0)]),        # 1,1,1,0 cols
        "tiny": (seeded((2,), torch.int64, 3), (4,), [S(0)], [R()]),            # 1,1,0,0
        "rep": (seeded((4, 4), torch.float32, 4), (4,), [R()], [S(0)]),
        "2d": (seeded((9, 8), torch.float32, 5), (2, 2), [S(0), S(1)], [S(1), S(0)]),
        "fsdp_tp": (seeded((12, 4), torch.bfloat16, 6), (2, 2), [SS(0, split_factor=2), S(0)],
                    [S(0), R()]),
        "gaps": (seeded((10, 3), torch.float32, 7), (2, 2), [SS(0, split_factor=3), R()], [R(), S(1)]),
        "hsdp": (seeded((7, 5), torch.float16, 8), (2, 2), [R(), S(0)], [S(0), S(0)]),
        "split2": (seeded((11, 2), torch.float32, 9), (2, 2), [S(0), S(0)], [R(), R()]),
        "mask": (seeded((6,), torch.bool, 10), (4,), [S(0)], [S(0)]),
        "step": (seeded((), torch.int32, 11), (4,), [R()], [R()]),
    }


def make(mesh_shape, tensor, placements):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", mesh_shape)
    return distribute_tensor(tensor, mesh, placements)


def worker(args):
    rank, world = init()
    op = args["op"]
    if op == "kill":
        return kill_worker(rank, args)
    g = globals_()
    sd = {n: make(mesh, t, pl) for n, (t, mesh, pl, _) in g.items()}
    if op == "partial":
        sd["mlp.partial"] = DTensor.from_local(torch.ones(3, 2), sd["s0"].device_mesh, [Partial()])
        try:
            st.save_state_dict(sd, args["dir"], timeout=WAIT)
        except shardd.ShardError as e:
            return {"name": e.name, "message": e.message}
        return {"name": None}
    # Every local tensor is the global tensor's boxes, as distribute_tensor laid it out.
    put = {}
    for name, dt in sd.items():
        slices = st.state_dict_tensors({name: dt})[name]
        for s in slices:
            box = tuple(slice(a, a + c) for a, c in zip(s.start, s.array.shape))
            assert torch.equal(g[name][0][box] if box else g[name][0], s.array), name
        put[name] = sum(s.array.numel() * s.array.element_size() for s in slices)
    result = st.save_state_dict(sd, args["dir"], timeout=WAIT)
    # Into other placements: zeros first, so every element checked was read.
    target = {n: make(mesh, torch.zeros_like(t), pl2) for n, (t, mesh, _, pl2) in g.items()}
    st.load_state_dict(os.path.join(args["root"], args["dir"]), target)
    loaded = {n: raw(dt.full_tensor()) == raw(g[n][0]) for n, dt in target.items()}
    return {"put": put, "result": result, "loaded": loaded}


def await_sealed(dir, n):
    """Polls the daemon's status until the save into `dir` has n ranks sealed (bounded by WAIT)."""
    deadline = time.monotonic() + WAIT
    with shardd.Client(os.environ["SHARDD_SOCKET"]) as c:
        while not any(s["dir"] == dir and s["ranks_sealed"] >= n for s in c.status()["saves"]):
            if time.monotonic() > deadline:
                raise AssertionError("no %d rank(s) of the save into %s sealed within %s s" % (n, dir, WAIT))
            time.sleep(0.02)


def kill_worker(rank, args):
    """Rank 1 dies by SIGKILL once its puts are in, before it seals; rank 0 reports what it got."""
    sd = {"w": make((2,), seeded((8, 4), torch.float32, 1), [S(0)])}
    if rank == 1:
        def die(*_a, **_k):
            os.kill(os.getpid(), signal.SIGKILL)
        shardd.Client.seal = die
        # Rank 0 has sealed and waits before this rank begins: a busy machine can take longer than
        # any fixed pause to get it there, and a rank 0 that began after the loss would hear
        # save_failed instead.
        await_sealed(args["dir"], 1)
    t0 = time.monotonic()
    try:
        st.save_state_dict(sd, args["dir"], timeout=WAIT, idle_timeout=args["idle"])
    except shardd.ShardError as e:
        return {"name": e.name, "message": e.message, "seconds": time.monotonic() - t0}
    return {"name": None}


def write_packed(path, tensors):
    """A safetensors file of tensors in name order, each right after the one before (no alignment);
    returns its header."""
    from shardd._tensors import dtype_name

    header, data = {}, []
    for name in sorted(tensors):
        at = sum(map(len, data))
        data.append(raw(tensors[name]))
        header[name] = {"dtype": dtype_name(tensors[name].dtype), "shape": list(tensors[name].shape),
                        "data_offsets": [at, at + len(data[-1])]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(data))
    return header


class Boxes(unittest.TestCase):
    def placements(self, ndim):
        return ([R()] + [S(d) for d in range(ndim)]
                + [SS(d, split_factor=f) for d in range(ndim) for f in (2, 3)])

    def test_against_torch(self):
        """Local shape and first offset equal torch's on every coordinate; primaries tile the tensor once."""
        cases = checked = 0
        for shape in [(8, 8), (10, 3), (3, 5), (7,), (1, 4), (0, 4), (13, 6, 5)]:
            for mesh in [(4,), (3,), (2, 2), (2, 3), (2, 2, 2)]:
                for pl in itertools.product(self.placements(len(shape)), repeat=len(mesh)):
                    cover = torch.zeros(shape, dtype=torch.int32)
                    for coord in itertools.product(*[range(k) for k in mesh]):
                        local, offset = _compute_local_shape_and_global_offset(shape, mesh, list(coord), pl)
                        boxes, primary = placement_boxes(shape, mesh, coord, pl)
                        totals = tuple(sum(c[d] for _, c, at in boxes
                                           if all(x == 0 for i, x in enumerate(at) if i != d))
                                       for d in range(len(shape)))
                        self.assertEqual(totals, tuple(local), (shape, mesh, pl, coord))
                        if all(local):
                            self.assertEqual(boxes[0][0], tuple(offset), (shape, mesh, pl, coord))
                            checked += 1
                        if primary:
                            for start, count, _ in boxes:
                                cover[tuple(slice(a, a + c) for a, c in zip(start, count))] += 1
                        cases += 1
                    self.assertTrue(bool((cover == 1).all()), (shape, mesh, pl))
        self.assertGreater(cases, 20000)
        print("boxes: %d coordinates, %d offsets compared" % (cases, checked))

    def test_partial_named(self):
        from shardd._dtensor import PartialPlacementError

        with self.assertRaisesRegex(PartialPlacementError, "'lm_head.weight'.*Partial.*mesh dim 1"):
            placement_boxes((4, 4), (2, 2), (0, 0), [S(0), Partial()], "lm_head.weight")


class WithDaemon(unittest.TestCase):
    """A daemon of its own for each class of tests."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()


class Ranks(WithDaemon):

    def args(self, dir, **kw):
        return dict({"dir": dir, "root": self.d.root}, **kw)

    def test_save_and_reshard(self):
        out = run_world(__file__, 4, self.args("dt/every", op="save"), {"SHARDD_SOCKET": self.d.socket})
        g = globals_()
        with safe_open(os.path.join(self.d.root, "dt/every/model.safetensors"), "pt") as f:
            self.assertEqual(sorted(f.keys()), sorted(g))
            for name, (t, *_rest) in g.items():
                self.assertEqual(raw(f.get_tensor(name)), raw(t), name)
        for rank, r in enumerate(out):
            self.assertEqual(r["result"]["tensors"], len(g))
            self.assertTrue(all(r["loaded"].values()), (rank, r["loaded"]))
        # A replica is handed over by coordinate 0 of its replicated mesh dim only.
        self.assertEqual([r["put"]["rep"] for r in out], [64, 0, 0, 0])
        self.assertEqual([r["put"]["hsdp"] for r in out], [40, 30, 0, 0])
        self.assertEqual(sum(r["put"]["fsdp_tp"] for r in out), 12 * 4 * 2)

    def test_partial_refused(self):
        out = run_world(__file__, 4, self.args("dt/partial", op="partial"), {"SHARDD_SOCKET": self.d.socket})
        for r in out:
            self.assertEqual(r["name"], "invalid_argument")
            self.assertIn("'mlp.partial'", r["message"])
            self.assertIn("Partial", r["message"])
        self.assertFalse(os.path.exists(os.path.join(self.d.root, "dt/partial")))
        with shardd.Client(self.d.socket) as c:
            self.assertEqual(c.status()["saves"], [])

    def test_killed_rank(self):
        idle = 5
        procs = start_world(__file__, 2, self.args("dt/killed", op="kill", idle=idle),
                            {"SHARDD_SOCKET": self.d.socket})
        results = finish_world(procs)
        self.assertEqual(results[1][0], -signal.SIGKILL)
        rc, r0, err = results[0]
        self.assertEqual(rc, 0, err)
        self.assertIsNotNone(r0["name"], "rank 0's save committed without rank 1")
        # Told by the daemon that rank 1 is gone, not by its own wait's bound or the idle deadline.
        self.assertEqual(r0["name"], "client_lost", r0)
        self.assertIn("rank 1 of save", r0["message"])
        self.assertIn("disconnected before seal", r0["message"])
        print("killed rank: rank 0 got %s after %.2f s: %s" % (r0["name"], r0["seconds"], r0["message"]))
        self.assertFalse(os.path.exists(os.path.join(self.d.root, "dt/killed")))


class OneProcess(WithDaemon):
    """Tied names and load_state_dict's refusals, from one plain process."""

    def test_tied_names(self):
        emb = torch.randn(6, 4)
        sd = {"embed.weight": emb, "norm.weight": torch.ones(4), "lm_head.weight": emb}
        with self.assertRaisesRegex(ValueError, r"'embed.weight', 'lm_head.weight' are one tensor.*"
                                                r"tied='drop' to save only 'embed.weight'"):
            st.save_state_dict(sd, "tied/refused", socket=self.d.socket)
        self.assertFalse(os.path.exists(os.path.join(self.d.root, "tied/refused")))
        r = st.save_state_dict(sd, "tied/dropped", tied="drop", socket=self.d.socket)
        self.assertEqual(r["tensors"], 2)
        # Loading fills both names from the one the checkpoint holds.
        target = {"embed.weight": torch.zeros(6, 4), "norm.weight": torch.zeros(4)}
        target["lm_head.weight"] = target["embed.weight"]
        self.assertEqual(st.load_state_dict(os.path.join(self.d.root, "tied/dropped"), target), ([], []))
        self.assertTrue(torch.equal(target["lm_head.weight"], emb))

    def test_load_refusals_name_everything_first(self):
        st.save_state_dict({"a": torch.randn(3, 2), "b": torch.arange(4), "c": torch.ones(2)}, "ld/src",
                           socket=self.d.socket)
        path = os.path.join(self.d.root, "ld/src")
        target = {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.int32), "d": torch.zeros(1)}
        with self.assertRaises(shardd.ShardError) as cm:
            st.load_state_dict(path, target)
        e = cm.exception
        self.assertEqual(e.name, "mismatch")
        for part in ("'a' has shape [3, 2] in the checkpoint but [2, 3]", "'b' is I64 in the checkpoint "
                     "but I32", "missing from the checkpoint: 'd'", "not in the state dict: 'c'",
                     "nothing was filled"):
            self.assertIn(part, e.message)
        self.assertTrue(all(bool((t == 0).all()) for t in target.values()))
        # strict=False: missing and unexpected are returned, the rest is filled.
        target = {"a": torch.zeros(3, 2), "d": torch.zeros(1)}
        keys = st.load_state_dict(path, target, strict=False)
        self.assertEqual((keys.missing_keys, keys.unexpected_keys), (["d"], ["b", "c"]))
        self.assertEqual(raw(target["a"]), raw(shardd.load(path, framework="torch")["a"]))

    def test_box_reads_match_the_strict_reader(self):
        """load_state_dict's reader (each file opened once, its boxes read in runs through small
        holes, straight into contiguous views or staged and scattered by strided copies) fills
        every kind of view with the bytes the strict reader's box read gives."""
        from shardd._load_runs import read_boxes

        sd = {"big": seeded((40, 33), torch.float16, 40), "odd.bf16": seeded((3,), torch.bfloat16, 41),
              "odd.f32": seeded((5, 3), torch.float32, 42), "step": seeded((), torch.int64, 43)}
        sd.update(("experts.%d.w" % e, seeded((4, 6), torch.bfloat16, 50 + e)) for e in range(6))
        path = os.path.join(self.d.root, "runs")
        os.makedirs(path)
        # Packed in name order, as no writer that aligns would: the F32 tensor lies 2 bytes off
        # its alignment, so it is staged through a copy of its bytes.
        header = write_packed(os.path.join(path, "model.safetensors"), sd)
        self.assertEqual(header["odd.f32"]["data_offsets"][0] % 4, 2)
        fused = torch.zeros(6, 6, 4).to(torch.bfloat16).transpose(1, 2)  # fused[e]: [4, 6], strides (1, 4)
        packed = torch.zeros(6, 4, 6, dtype=torch.bfloat16)
        fills = [("experts.%d.w" % e, fused[e], (0, 0), (4, 6)) for e in range(6)]   # one strided copy
        fills += [("experts.%d.w" % e, packed[e], (0, 0), (4, 6)) for e in range(6)]  # one preadv
        fills += [("experts.%d.w" % e, torch.zeros(2, 3, dtype=torch.bfloat16), (1, 2), (2, 3)) for e in (0, 3)]
        fills += [("big", torch.zeros(7, 33, dtype=torch.float16), (3, 0), (7, 33)),      # rows: direct
                  ("big", torch.zeros(40, 15, dtype=torch.float16), (0, 5), (40, 15)),    # columns: staged
                  ("big", torch.zeros(9, 4, dtype=torch.float16).t(), (30, 20), (4, 9)),  # into a transpose
                  ("big", torch.zeros(1, 1, dtype=torch.float16), (39, 32), (1, 1)),      # the last element
                  ("odd.f32", torch.zeros(3, 5).t(), (0, 0), (5, 3)),
                  ("odd.bf16", torch.zeros(3, dtype=torch.bfloat16), (0,), (3,)),
                  ("step", torch.zeros((), dtype=torch.int64), (), ())]
        with shardd.Checkpoint(path) as ck:
            read_boxes(ck, fills)
            for name, view, start, count in fills:
                self.assertEqual(raw(view), raw(ck.read(name, start, count, framework="torch")), (name, start))
            # A shard swapped in under its name after the open is refused, as the strict reader's
            # own reads refuse it, before a byte of it is read.
            write_packed(os.path.join(path, "other"), {k: v + 1 for k, v in sd.items()})
            os.replace(os.path.join(path, "other"), os.path.join(path, "model.safetensors"))
            with self.assertRaises(shardd.ShardError) as cm:
                read_boxes(ck, [("big", torch.zeros(40, 33, dtype=torch.float16), (0, 0), (40, 33))])
            self.assertEqual(cm.exception.name, "bad_format")
            self.assertIn("model.safetensors: replaced by another file since the checkpoint was opened",
                          cm.exception.message)


def main():
    return suite.run(__name__, lambda args: answer(worker(args), barrier=args["op"] != "kill"))


if __name__ == "__main__":
    sys.exit(main())
