#!/usr/bin/env python3
# Reading checkpoints back (shardd.load, Checkpoint, load_slices) and the Pythonic save API, against a real shardd.
"""Saves through a real daemon, reads back through libshardd's strict reader.

Environment as test_binding.py (SHARDD_BIN, LIBSHARDD, PYTHONPATH with
client/python). Prints "N passed, N failed" last; exits 77 without numpy.
"""
import os
import pathlib
import struct
import sys
import time
import typing
import unittest

import suite

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_binding import WAIT, Daemon, all_dtypes, as_stored  # noqa: E402  (exits 77 without numpy)

import numpy as np  # noqa: E402

import shardd  # noqa: E402

D = None


def path(*parts):
    return os.path.join(D.root, *parts)


def write_st(folder, name, header_json, ndata):
    """A hand-made .safetensors file: length, JSON header, ndata bytes."""
    os.makedirs(folder, exist_ok=True)
    js = header_json.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + bytes(ndata))


def random_box(rng, shape):
    start = [int(rng.integers(0, s + 1)) for s in shape]
    count = [int(rng.integers(0, s - b + 1)) for s, b in zip(shape, start)]
    return start, count


def numpy_box(a, start, count):
    return a[tuple(slice(b, b + c) for b, c in zip(start, count))]


class LoadTest(unittest.TestCase):
    def setUp(self):
        self.client = shardd.Client(D.socket)

    def tearDown(self):
        self.client.close()

    def test_every_numpy_dtype_round_trips_through_path_and_size_string(self):
        arrays = all_dtypes()
        # A pathlib.Path destination and a size string that forces several shards.
        res = shardd.save(arrays, pathlib.Path("alltypes"), client=self.client, max_shard_size="0.3KB",
                          timeout=WAIT)
        self.assertGreater(res["files"], 1)
        back = shardd.load(pathlib.Path(path("alltypes")))
        self.assertEqual(sorted(back), sorted(arrays))
        for name, a in arrays.items():
            want = as_stored(a)
            got = back[name]
            self.assertEqual(got.shape, want.shape, name)
            self.assertEqual(got.dtype, want.dtype, name)
            self.assertEqual(got.tobytes(), want.tobytes(), name)
        with shardd.Checkpoint(path("alltypes")) as ck:
            self.assertEqual(len(ck), len(arrays))
            self.assertEqual(ck.info("f32"), shardd.TensorInfo("f32", "F32", (8, 2), 64, ck.info("f32").file))
            self.assertTrue(ck.info("f32").file.startswith("model-0000"))
        # names= reads only those.
        self.assertEqual(sorted(shardd.load(path("alltypes"), names=["u8", "c64"])), ["c64", "u8"])

    def test_torch_dtypes_and_raw_bits(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        t = {"bf": torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16) / 3,
             "h": torch.linspace(-2, 2, 6, dtype=torch.float16),
             "b": torch.tensor([True, False, True]),
             "i": torch.arange(10, dtype=torch.int64).reshape(2, 5)}
        shardd.save(t, "torchtypes", client=self.client, timeout=WAIT)
        back = shardd.load(path("torchtypes"), framework="torch")
        for name, v in t.items():
            self.assertEqual(back[name].dtype, v.dtype, name)
            self.assertTrue(torch.equal(back[name], v), name)
        box = shardd.load(path("torchtypes"), names=["bf"], boxes={"bf": ((1, 1), (2, 2))},
                          framework="torch")["bf"]
        self.assertTrue(torch.equal(box, t["bf"][1:3, 1:3]))
        # numpy has no bfloat16 without ml_dtypes: a clear TypeError, and the raw bits on request.
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(TypeError, "BF16 has no numpy dtype without ml_dtypes"):
                shardd.load(path("torchtypes"), names=["bf"])
        with shardd.Checkpoint(path("torchtypes")) as ck:
            bits = np.empty((3, 4), np.uint16)
            ck.read_into("bf", bits)
            self.assertEqual(bits.tobytes(), t["bf"].view(torch.int16).numpy().tobytes())

    def test_boxes_of_every_rank_match_numpy_slicing(self):
        rng = np.random.default_rng(5)
        full = {"r0": np.array(7.5, np.float64),
                "r1": rng.standard_normal(23).astype(np.float32),
                "r2": rng.integers(0, 1000, (9, 11)).astype(np.int32),
                "r3": rng.integers(0, 255, (4, 6, 5)).astype(np.uint8),
                "r4": rng.standard_normal((3, 4, 5, 6)).astype(np.float16)}
        shardd.save(full, "boxes", client=self.client, timeout=WAIT)
        with shardd.Checkpoint(path("boxes")) as ck:
            for name, a in full.items():
                for _ in range(60):
                    start, count = random_box(rng, a.shape)
                    got = ck.read(name, start, count)
                    self.assertEqual(got.tobytes(), numpy_box(a, start, count).tobytes(),
                                     "%s %s %s" % (name, start, count))
                    self.assertEqual(got.shape, tuple(count))
        boxes = {"r2": ((2, 3), (5, 8)), "r4": ((1, 0, 2, 0), (2, 4, 1, 6))}
        got = shardd.load(path("boxes"), boxes=boxes)
        self.assertEqual(got["r2"].tobytes(), full["r2"][2:7, 3:11].tobytes())
        self.assertEqual(got["r4"].tobytes(), full["r4"][1:3, :, 2:3, :].tobytes())
        self.assertEqual(got["r1"].tobytes(), full["r1"].tobytes())
        with self.assertRaisesRegex(ValueError, "boxes name 'r2', 'r4', which names= leaves out"):
            shardd.load(path("boxes"), names=["r1"], boxes=boxes)
        with self.assertRaisesRegex(KeyError, "'nope' is not in"):
            shardd.load(path("boxes"), names=["nope"])

    def test_reshard_two_ranks_into_four(self):
        rng = np.random.default_rng(11)
        full = {"w": rng.standard_normal((8, 6)).astype(np.float32),
                "b": rng.standard_normal(8).astype(np.float32)}
        shardd.save(full, "tp2", client=self.client, timeout=WAIT)
        # Each of four new ranks asks for its quarter of rows of each tensor.
        pending = []
        for rank in range(4):
            mine = shardd.load_slices(path("tp2"), [("w", (2 * rank, 0), (2, 6)), ("b", (2 * rank,), (2,))])
            self.assertIsInstance(mine["w"], shardd.Slice)
            self.assertEqual(mine["w"].shape, (8, 6))
            self.assertEqual(mine["w"].start, (2 * rank, 0))
            pending.append(shardd.save(mine, "tp4", save_id="tp4", rank=rank, world_size=4, wait=False,
                                       socket=D.socket, timeout=WAIT))
        for p in pending:
            self.assertEqual(p.result(WAIT)["tensors"], 2)
        back = shardd.load(path("tp4"))
        for name in full:
            self.assertEqual(back[name].tobytes(), full[name].tobytes())
        with self.assertRaisesRegex(ValueError, "asked for twice"):
            shardd.load_slices(path("tp2"), [("b", (0,), (1,)), ("b", (1,), (1,))])

    def test_hostile_files_refused_with_the_readers_codes(self):
        bad = os.path.join(D.tmp, "hostile")
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.load(bad)
        self.assertEqual(cm.exception.name, "io_error")
        write_st(bad, "model.safetensors", '{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}}', 10)
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.load(bad)
        self.assertEqual(cm.exception.name, "bad_format")
        self.assertIn("tensor 'w': data_offsets [0,10] but F32[3] needs 12 bytes", cm.exception.message)
        write_st(bad, "model.safetensors", '{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}', 20)
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.Checkpoint(pathlib.Path(bad) / "model.safetensors")
        self.assertEqual(cm.exception.name, "bad_format")
        self.assertIn("trailing bytes", cm.exception.message)
        write_st(bad, "model.safetensors", '{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', 24)
        with shardd.Checkpoint(bad) as ck:
            with self.assertRaises(shardd.ShardError) as cm:
                ck.read("w", (1, 0), (2, 3))
            self.assertEqual(cm.exception.name, "invalid_argument")
            self.assertIn("tensor 'w'", cm.exception.message)
            with self.assertRaisesRegex(ValueError, "2 dimensions"):
                ck.read("w", (0,), (1,))
            with self.assertRaisesRegex(KeyError, "'nope' is not in"):
                ck.read("nope")
            with self.assertRaisesRegex(ValueError, "framework"):
                ck.read("w", framework="jax")
            with self.assertRaises(shardd.ShardError) as cm:
                ck.read_into("w", np.empty(5, np.float32))
            self.assertIn("holds 24 bytes but the buffer has 20", cm.exception.message)
        with self.assertRaisesRegex(ValueError, "closed"):
            ck.read("w")

    def test_stale_foreign_and_missing_shards_refused_with_bad_file_set(self):
        full = {"layer.%d.w" % i: np.full(100, i, np.float32) for i in range(6)}
        shardd.save(full, "stale", client=self.client, max_shard_size=1000, timeout=WAIT,
                    files={"config.json": b"{}"})
        folder = pathlib.Path(path("stale"))
        names = sorted(p.name for p in folder.iterdir())
        self.assertEqual(names, ["config.json"] + ["model-%05d-of-00003.safetensors" % k for k in (1, 2, 3)]
                         + ["model.safetensors.index.json"])
        # save_pretrained's other files beside the shards are normal
        (folder / "generation_config.json").write_text("{}")
        self.assertEqual(sorted(shardd.load(folder)), sorted(full))
        first = (folder / "model-00001-of-00003.safetensors").read_bytes()
        cases = [("model-00002-of-00004.safetensors", "not in the weight_map of model.safetensors.index.json"),
                 ("model.safetensors", "stale or foreign")]
        for stray, said in cases:
            (folder / stray).write_bytes(first)
            for opener in (shardd.load, shardd.Checkpoint):
                with self.assertRaises(shardd.ShardError) as cm:
                    opener(folder)
                self.assertEqual(cm.exception.name, "bad_file_set")
                self.assertIn(stray, cm.exception.message)
                self.assertIn(said, cm.exception.message)
            (folder / stray).unlink()
        (folder / "model-00003-of-00003.safetensors").unlink()
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.load(folder)
        self.assertEqual(cm.exception.name, "bad_file_set")
        self.assertIn("model-00003-of-00003.safetensors, which does not exist", cm.exception.message)

    # ---- the Pythonic save API ------------------------------------------------

    def test_size_strings_as_huggingface_parses_them(self):
        self.assertEqual(shardd.parse_size("5GB"), 5 * 10**9)
        self.assertEqual(shardd.parse_size("500MiB"), 500 * 2**20)
        self.assertEqual(shardd.parse_size("1kb"), 1000)
        self.assertEqual(shardd.parse_size(" 2 TiB "), 2 * 2**40)
        self.assertEqual(shardd.parse_size("1.5GB"), 1500000000)
        self.assertEqual(shardd.parse_size(4096), 4096)
        self.assertIsNone(shardd.parse_size(None))
        for bad in ("5", "5XB", "GB", "-1GB", "5 G B"):
            with self.assertRaises(ValueError, msg=bad):
                shardd.parse_size(bad)
        for bad in (5.0, True, b"5GB"):
            with self.assertRaises(TypeError, msg=repr(bad)):
                shardd.parse_size(bad)

    def test_values_that_are_not_arrays_are_refused(self):
        with self.assertRaisesRegex(TypeError, "tensor 'epoch' is a int, not a numpy array"):
            shardd.save({"w": np.ones(2), "epoch": 3}, "notarrays", client=self.client)
        with self.assertRaisesRegex(TypeError, "list"):
            shardd.save({"w": [1.0, 2.0]}, "notarrays", client=self.client)
        self.assertEqual(self.client.status()["saves"], [])
        self.assertFalse(os.path.exists(path("notarrays")))
        # A numpy scalar is a 0-d array.
        shardd.save({"s": np.float32(1.5)}, "npscalar", client=self.client, timeout=WAIT)
        self.assertEqual(shardd.load(path("npscalar"))["s"].item(), 1.5)

    def test_tied_weights_are_refused_views_that_do_not_overlap_are_not(self):
        embed = np.arange(12, dtype=np.float32).reshape(3, 4)
        with self.assertRaisesRegex(ValueError, "'embed' and 'lm_head' share memory"):
            shardd.save({"embed": embed, "lm_head": embed}, "tied", client=self.client)
        with self.assertRaisesRegex(ValueError, "share memory"):
            shardd.save({"a": embed[:, 1:3], "b": embed[1]}, "tied", client=self.client)
        self.assertFalse(os.path.exists(path("tied")))
        # Columns of one fused matrix interleave in memory but share no element.
        fused = np.arange(24, dtype=np.float32).reshape(4, 6)
        shardd.save({"q": fused[:, 0:2], "k": fused[:, 2:4], "v": fused[:, 4:6]}, "fused",
                    client=self.client, timeout=WAIT)
        back = shardd.load(path("fused"))
        self.assertEqual(back["k"].tobytes(), np.ascontiguousarray(fused[:, 2:4]).tobytes())
        try:
            import torch
        except ImportError:
            return
        w = torch.ones(4, 4)
        with self.assertRaisesRegex(ValueError, "'w' and 'w2' share memory"):
            shardd.save({"w": w, "w2": w.view(16)}, "tied", client=self.client)
        shardd.save({"w": w, "w2": w.clone()}, "untied", client=self.client, timeout=WAIT)

    def test_pending_save_is_future_like_with_progress(self):
        seen = []
        big = np.arange(200000, dtype=np.float64)
        p = shardd.save({"big": big}, "future", client=self.client, wait=False, timeout=WAIT,
                        progress=lambda w, t: seen.append((w, t)))
        res = p.result(WAIT)
        self.assertTrue(p.done())
        self.assertIsNone(p.exception())
        self.assertIs(p.result(), res)
        self.assertEqual(seen[-1], (res["bytes"], res["bytes"]))
        self.assertTrue(all(w <= t for w, t in seen), seen)
        self.assertTrue(all(a[0] <= b[0] for a, b in zip(seen, seen[1:])), seen)
        # done() polls without blocking until the commit arrives.
        r = shardd.save({"y": np.ones(4)}, "polled", client=self.client, wait=False)
        deadline = time.monotonic() + WAIT
        while not r.done():
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.005)
        self.assertEqual(r.result(0)["tensors"], 1)
        # A save that cannot end yet (a second rank never comes), then fails.
        half = []
        q = shardd.save({"x": np.ones(3)}, "half", rank=0, world_size=2, socket=D.socket, wait=False,
                        progress=lambda w, t: half.append((w, t)))
        self.assertFalse(q.done())
        with self.assertRaises(TimeoutError):
            q.result(0.2)
        with self.assertRaises(TimeoutError):
            q.exception(0.1)
        self.assertEqual(half, [], "progress while a rank has not declared: the total is not known yet")
        self.client.abort("half")
        e = q.exception(WAIT)
        self.assertIsInstance(e, shardd.ShardError)
        self.assertEqual(e.name, "aborted")
        self.assertTrue(q.done())
        with self.assertRaises(shardd.ShardError):
            q.result()
        with self.assertRaises(TypeError):
            shardd.save({"x": np.ones(1)}, "p", client=self.client, progress=3)

    def test_a_header_of_200k_tensors_opens_and_answers_lookups(self):
        # Zero-size tensors: the header is the whole file. Each TensorInfo is made on asking, so
        # opening costs the C check; every answer still comes from the checked table.
        n = 200000
        folder = os.path.join(D.tmp, "many-tensors")
        write_st(folder, "model.safetensors",
                 "{" + ",".join('"t%06d":{"dtype":"%s","shape":[0,%d],"data_offsets":[0,0]}'
                                % (i, "F32" if i % 2 else "BF16", i % 7) for i in range(n)) + "}", 0)
        with shardd.Checkpoint(folder) as ck:
            self.assertEqual(len(ck), n)
            self.assertEqual(ck.info("t123457"), shardd.TensorInfo("t123457", "F32", (0, 123457 % 7), 0,
                                                                   "model.safetensors"))
            self.assertEqual(ck.info("t000000").dtype, "BF16")
            self.assertIn("t199999", ck)
            for absent in ("t200000", "t12345", "", "t000001\0", 7, None):
                self.assertNotIn(absent, ck)
            with self.assertRaises(KeyError) as cm:
                ck.info("t200000")
            self.assertIn("'t200000' is not in", str(cm.exception))
            names = ck.names()
            self.assertEqual(names, ["t%06d" % i for i in range(n)])
            self.assertEqual(next(iter(ck)), "t000000")
            self.assertEqual(ck.read("t199999").shape, (0, 199999 % 7))
            self.assertIn("%d tensors" % n, repr(ck))
        self.assertEqual(len(ck), n)
        with self.assertRaises(ValueError) as cm:
            ck.info("t000002")
        self.assertIn("the checkpoint is closed", str(cm.exception))

    def test_type_hints_resolve(self):
        for fn in (shardd.save, shardd.load, shardd.load_slices, shardd.Checkpoint.read,
                   shardd.PendingSave.result, shardd.parse_size):
            typing.get_type_hints(fn)
        self.assertIn("progress", typing.get_type_hints(shardd.save))


