#!/usr/bin/env python3
# Tests of the Python binding against a real shardd: what lands on disk is read back with a parser of our own.
"""Runs a daemon on a temporary root and saves through shardd (the package).

Environment: SHARDD_BIN (the daemon), LIBSHARDD (the library), SHARDCTL
(optional; default: beside LIBSHARDD), PYTHONPATH with client/python.
Prints "N passed, N failed" last and exits non-zero on any failure; exits
77 (skipped, for meson) when numpy is missing.

Run as `test_binding.py --worker JSON` it is one rank of the two-rank test.
"""
import json
import os
import subprocess
import sys
import threading
import time
import unittest

import suite

try:
    import numpy as np
except ImportError:
    print("numpy is not installed (Debian: python3-numpy): skipping")
    sys.exit(77)

import shardd
from binding_states import all_dtypes, two_rank_globals, two_rank_state
from shardd_daemon import WAIT, Daemon
from st_reader import as_stored, read_checkpoint, read_safetensors, without_checksum  # test_torch and test_venv take them from here too

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "train_loop.py")

D = None


def path(*parts):
    return os.path.join(D.root, *parts)


def index_of(folder):
    """The checkpoint folder's model.safetensors.index.json, parsed."""
    with open(path(folder, "model.safetensors.index.json")) as f:
        return json.load(f)