class ArenaPoolTest(unittest.TestCase):
    """save() with neither client= nor arena= borrows this process's pooled connection and two
    arenas, reusing an arena only once the daemon has released the save that read it."""

    def lanes(self):
        from shardd import _arena_pool
        return _arena_pool._pools.get(_arena_pool._key(D.socket), [])

    def test_arenas_are_reused_double_buffered_and_bytes_stay_right(self):
        shardd.release_arenas()
        w = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
        shardd.save({"w": w}, "pool/0", socket=D.socket, timeout=WAIT)
        (lane,) = self.lanes()
        first = [a.name for a in lane.arenas]
        shardd.save({"w": w + 1}, "pool/1", socket=D.socket, timeout=WAIT)
        self.assertEqual([a.name for a in lane.arenas], first, "a released arena is taken again")
        # Back to back without waiting: never more than two arenas, and no save sees another's bytes.
        pending = [shardd.save({"w": w * k}, "pool/b%d" % k, socket=D.socket, wait=False) for k in range(2, 8)]
        self.assertLessEqual(len(lane.arenas), 2)
        self.assertEqual(len(self.lanes()), 1)
        for k, p in zip(range(2, 8), pending):
            p.wait(WAIT)
            self.assertEqual(shardd.load(path("pool", "b%d" % k))["w"].tobytes(), (w * k).tobytes(), k)
        # A larger save grows an arena; one process playing two ranks of one save gets two lanes.
        shardd.save({"w": np.concatenate([w, w])}, "pool/big", socket=D.socket, timeout=WAIT)
        self.assertGreaterEqual(max(a.size for a in lane.arenas), 2 * w.nbytes)
        p0 = shardd.save({"w": shardd.Slice(w[:10], (20,), (0,))}, "pool/r", rank=0, world_size=2,
                         socket=D.socket, wait=False)
        shardd.save({"w": shardd.Slice(w[10:20], (20,), (10,))}, "pool/r", rank=1, world_size=2,
                    socket=D.socket, timeout=WAIT)
        p0.wait(WAIT)
        self.assertEqual(len(self.lanes()), 2)
        self.assertEqual(shardd.load(path("pool", "r"))["w"].tobytes(), w[:20].tobytes())
        # A rank that puts nothing leaves its arena unmarked, so the pool cannot see its lane is a
        # rank of the save until the commit; the daemon refuses the begin there ('already is
        # rank') and the library takes another lane (before: bad_state for the second rank).
        p1 = shardd.save({}, "pool/e", rank=1, world_size=2, save_id="pool-e", socket=D.socket, wait=False)
        shardd.save({"w": w[:20]}, "pool/e", rank=0, world_size=2, save_id="pool-e", socket=D.socket,
                    timeout=WAIT)
        p1.wait(WAIT)
        self.assertEqual(shardd.load(path("pool", "e"))["w"].tobytes(), w[:20].tobytes())

    def test_wait_false_hands_over_in_the_background_and_wait_raises_a_refusal(self):
        # wait=False returns once the bytes are in the arena; the puts and the seal go on in a
        # thread. A slice the daemon refuses there is the PendingSave's exception (the save is
        # aborted, nothing published), and the pooled lane serves the next save.
        shardd.release_arenas()
        w = np.arange(1000, dtype=np.float32)
        p = shardd.save({"w": w, "__metadata__": np.zeros(1, np.float32)}, "pool/refused", socket=D.socket,
                        wait=False)
        with self.assertRaises(shardd.ShardError) as cm:
            p.wait(WAIT)
        self.assertEqual((cm.exception.name, cm.exception.index), ("invalid_argument", 1))
        self.assertIn("__metadata__", cm.exception.message)
        self.assertIs(p.exception(0), cm.exception)
        self.assertTrue(p.done())
        self.assertFalse(os.path.exists(path("pool", "refused")))
        q = shardd.save({"w": w}, "pool/after", socket=D.socket, wait=False)
        w[:] = -1  # copied before save() returned
        self.assertEqual(q.result(WAIT)["tensors"], 1)
        self.assertEqual(shardd.load(path("pool", "after"))["w"].tobytes(), np.arange(1000, dtype=np.float32).tobytes())
        self.assertEqual(len(self.lanes()), 1)

    def test_a_restarted_daemon_and_a_forked_child(self):
        import shutil
        import tempfile

        w = np.arange(1000, dtype=np.int64)
        tmp = tempfile.mkdtemp(prefix="shardd-pool-")
        try:
            d = Daemon(tmp=tmp)
            shardd.save({"w": w}, "before", socket=d.socket, timeout=WAIT)
            # The kept connection dies with its daemon; the next save connects anew, once.
            d.stop()
            d = Daemon(tmp=tmp)
            shardd.save({"w": -w}, "after", socket=d.socket, timeout=WAIT)
            self.assertEqual(shardd.load(os.path.join(d.root, "after"))["w"].tobytes(), (-w).tobytes())
            # A forked child never touches its parent's connection or arenas.
            pid = os.fork()
            if pid == 0:
                try:
                    shardd.save({"w": w * 3}, "child", socket=d.socket, timeout=WAIT)
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            self.assertEqual(os.waitpid(pid, 0)[1], 0)
            shardd.save({"w": w * 4}, "parent", socket=d.socket, timeout=WAIT)
            self.assertEqual(shardd.load(os.path.join(d.root, "child"))["w"].tobytes(), (w * 3).tobytes())
            self.assertEqual(shardd.load(os.path.join(d.root, "parent"))["w"].tobytes(), (w * 4).tobytes())
            self.assertEqual(d.stop(), 0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

def start():
    global D
    D = Daemon()
    return [D]


def main():
    return suite.run(__name__, daemons=start)

if __name__ == "__main__":
    sys.exit(main())