def worker(args):
    """One rank in its own process."""
    r = shardd.save(two_rank_state(args["rank"]), args["dir"], rank=args["rank"], world_size=2,
                    socket=args["socket"], metadata={"job": "two-ranks"},
                    files={"config.json": '{"ranks": 2}'}, timeout=WAIT)
    print(json.dumps(r))
    return 0


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------
class SaveTest(unittest.TestCase):
    def setUp(self):
        self.client = shardd.Client(D.socket)

    def tearDown(self):
        self.client.close()

    def assertStored(self, arrays, dtypes, name, want, dtype):
        self.assertEqual(dtypes[name], dtype, name)
        got = arrays[name]
        exp = as_stored(want)
        self.assertEqual(got.shape, exp.shape, name)
        self.assertEqual(got.dtype, exp.dtype, name)
        self.assertEqual(got.tobytes(), exp.tobytes(), name)

    def test_every_numpy_dtype_round_trips(self):
        tensors = all_dtypes()
        r = shardd.save(tensors, "dtypes/step-1", client=self.client, metadata={"step": "1"},
                        files={"config.json": '{"a": 1}\n', "raw.bin": b"\x00\xff"}, timeout=WAIT)
        self.assertEqual(r["state"], "committed")
        self.assertEqual(r["dir"], path("dtypes", "step-1"))
        self.assertEqual(r["tensors"], len(tensors))
        self.assertEqual(r["files"], 3)
        self.assertEqual(r["save"], "dtypes:step-1")
        arrays, dtypes, _, meta = read_checkpoint(path("dtypes", "step-1"))
        self.assertEqual(without_checksum(meta), {"format": "pt", "step": "1"})
        names = {"bool": "BOOL", "u8": "U8", "i8": "I8", "i16": "I16", "u16": "U16", "f16": "F16",
                 "i32": "I32", "u32": "U32", "f32": "F32", "i64": "I64", "u64": "U64", "f64": "F64",
                 "c64": "C64", "scalar": "F32", "empty": "I32", "transposed": "F32",
                 "strided": "I64", "bigendian": "F64", "nan": "F32"}
        self.assertEqual(set(arrays), set(names))
        for name, dt in names.items():
            self.assertStored(arrays, dtypes, name, tensors[name], dt)
        with open(path("dtypes", "step-1", "config.json"), "rb") as f:
            self.assertEqual(f.read(), b'{"a": 1}\n')
        with open(path("dtypes", "step-1", "raw.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00\xff")
        total = sum(os.path.getsize(path("dtypes", "step-1", fn))
                    for fn in os.listdir(path("dtypes", "step-1")))
        self.assertEqual(r["bytes"], total)

    def test_whole_tensors_go_zero_copy(self):
        # save() places every tensor by the placement rule: the daemon writes them straight
        # from the arena and copies only the header and the tensors' unaligned heads and tails.
        rng = np.random.default_rng(7)
        t = {"emb": rng.integers(0, 255, (1000, 301), dtype=np.uint8),
             "w": rng.standard_normal((257, 513)).astype(np.float32),
             "b": rng.standard_normal(77).astype(np.float16),
             "h": rng.standard_normal((300, 1000)).astype(np.float16)}
        before = self.client.status()["totals"]
        shardd.save(t, "zerocopy", client=self.client, timeout=WAIT)
        after = self.client.status()["totals"]
        direct = after["bytes_zero_copy"] - before["bytes_zero_copy"]
        copied = after["bytes_copied"] - before["bytes_copied"]
        gathered = after["bytes_gathered"] - before["bytes_gathered"]
        self.assertEqual(direct + gathered + copied, after["bytes_written"] - before["bytes_written"])
        self.assertLessEqual(copied, 4096 + 77 * 2 + 3 * 8192, (direct, copied))
        arrays, _, _, _ = read_checkpoint(path("zerocopy"))
        for name, want in t.items():
            self.assertEqual(arrays[name].tobytes(), want.tobytes(), name)
        offsets, end = shardd.place([("a", "F32", [4096], None, None, None),
                                     ("b", "U8", [5], None, None, None),
                                     ("c", "U8", [1 << 20], None, None, None)])
        # Files hold a (16 KiB), b (5 bytes), c by dtype size then name: c lies at 4096+16384+5.
        self.assertEqual(offsets[0] % 4096, 0)
        self.assertEqual((offsets[2] - (16384 + 5)) % 4096, 0)
        self.assertEqual(end, offsets[2] + (1 << 20))

    def test_dict_order_decides_the_shards(self):
        # Natural name order would give a, m, z; the dict says z, a, m.
        t = {"z": np.full(100, 1, np.float32), "a": np.full(100, 2, np.float32),
             "m": np.full(100, 3, np.float32)}
        shardd.save(t, "order", client=self.client, max_shard_size=400, timeout=WAIT)
        index = index_of("order")
        self.assertEqual(index["weight_map"], {"z": "model-00001-of-00003.safetensors",
                                               "a": "model-00002-of-00003.safetensors",
                                               "m": "model-00003-of-00003.safetensors"})
        self.assertEqual(index["metadata"]["total_size"], 1200)
        arrays, _, _, _ = read_checkpoint(path("order"))
        for k in t:
            self.assertEqual(arrays[k].tobytes(), t[k].tobytes())
        # ordered=False hands the order to the daemon: natural name order.
        shardd.save(t, "natural", client=self.client, max_shard_size=400, ordered=False, timeout=WAIT)
        wm = index_of("natural")["weight_map"]
        self.assertEqual(wm["a"], "model-00001-of-00003.safetensors")
        self.assertEqual(wm["z"], "model-00003-of-00003.safetensors")
        # Names given one index are one entry (the views of one storage): z and a, 800 bytes
        # together, stay in one file; total_parameters is what the index records.
        shardd.save(t, "shared", client=self.client, max_shard_size=400, ordered={"z": 0, "a": 0, "m": 1},
                    total_parameters=250, timeout=WAIT)
        index = index_of("shared")
        self.assertEqual(index["weight_map"], {"z": "model-00001-of-00002.safetensors",
                                               "a": "model-00001-of-00002.safetensors",
                                               "m": "model-00002-of-00002.safetensors"})
        self.assertEqual(index["metadata"]["total_parameters"], 250)
        with self.assertRaises(ValueError):
            shardd.save(t, "shared-bad", client=self.client, total_parameters=0)

    def test_two_rank_processes_save_slices(self):
        procs = [subprocess.Popen([sys.executable, __file__, "--worker",
                                   json.dumps({"rank": r, "dir": "two/step-5", "socket": D.socket})],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=2 * WAIT)
            self.assertEqual(p.returncode, 0, err.decode())
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[0]["tensors"], 6)
        arrays, dtypes, _, meta = read_checkpoint(path("two", "step-5"))
        self.assertEqual(without_checksum(meta), {"format": "pt", "job": "two-ranks"})
        g = two_rank_globals()
        want = {"embed": "F32", "proj": "I16", "norm": "F64", "bias": "U8", "flags": "BOOL",
                "cplx": "C64"}
        self.assertEqual(set(arrays), set(want))
        for name, dt in want.items():
            self.assertStored(arrays, dtypes, name, g[name], dt)
        with open(path("two", "step-5", "config.json")) as f:
            self.assertEqual(f.read(), '{"ranks": 2}')

    def test_overlapping_slices_fail_for_both_ranks(self):
        w = np.arange(12, dtype=np.float32).reshape(4, 3)
        errors = [None, None]

        def rank(r, box):
            try:
                with shardd.Client(D.socket) as c:
                    shardd.save({"w": shardd.Slice(w[box[0]:box[1]], (4, 3), (box[0], 0))},
                                "overlap", client=c, rank=r, world_size=2, timeout=WAIT)
            except shardd.ShardError as e:
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(0, (0, 3))),
                   threading.Thread(target=rank, args=(1, (2, 4)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * WAIT)
        for e in errors:
            self.assertIsInstance(e, shardd.ShardError)
            self.assertEqual(e.name, "overlap")
            self.assertEqual(e.code, -9)
            self.assertIn("'w'", e.message)
        self.assertFalse(os.path.exists(path("overlap")))

    def test_errors_carry_name_code_and_message(self):
        # A slice that leaves a gap fails at wait, naming the tensor and element.
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save({"lm_head.weight": shardd.Slice(np.zeros((2, 3), np.float32), (4, 3), (0, 0))},
                        "gap", client=self.client, timeout=WAIT)
        e = cm.exception
        self.assertEqual((e.code, e.name), (-10, "gap"))
        self.assertIn("tensor 'lm_head.weight'", e.message)
        self.assertEqual(str(e), "gap: " + e.message)
        self.assertFalse(os.path.exists(path("gap")))

        shardd.save({"x": np.zeros(1)}, "taken", client=self.client, timeout=WAIT)
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save({"x": np.ones(1)}, "taken", client=self.client, timeout=WAIT)
        self.assertEqual((cm.exception.name, cm.exception.code), ("exists", -11))
        self.assertIn("'taken'", cm.exception.message)
        # overwrite replaces it atomically.
        shardd.save({"x": np.ones(1)}, "taken", client=self.client, overwrite=True, timeout=WAIT)
        self.assertEqual(read_checkpoint(path("taken"))[0]["x"].tolist(), [1.0])

        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save({"x": np.zeros(1)}, "../escape", client=self.client, timeout=WAIT)
        self.assertEqual(cm.exception.name, "bad_path")

        with self.assertRaises(shardd.ShardError) as cm:
            self.client.put_inline("nope", "w", "F32", [1], b"\0\0\0\0")
        self.assertEqual(cm.exception.name, "no_such_save")

        with self.assertRaises(shardd.ShardError) as cm:
            shardd.Client(os.path.join(D.tmp, "no-such.sock"))
        self.assertEqual(cm.exception.name, "connect_failed")
        self.assertIn("no-such.sock", cm.exception.message)

        # The client stays usable after errors.
        self.assertEqual(self.client.status()["saves"], [])

    def test_failed_put_aborts_the_save(self):
        # The daemon refuses a box outside the shape; save() aborts so no other rank waits forever.
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save({"ok": np.zeros(2), "bad": shardd.Slice(np.zeros(2), (3,), (2,))}, "bad-box",
                        client=self.client, save_id="bad-box", rank=0, world_size=2, timeout=WAIT)
        self.assertEqual(cm.exception.name, "invalid_argument")
        with self.assertRaises(shardd.ShardError) as cm:
            self.client.wait("bad-box", timeout=WAIT)
        self.assertEqual(cm.exception.name, "aborted")

    def test_local_refusals(self):
        with self.assertRaises(TypeError):
            shardd.save({"x": np.zeros(2, np.float128)}, "f128", client=self.client)
        with self.assertRaises(TypeError):
            shardd.save({"x": np.array([object()])}, "obj", client=self.client)
        with self.assertRaises(ValueError):
            shardd.save({"x": shardd.Slice(np.zeros((2, 2)), (4,), (0,))}, "dims", client=self.client)
        with self.assertRaises(TypeError):
            shardd.dtype_name("float128")
        # Nothing reached the daemon.
        self.assertEqual(self.client.status()["saves"], [])
        self.assertFalse(os.path.exists(path("f128")))

    def test_streamed_save(self):
        c = self.client
        a = c.arena(1 << 20)
        w = np.arange(256 * 512, dtype=np.float32).reshape(256, 512)  # 512 KiB
        n = np.linspace(0, 1, 7).astype(np.float16)
        c.begin("stream", "stream", rank=0, world_size=1)
        c.put_deferred("stream", "w", "F32", [256, 512], a, 0, index=0)
        c.put_deferred("stream", "n", np.float16, [7], a, w.nbytes, index=1)
        c.declared("stream")
        with self.assertRaises(shardd.ShardError) as cm:
            c.put_inline("stream", "late", "U8", [1], b"x")
        self.assertEqual(cm.exception.name, "bad_state")
        a.view(np.float32, (256, 512))[:] = w
        c.ready("stream", a, w.nbytes)
        a.view(np.float16, (7,), offset=w.nbytes)[:] = n
        c.seal("stream")
        r = c.wait("stream", timeout=WAIT)
        self.assertEqual((r["files"], r["tensors"]), (1, 2))
        arrays, _, _, _ = read_safetensors(path("stream", "model.safetensors"))
        self.assertTrue(np.array_equal(arrays["w"], w))
        self.assertTrue(np.array_equal(arrays["n"], n))
        a.close()

    def test_put_many(self):
        c = self.client
        a = c.arena(4096)
        c.begin("many", "many", rank=0, world_size=1)
        with self.assertRaises(shardd.ShardError) as cm:
            c.put_many("many", a, [("ok", "U8", [4], 0), ("__metadata__", "U8", [4], 8)])
        self.assertEqual((cm.exception.name, cm.exception.index), ("invalid_argument", 1))
        c.put_many("many", a, [("w", np.float32, [2, 2], 64, [0, 0], [1, 2]),
                               ("w", "F32", [2, 2], 72, [1, 0], [1, 2], 0)], deferred=True)
        a.array[0:4] = [1, 2, 3, 4]
        a.view(np.float32, (4,), offset=64)[:] = [1, 2, 3, 4]
        c.seal("many")
        r = c.wait("many", timeout=WAIT)
        self.assertEqual(r["tensors"], 2)
        arrays, _, _, _ = read_safetensors(path("many", "model.safetensors"))
        self.assertEqual(arrays["ok"].tolist(), [1, 2, 3, 4])
        self.assertEqual(arrays["w"].tolist(), [[1, 2], [3, 4]])
        a.close()

    def test_many_tensors_go_in_puts_lines(self):
        # More slices than one puts line holds (2048), whole tensors and boxes mixed, read back byte for byte.
        rng = np.random.default_rng(33)
        tensors = {"model.layers.%d.mlp.experts.%d.w.weight" % (i // 64, i % 64):
                   rng.standard_normal(1 + i % 7, dtype=np.float32) for i in range(4500)}
        tensors["boxed"] = shardd.Slice(np.arange(6, dtype=np.int32).reshape(2, 3), (2, 3), (0, 0))
        r = shardd.save(tensors, "many-lines", client=self.client, max_shard_size="64KB", timeout=WAIT)
        self.assertEqual(r["tensors"], 4501)
        got = read_checkpoint(path("many-lines"))[0]
        self.assertEqual(set(got), set(tensors))
        for name, v in tensors.items():
            want = v.array if isinstance(v, shardd.Slice) else v
            self.assertTrue(np.array_equal(got[name], want), name)
        # A slice the daemon refuses deep in the third line: named with its place, the save aborted.
        bad = dict(list(tensors.items())[:4200])
        bad["__metadata__"] = np.zeros(1, np.float32)
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save(bad, "many-bad", client=self.client, timeout=WAIT)
        e = cm.exception
        self.assertEqual((e.name, e.index), ("invalid_argument", 4200))
        self.assertIn("__metadata__", e.message)
        self.assertRegex(e.message, r"^slices\[\d+\]: ")  # its place in its line
        with self.assertRaises(shardd.ShardError) as cm:
            self.client.wait("many-bad", timeout=WAIT)
        self.assertEqual(cm.exception.name, "aborted")
        self.assertFalse(os.path.exists(path("many-bad")))

    def test_low_level_calls_and_status(self):
        c = self.client
        a = c.arena(64)
        self.assertEqual(a.size, 64)
        # A sealed memfd passed to the daemon: nothing in /dev/shm.
        self.assertTrue(a.name.startswith("memfd:shardd-"), a.name)
        self.assertFalse(os.path.exists("/dev/shm/" + a.name))
        v = a.view(np.float32, (4,))
        v[:] = [1, 2, 3, 4]
        self.assertEqual(bytes(a.buffer[:4]), np.float32(1).tobytes())
        a.array[16:24] = np.arange(8, dtype=np.uint8)

        c.begin("low", "low/step-1", rank=0, world_size=1, prefix="weights", metadata={"k": "v"})
        c.put("low", "w", "F32", [2, 2], a, 0, index=0)
        c.put("low", "u", np.uint8, [8], a, 16, index=1)
        c.put_copy("low", "h", np.float16, [3], a, 32, np.array([1, 2, 3], np.float16), index=2)
        c.put_inline("low", "e", "BF16", [2, 3], b"\x80\x3f\x00\x40\x40\x40", start=[0, 0],
                     count=[1, 3])
        c.put_inline("low", "e", "BF16", [2, 3], bytearray(b"\x80\x40\xa0\x40\xc0\x40"),
                     start=[1, 0], count=[1, 3])
        c.file("low", "config.json", '{"model_type": "demo"}')
        st = c.status()
        (s,) = [s for s in st["saves"] if s["save"] == "low"]
        self.assertEqual((s["state"], s["dir"], s["tensors"], s["files"]), ("open", "low/step-1", 4, 1))
        self.assertGreaterEqual(st["clients"], 1)
        self.assertIn("saves_committed", st["totals"])

        with self.assertRaises(shardd.ShardError) as cm:
            c.put("low", "far", "F32", [4], a, 56)
        self.assertEqual(cm.exception.name, "out_of_range")
        c.seal("low")
        c.wait_released("low", WAIT)
        r = c.wait("low", timeout=WAIT)
        self.assertEqual((r["files"], r["tensors"]), (2, 4))
        arrays, dtypes, meta, _ = read_safetensors(path("low", "step-1", "weights.safetensors"))
        self.assertEqual(without_checksum(meta), {"format": "pt", "k": "v"})
        self.assertEqual(arrays["w"].tolist(), [[1, 2], [3, 4]])
        self.assertEqual(arrays["u"].tolist(), list(range(8)))
        self.assertEqual(arrays["h"].tolist(), [1, 2, 3])
        # bfloat16 1..6 as raw bits.
        self.assertEqual(arrays["e"].tolist(), [[0x3f80, 0x4000, 0x4040], [0x4080, 0x40a0, 0x40c0]])
        self.assertEqual(dtypes["e"], "BF16")
        # A second wait is answered from the daemon's memory of finished saves.
        self.assertEqual(c.wait("low", timeout=WAIT), r)
        a.close()
        with self.assertRaises(ValueError):
            a.buffer

    def test_wait_timeout_then_abort(self):
        c = self.client
        c.begin("half", "half", rank=0, world_size=2)
        c.put_inline("half", "w", "U8", [1], b"\x07")
        c.seal("half")
        t0 = time.monotonic()
        with self.assertRaises(shardd.ShardError) as cm:
            c.wait("half", timeout=0.2)
        self.assertEqual(cm.exception.name, "timeout")
        self.assertGreaterEqual(time.monotonic() - t0, 0.15)
        with shardd.Client(D.socket) as other:
            other.abort("half")
        with self.assertRaises(shardd.ShardError) as cm:
            c.wait("half", timeout=WAIT)
        self.assertEqual(cm.exception.name, "aborted")

    def test_save_whose_wait_times_out_is_aborted(self):
        # Rank 1 never comes: save(timeout=) gives up and leaves no save open in the daemon.
        t0 = time.monotonic()
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.save({"w": np.arange(4, dtype=np.float32)}, "gaveup", save_id="gaveup", rank=0,
                        world_size=2, client=self.client, timeout=1)
        self.assertEqual(cm.exception.name, "timeout")
        self.assertIn("aborted it", str(cm.exception))
        print("python save(timeout=1) ended the save after %.2f s" % (time.monotonic() - t0))
        self.assertEqual([s["save"] for s in self.client.status()["saves"]], [])
        self.assertFalse(os.path.exists(path("gaveup")))
        with self.assertRaises(shardd.ShardError) as cm:
            self.client.wait("gaveup", timeout=WAIT)
        self.assertEqual(cm.exception.name, "aborted")

    def test_join_timeout_given_at_begin(self):
        c = self.client
        c.begin("alone", "alone", rank=0, world_size=2, join_timeout=1)
        c.seal("alone")
        with self.assertRaises(shardd.ShardError) as cm:
            c.wait("alone", timeout=WAIT)
        self.assertEqual(cm.exception.name, "timeout")
        self.assertIn("save 'alone' (dir 'alone'): rank 1 of 2 never began within join_timeout 1 s",
                      str(cm.exception))
        with shardd.Client(D.socket) as late:
            with self.assertRaises(shardd.ShardError) as cm:
                late.begin("alone", "alone", rank=1, world_size=2)
            self.assertEqual(cm.exception.name, "save_failed")
        self.assertFalse(os.path.exists(path("alone")))

    def test_arena_reuse_grow_and_pending_saves(self):
        c = self.client
        a = c.arena(16)
        big = np.arange(100000, dtype=np.float64)
        p = shardd.save({"big": big}, "grow/1", client=c, arena=a, wait=False, timeout=WAIT)
        self.assertIsInstance(p, shardd.PendingSave)
        self.assertGreaterEqual(a.size, big.nbytes)
        self.assertEqual(a.last_save, "grow:1")
        size = a.size
        # The next save reuses the memory, waiting for the first save's release itself.
        q = shardd.save({"big": -big}, "grow/2", client=c, arena=a, wait=False, timeout=WAIT)
        self.assertEqual(a.size, size)
        p.wait_released(WAIT)
        self.assertEqual(p.wait(WAIT)["tensors"], 1)
        self.assertEqual(q.wait(WAIT)["tensors"], 1)
        self.assertEqual(read_checkpoint(path("grow", "1"))[0]["big"].tobytes(), big.tobytes())
        self.assertEqual(read_checkpoint(path("grow", "2"))[0]["big"].tobytes(), (-big).tobytes())
        with self.assertRaises(ValueError):
            shardd.save({"x": big}, "grow/3", client=shardd.Client(D.socket), arena=a)
        a.close()

    def test_arenas_are_sealed_memfds_passed_to_the_daemon(self):
        # The default arena: a memfd sealed against shrinking, sent with attach.
        c = self.client
        a = c.arena(1 << 16)
        self.assertTrue(a.name.startswith("memfd:shardd-%d-" % os.getpid()), a.name)
        fdlinks = [os.readlink("/proc/%d/fd/%s" % (D.proc.pid, f)) for f in os.listdir("/proc/%d/fd" % D.proc.pid)]
        self.assertIn("/" + a.name + " (deleted)", fdlinks, "the daemon holds no descriptor of the arena")
        w = np.arange(4096, dtype=np.float32).reshape(64, 64) * 3 - 7
        b = (np.arange(1000) % 251).astype(np.uint8)
        shardd.save({"w": w, "b": b}, "memfd/1", client=c, arena=a)
        arrays, _, _, _ = read_checkpoint(path("memfd", "1"))
        self.assertEqual(arrays["w"].tobytes(), as_stored(w).tobytes())
        self.assertEqual(arrays["b"].tobytes(), b.tobytes())
        a.close()
        # SHARDD_ARENA=shm: a named POSIX shm segment attached by name, same bytes.
        os.environ["SHARDD_ARENA"] = "shm"
        try:
            n = c.arena(1 << 16)
        finally:
            del os.environ["SHARDD_ARENA"]
        self.assertTrue(n.name.startswith("/shardd-"), n.name)
        self.assertTrue(os.path.exists("/dev/shm" + n.name))
        shardd.save({"w": w}, "memfd/2", client=c, arena=n)
        self.assertEqual(read_checkpoint(path("memfd", "2"))[0]["w"].tobytes(), as_stored(w).tobytes())
        n.close()

    def test_views_keep_the_segment_until_dropped(self):
        a = self.client.arena(4096)
        name = a.name

        def mapped():  # a memfd arena shows in our maps as "/memfd:NAME (deleted)"
            with open("/proc/self/maps") as f:
                return any(l.rstrip().endswith("/" + name + " (deleted)") for l in f)

        v = a.view(np.int32, (8,))
        v[:] = 5
        a.close()
        self.assertTrue(a.closed)
        # The view still reads mapped memory; the memory goes with the last view.
        self.assertEqual(v.sum(), 40)
        self.assertTrue(mapped())
        del v
        self.assertFalse(mapped())
        # An arena survives its client's close as plain memory.
        c = shardd.Client(D.socket)
        b = c.arena(100)
        c.close()
        b.array[:] = 1
        self.assertEqual(int(b.array.sum()), 100)
        b.close()

    def test_torchrun_env_and_defaults(self):
        env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
               "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
               "MASTER_PORT": "29500"}
        self.assertEqual(shardd.torchrun_env(env), {
            "rank": 3, "world_size": 8, "local_rank": 1, "local_world_size": 2, "nnodes": 4,
            "node_rank": 1, "master_addr": "10.0.0.1", "master_port": 29500})
        env.update(NODE_RANK="2", NNODES="5")
        t = shardd.torchrun_env(env)
        self.assertEqual((t["node_rank"], t["nnodes"]), (2, 5))
        self.assertEqual(shardd.torchrun_env({})["rank"], None)
        with self.assertRaises(ValueError):
            shardd.torchrun_env({"RANK": "zero"})

        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "NNODES", "GROUP_WORLD_SIZE",
                                                "NODE_RANK", "MASTER_ADDR", "SHARDD_LEADER",
                                                "SHARDD_PEER_PORT")}
        try:
            os.environ.update(RANK="0", WORLD_SIZE="1")
            r = shardd.save({"x": np.ones(3, np.int8)}, "from-env", client=self.client, timeout=WAIT)
            self.assertEqual(r["tensors"], 1)
            # Spanning nodes: an incomplete environment is refused before the daemon hears of it.
            for k in ("NODE_RANK", "MASTER_ADDR", "SHARDD_LEADER", "SHARDD_PEER_PORT"):
                os.environ.pop(k, None)
            os.environ.update(RANK="1", WORLD_SIZE="4", NNODES="2")
            for missing, add in (("NODE_RANK", {"NODE_RANK": "0"}),
                                 ("MASTER_ADDR", {"SHARDD_PEER_PORT": "70000"}),
                                 ("SHARDD_PEER_PORT", {"SHARDD_PEER_PORT": "7078"})):
                with self.assertRaises(shardd.ShardError) as cm:
                    shardd.save({"x": np.ones(3)}, "multi", client=self.client)
                self.assertEqual(cm.exception.name, "invalid_argument")
                self.assertIn(missing, cm.exception.message)
                os.environ.update(add)
            self.assertNotIn("multi", [s["save"] for s in self.client.status()["saves"]])
            os.environ["MASTER_ADDR"] = "10.0.0.1"
            self.assertEqual(shardd.nodes_from_env(), {
                "rank": 1, "world_size": 4, "nnodes": 2, "node_rank": 0, "leader": "10.0.0.1:7078"})
            os.environ.update(SHARDD_LEADER="[::1]:9", NODE_RANK="3")
            with self.assertRaises(shardd.ShardError) as cm:
                shardd.nodes_from_env()
            self.assertIn("NODE_RANK=3", cm.exception.message)
            os.environ["NODE_RANK"] = "1"
            self.assertEqual(shardd.nodes_from_env()["leader"], "[::1]:9")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_default_save_id(self):
        self.assertEqual(shardd.default_save_id("run1/step-100"), "run1:step-100")
        odd = shardd.default_save_id("run 1/step:100")
        self.assertRegex(odd, r"^run_1:step:100-[0-9a-f]{16}$")
        self.assertNotEqual(odd, shardd.default_save_id("run_1/step_100"))
        self.assertLessEqual(len(shardd.default_save_id("x" * 1000)), 128)
        self.assertFalse(shardd.default_save_id(".hidden").startswith("."))

    def test_bfloat16_through_ml_dtypes(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes is not installed")
        x = np.array([1, 2, 3, -0.5], dtype=ml_dtypes.bfloat16)
        shardd.save({"x": x}, "mlbf16", client=self.client, timeout=WAIT)
        arrays, dtypes, _, _ = read_checkpoint(path("mlbf16"))
        self.assertStored(arrays, dtypes, "x", x, "BF16")

    def test_torch_tensors(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        bf = torch.tensor([1.0, 2.0, -3.5], dtype=torch.bfloat16)
        cplx = torch.tensor([1 + 2j, -3j], dtype=torch.complex64)
        t = {
            "w": w.t(),  # non-contiguous
            "bf": bf,
            "bf_scalar": torch.tensor(1.5, dtype=torch.bfloat16),
            "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
            "i": torch.tensor([1, -2], dtype=torch.int64),
            "b": torch.tensor([True, False]),
            "half": shardd.Slice(torch.ones(2, dtype=torch.float16), (2,), (0,)),
            "grad": torch.ones(2, requires_grad=True),
            "conj": cplx.conj(),  # a lazy view: the saved bytes must be the conjugate
        }
        shardd.save(t, "torch", client=self.client, timeout=WAIT)
        arrays, dtypes, _, _ = read_checkpoint(path("torch"))
        self.assertEqual(dtypes, {"w": "F32", "bf": "BF16", "bf_scalar": "BF16", "empty": "BF16",
                                  "i": "I64", "b": "BOOL", "half": "F16", "grad": "F32",
                                  "conj": "C64"})
        self.assertEqual(arrays["w"].tolist(), w.t().tolist())
        self.assertEqual(arrays["bf"].tolist(), [0x3f80, 0x4000, 0xc060])
        self.assertEqual(arrays["bf_scalar"].shape, ())
        self.assertEqual(int(arrays["bf_scalar"]), 0x3fc0)
        self.assertEqual(arrays["empty"].shape, (0, 3))
        self.assertEqual(arrays["i"].tolist(), [1, -2])
        self.assertEqual(arrays["b"].tolist(), [True, False])
        self.assertEqual(arrays["half"].tolist(), [1.0, 1.0])
        self.assertEqual(arrays["grad"].tolist(), [1.0, 1.0])
        self.assertEqual(arrays["conj"].tolist(), [1 - 2j, 3j])
        with self.assertRaises(TypeError):
            shardd.save({"x": torch.zeros(2, dtype=torch.complex128)}, "c128", client=self.client)

    def test_train_loop_example(self):
        env = dict(os.environ)
        for k in ("RANK", "WORLD_SIZE", "NNODES", "GROUP_WORLD_SIZE"):
            env.pop(k, None)
        p = subprocess.run([sys.executable, EXAMPLE, "--socket", D.socket, "--steps", "9",
                            "--every", "2", "--dir", "loop"], env=env, capture_output=True,
                           timeout=4 * WAIT)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = p.stdout.decode()
        self.assertEqual(out.count("committed"), 4, out)
        dirs = sorted(os.listdir(path("loop")))
        self.assertEqual(dirs, ["step-000002", "step-000004", "step-000006", "step-000008"])
        shardctl = os.environ.get("SHARDCTL") or os.path.join(
            os.path.dirname(os.environ.get("LIBSHARDD", "")), "shardctl")
        for d in dirs:
            v = subprocess.run([shardctl, "verify", path("loop", d)], capture_output=True,
                               timeout=WAIT)
            self.assertEqual(v.returncode, 0, v.stdout.decode() + v.stderr.decode())
            self.assertTrue(v.stdout.decode().startswith("ok: "))
            arrays, dtypes, _, meta = read_checkpoint(path("loop", d))
            step = int(d.split("-")[1])
            self.assertEqual(int(arrays["step"]), step)
            self.assertEqual(meta["step"], str(step))
            self.assertEqual(arrays["linear.weight"].shape, (48, 64))
        # Training moved the weights between checkpoints.
        w2 = read_checkpoint(path("loop", dirs[0]))[0]["linear.weight"]
        w8 = read_checkpoint(path("loop", dirs[-1]))[0]["linear.weight"]
        self.assertFalse(np.array_equal(w2, w8))

    def test_delete_and_keep_last(self):
        import pathlib
        w = {"w": np.arange(4, dtype=np.float32)}
        for step in range(1, 5):
            shardd.save(w, "keep/step-%d" % step, client=self.client, keep_last=2, timeout=WAIT)
            # A status round trip orders us behind the daemon's keep_last pass.
            self.client.status()
        # A pruned folder leaves its name at once; its hidden remains are removed off the loop.
        visible = [n for n in os.listdir(path("keep")) if not n.startswith(".shardd-del-")]
        self.assertEqual(sorted(visible), ["step-3", "step-4"])
        with self.assertRaises(ValueError):
            shardd.save(w, "keep/bad", client=self.client, keep_last=0)
        self.client.delete("keep/step-3")
        self.assertFalse(os.path.exists(path("keep", "step-3")))
        shardd.delete(pathlib.Path("keep/step-4"), socket=D.socket)
        self.assertFalse(os.path.exists(path("keep", "step-4")))
        with self.assertRaises(shardd.ShardError) as cm:
            self.client.delete("keep/step-4")
        self.assertEqual(cm.exception.name, "not_found")
        self.assertIn("keep/step-4", str(cm.exception))
        os.makedirs(path("keep", "mine"))
        with self.assertRaises(shardd.ShardError) as cm:
            self.client.delete("keep/mine")
        self.assertEqual(cm.exception.name, "not_a_checkpoint")
        self.assertTrue(os.path.isdir(path("keep", "mine")))
        with self.assertRaises(shardd.ShardError) as cm:
            self.client.delete("../etc")
        self.assertEqual(cm.exception.name, "bad_path")

    def test_missing_library_is_reported(self):
        env = dict(os.environ, LIBSHARDD=os.path.join(D.tmp, "libnothing.so"))
        p = subprocess.run([sys.executable, "-c", "import shardd; shardd.Client('/x')"], env=env,
                           capture_output=True, timeout=WAIT)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"cannot load libshardd", p.stderr)
        # Importing alone does not need the library.
        p = subprocess.run([sys.executable, "-c", "import shardd; print(shardd.torchrun_env({}))"],
                           env=env, capture_output=True, timeout=WAIT)
        self.assertEqual(p.returncode, 0, p.stderr.decode())

    def test_error_table_matches_the_header(self):
        names = shardd.error_names()
        self.assertEqual(names[-10], "gap")
        self.assertEqual(names[-25], "connect_failed")
        self.assertEqual(len(names), len(set(names.values())))


def start():
    global D
    D = Daemon()
    return [D]


def main():
    return suite.run(__name__, worker, daemons=start)

if __name__ == "__main__":
    sys.exit(main())
