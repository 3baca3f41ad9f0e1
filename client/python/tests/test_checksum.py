#!/usr/bin/env python3
# Recorded data checksums: saved by a real daemon, checked against an independent CRC-32C, and damage named by shardctl verify --deep and load(verify=True).
"""Checkpoints saved through a real shardd (one file and several), their
recorded CRC-32C compared with the `crc32c` package's (a table-driven
CRC-32C here when it is missing) over each file's data section; then copies
are damaged (flipped bytes, a cut file, a grown file, a shard swapped in from
another checkpoint of the same model, an edited index) and each damage must
be named by `shardctl verify --deep`, `shardd.load(..., verify=True)` and
`Checkpoint.verify()`. Checkpoints without checksums (a daemon with
--checksums=off, a file written by hand) are refused by verify=True and load
without it. With torch, transformers and safetensors (the venv):
from_pretrained and safe_open read shardd's checkpoints with checksums, and
load_state_dict(verify=True) passes a good one and refuses a damaged one
before filling anything.

Environment as test_binding.py (SHARDD_BIN, SHARDCTL, LIBSHARDD, PYTHONPATH).
Prints the corruption counts and "N passed, N failed" last.
"""
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import suite

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_binding import WAIT, Daemon  # noqa: E402  (exits 77 without numpy)

import numpy as np  # noqa: E402

import shardd  # noqa: E402
from st_reader import CHECKSUM_KEY as KEY, crc32c  # noqa: E402  (the crc32c package, else a table in pure Python)
from st_reader import data_crc32c as data_crc, recorded_checksums as recorded  # noqa: E402

try:
    import torch
    import shardd.torch as st
except ImportError:
    torch = None

INDEX = "model.safetensors.index.json"
F = ["model-%05d-of-00003.safetensors" % i for i in (1, 2, 3)]
D = None       # the daemon under test, checksums on (the default)
D_OFF = None   # one started with --checksums=off
COUNTS = {"tried": 0, "caught": 0}


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def shardctl(*args):
    p = subprocess.run([os.environ["SHARDCTL"], *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def flip(path, at):
    """Flips one bit of the byte at data offset `at` (negative: from the end of the file)."""
    n, _ = header(path)
    with open(path, "r+b") as f:
        off = os.path.getsize(path) + at if at < 0 else 8 + n + at
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([b ^ 0x40]))


def weights(seed):
    rng = np.random.default_rng(seed)
    return {"layer.%d.weight" % i: rng.standard_normal((64, 64)).astype(np.float32) for i in range(6)}


class ChecksumTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="shardd-cksum-")
        # 16 KiB tensors, 40 KB shards: two tensors a file, three files.
        cls.w1, cls.w2 = weights(1), weights(2)
        shardd.save(cls.w1, "multi", socket=D.socket, max_shard_size="40KB", timeout=WAIT)
        shardd.save(cls.w2, "multi-other", socket=D.socket, max_shard_size="40KB", timeout=WAIT)
        shardd.save(cls.w1, "single", socket=D.socket, timeout=WAIT)
        shardd.save(cls.w1, "off", socket=D_OFF.socket, max_shard_size="40KB", timeout=WAIT)
        cls.multi = os.path.join(D.root, "multi")
        cls.other = os.path.join(D.root, "multi-other")
        cls.single = os.path.join(D.root, "single")
        cls.off = os.path.join(D_OFF.root, "off")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def copy(self, src, name):
        dst = os.path.join(self.tmp, name)
        shutil.copytree(src, dst)
        return dst

    # -------------------------------------------------------------------- #
    # What is recorded
    # -------------------------------------------------------------------- #

    def test_oracle_is_the_standard_crc32c(self):
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)

    def test_recorded_values_are_the_data_sections_crc32c(self):
        self.assertEqual(sorted(n for n in os.listdir(self.multi) if n.endswith(".safetensors")), F)
        sums = recorded(self.multi)
        self.assertEqual(sorted(sums), F)
        for name in F:
            self.assertEqual(sums[name], data_crc(os.path.join(self.multi, name)), name)
            # The shards themselves carry none: the index is the record.
            self.assertNotIn(KEY, header(os.path.join(self.multi, name))[1].get("__metadata__", {}))
        with open(os.path.join(self.multi, INDEX)) as f:
            meta = json.load(f)["metadata"]
        self.assertEqual(meta["total_size"], 6 * 64 * 64 * 4)
        self.assertTrue(all(len(v) == 8 and v == v.lower() for v in meta[KEY].values()), meta[KEY])
        single = recorded(self.single)
        self.assertEqual(list(single), ["model.safetensors"])
        self.assertEqual(single["model.safetensors"], data_crc(os.path.join(self.single, "model.safetensors")))

    def test_good_checkpoints_pass_every_check(self):
        for folder in (self.multi, self.single, os.path.join(self.single, "model.safetensors")):
            rc, out, err = shardctl("verify", "--deep", folder)
            self.assertEqual(rc, 0, err)
            self.assertIn("ok: %s: " % folder, out)
            self.assertIn("checksums: %s: " % folder, out)
            self.assertIn("match", out)
            got = shardd.load(folder, verify=True)
            for k, v in self.w1.items():
                np.testing.assert_array_equal(got[k], v)
            with shardd.Checkpoint(folder, verify=True) as ck:
                ck.verify()
        rc, out, _ = shardctl("verify", "--deep", self.multi)
        for name in F:
            self.assertIn("  %s: ok crc32c %08x" % (name, recorded(self.multi)[name]), out)
        sl = shardd.load_slices(self.multi, [("layer.3.weight", (8, 0), (4, 64))], verify=True)
        np.testing.assert_array_equal(sl["layer.3.weight"].array, self.w1["layer.3.weight"][8:12])

    # -------------------------------------------------------------------- #
    # Damage, each named by every checker
    # -------------------------------------------------------------------- #

    def expect_caught(self, path, code, *frags):
        """shardctl verify --deep, load(verify=True) and Checkpoint(verify=True) all refuse path
        with code, each message holding every fragment."""
        for how in ("shardctl", "load", "Checkpoint"):
            COUNTS["tried"] += 1
            if how == "shardctl":
                rc, out, err = shardctl("verify", "--deep", path)
                self.assertEqual(rc, 1, out + err)
                line = next((ln for ln in err.splitlines() if ln.startswith("invalid: %s: %s: " % (path, code))), None)
                self.assertIsNotNone(line, err)
                msg = line
            else:
                with self.assertRaises(shardd.ShardError) as cm:
                    if how == "load":
                        shardd.load(path, verify=True)
                    else:
                        shardd.Checkpoint(path, verify=True)
                self.assertEqual(cm.exception.name, code, str(cm.exception))
                msg = cm.exception.message
            for frag in frags:
                self.assertIn(frag, msg, how)
            COUNTS["caught"] += 1

    def test_a_flipped_byte_in_file_2(self):
        ck = self.copy(self.multi, "flip2")
        want = recorded(ck)[F[1]]
        flip(os.path.join(ck, F[1]), 1000)
        got = data_crc(os.path.join(ck, F[1]))
        self.assertNotEqual(got, want)
        self.expect_caught(ck, "bad_checksum",
                           "%s: data CRC-32C is %08x but the index records %08x (the file changed after it was saved"
                           % (F[1], got, want))
        # The plain checks read headers only, so they pass: that is what --deep and verify are for.
        self.assertEqual(shardctl("verify", ck)[0], 0)
        loaded = shardd.load(ck)
        self.assertFalse(all(np.array_equal(loaded[k], self.w1[k]) for k in self.w1))

    def test_flips_anywhere_in_any_file(self):
        rng = np.random.default_rng(7)
        for i in range(4):
            ck = self.copy(self.multi, "anyflip%d" % i)
            name = F[int(rng.integers(0, 3))]
            at = -1 if i == 0 else 0 if i == 1 else int(rng.integers(0, 32768))
            flip(os.path.join(ck, name), at)
            self.expect_caught(ck, "bad_checksum", name + ": data CRC-32C is ")

    def test_a_truncated_file(self):
        ck = self.copy(self.multi, "cut")
        p = os.path.join(ck, F[2])
        os.truncate(p, os.path.getsize(p) - 100)
        self.expect_caught(ck, "bad_format", F[2] + ": ", "the file is truncated")
        # Found by the plain check too: the header no longer fits the file.
        rc, _, err = shardctl("verify", ck)
        self.assertEqual(rc, 1)
        self.assertIn("bad_format: %s: " % F[2], err)

    def test_a_grown_file(self):
        ck = self.copy(self.multi, "grown")
        with open(os.path.join(ck, F[0]), "ab") as f:
            f.write(b"\0" * 16)
        self.expect_caught(ck, "bad_format", F[0] + ": 16 trailing bytes after the last tensor")

    def test_a_shard_swapped_in_from_another_checkpoint_of_the_model(self):
        ck = self.copy(self.multi, "swapped")
        a, b = os.path.join(ck, F[1]), os.path.join(self.other, F[1])
        # Same header byte for byte, same size: only the data tells them apart.
        with open(a, "rb") as fa, open(b, "rb") as fb:
            n = header(a)[0]
            self.assertEqual(fa.read(8 + n), fb.read(8 + n))
        self.assertEqual(os.path.getsize(a), os.path.getsize(b))
        shutil.copyfile(b, a)
        self.assertEqual(shardctl("verify", ck)[0], 0)
        self.expect_caught(ck, "bad_checksum",
                           "%s: data CRC-32C is %08x but the index records %08x"
                           % (F[1], recorded(self.other)[F[1]], recorded(self.multi)[F[1]]),
                           "swapped in from another checkpoint")

    def test_an_edited_index_record(self):
        ck = self.copy(self.multi, "edited")
        ix = os.path.join(ck, INDEX)
        with open(ix) as f:
            doc = json.load(f)
        doc["metadata"][KEY][F[0]] = "%08x" % (int(doc["metadata"][KEY][F[0]], 16) ^ 1)
        with open(ix, "w") as f:
            json.dump(doc, f, indent=2)
        self.expect_caught(ck, "bad_checksum", F[0] + ": data CRC-32C is ")
        doc["metadata"][KEY][F[0]] = "not-hex!"
        with open(ix, "w") as f:
            json.dump(doc, f, indent=2)
        self.expect_caught(ck, "bad_format", INDEX, F[0], "'not-hex!' is not 8 hex digits")

    def test_a_flipped_byte_in_the_single_file(self):
        ck = self.copy(self.single, "single-flip")
        p = os.path.join(ck, "model.safetensors")
        flip(p, 5)
        for path in (ck, p):
            self.expect_caught(path, "bad_checksum", "model.safetensors: data CRC-32C is ",
                               "but its __metadata__ records %08x" % recorded(self.single)["model.safetensors"])

    def test_damage_after_open_is_seen_by_the_open_checkpoint(self):
        ck = self.copy(self.multi, "after-open")
        with shardd.Checkpoint(ck) as c:
            c.verify()
            # Written in place: the same file, so the damage is seen.
            flip(os.path.join(ck, F[2]), 3)
            COUNTS["tried"] += 1
            with self.assertRaises(shardd.ShardError) as cm:
                c.verify()
            self.assertEqual(cm.exception.name, "bad_checksum")
            self.assertIn(F[2], cm.exception.message)
            COUNTS["caught"] += 1
            # A file replaced by rename: no longer the file whose header was checked, so neither
            # read nor verified (the checkpoint holds no shard open between calls).
            shutil.copyfile(os.path.join(self.other, F[0]), os.path.join(ck, "x.tmp"))
            os.replace(os.path.join(ck, "x.tmp"), os.path.join(ck, F[0]))
            for call in (c.verify, lambda: c.read("layer.0.weight")):
                COUNTS["tried"] += 1
                with self.assertRaises(shardd.ShardError) as cm:
                    call()
                self.assertEqual(cm.exception.name, "bad_format")
                self.assertIn(F[0] + ": replaced by another file since the checkpoint was opened",
                              cm.exception.message)
                COUNTS["caught"] += 1
        self.expect_caught(ck, "bad_checksum", F[0] + ": data CRC-32C is ")

    # -------------------------------------------------------------------- #
    # Checkpoints that record none
    # -------------------------------------------------------------------- #

    def expect_unrecorded(self, path, what):
        self.assertEqual(recorded(path if os.path.isdir(path) else os.path.dirname(path)), {})
        with self.assertRaises(shardd.ShardError) as cm:
            shardd.load(path, verify=True)
        self.assertEqual(cm.exception.name, "bad_checksum")
        self.assertIn("%s records no checksums (written without them, or not by shardd)" % what,
                      cm.exception.message)
        got = shardd.load(path)
        self.assertEqual(sorted(got), sorted(self.w1))
        rc, out, err = shardctl("verify", "--deep", path)
        self.assertEqual(rc, 0, err)
        self.assertIn("no checksums recorded: %s: every data byte was read" % path, out)
        self.assertIn("ok: %s: " % path, out)

    def test_a_daemon_with_checksums_off_records_none(self):
        self.expect_unrecorded(self.off, INDEX)
        with open(os.path.join(self.off, INDEX)) as f:
            self.assertNotIn(KEY, json.load(f)["metadata"])

    def test_a_file_written_by_hand_records_none(self):
        folder = os.path.join(self.tmp, "byhand")
        os.makedirs(folder)
        hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
        for k in sorted(self.w1):
            b = self.w1[k].tobytes()
            hdr[k] = {"dtype": "F32", "shape": [64, 64], "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        js = json.dumps(hdr).encode()
        js += b" " * (-len(js) % 8)
        with open(os.path.join(folder, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))
        self.expect_unrecorded(folder, "model.safetensors")
        np.testing.assert_array_equal(shardd.load(folder)["layer.5.weight"], self.w1["layer.5.weight"])

    def test_deep_is_only_for_verify(self):
        rc, _, err = shardctl("inspect", "--deep", self.multi)
        self.assertEqual(rc, 2)
        self.assertIn("--deep goes with verify", err)

    # -------------------------------------------------------------------- #
    # Other readers of the same files, and torch
    # -------------------------------------------------------------------- #

    def test_what_is_not_a_regular_file_is_refused_at_once_by_every_reader(self):
        """A FIFO (or a symlink to one), a socket or /dev/zero where a shard or the index should be: every
        reader refuses it as bad_format without blocking in open(); an alarm turns a hang into a failure."""
        import signal
        import socket as socketmod

        def fifo(p):
            os.mkfifo(p)

        def fifo_link(p):
            os.mkfifo(p + ".fifo")
            os.symlink(os.path.basename(p) + ".fifo", p)

        def dev_zero(p):
            os.symlink("/dev/zero", p)

        socks = []

        def unix_socket(p):
            s = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
            s.bind(p)
            socks.append(s)

        readers = [("load", lambda ck: shardd.load(ck)), ("Checkpoint", lambda ck: shardd.Checkpoint(ck).close())]
        if torch is not None:
            readers.append(("load_state_dict",
                            lambda ck: st.load_state_dict(ck, {k: torch.zeros(64, 64) for k in self.w1})))
            readers.append(("StorageReader", lambda ck: st.StorageReader(ck).read_metadata()))
        old = signal.signal(signal.SIGALRM, lambda *a: None)  # interrupts a blocked open() with EINTR
        try:
            for victim in (F[1], INDEX):
                for kind, make in (("fifo", fifo), ("fifo-link", fifo_link), ("dev-zero", dev_zero),
                                   ("socket", unix_socket)):
                    ck = self.copy(self.multi, "special-%s-%s" % (kind, victim))
                    os.unlink(os.path.join(ck, victim))
                    make(os.path.join(ck, victim))
                    for args in (("verify", ck), ("verify", "--deep", ck)):
                        rc, out, err = shardctl(*args)  # its timeout fails a hang
                        self.assertNotEqual(rc, 0, (kind, victim, args))
                        self.assertIn("bad_format", out + err, (kind, victim, args))
                        self.assertIn("%s: not a regular file" % victim, out + err, (kind, victim, args))
                    for name, read in readers:
                        signal.alarm(20)
                        with self.assertRaises(shardd.ShardError, msg=(kind, victim, name)) as cm:
                            read(ck)
                        signal.alarm(0)
                        self.assertEqual(cm.exception.name, "bad_format", (kind, victim, name, cm.exception.message))
                        self.assertIn("%s: not a regular file" % victim, cm.exception.message, (kind, victim, name))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
            for s in socks:
                s.close()

    @unittest.skipIf(torch is None, "needs torch")
    def test_load_state_dict_verify(self):
        sd = {k: torch.zeros(64, 64) for k in self.w1}
        st.load_state_dict(self.multi, sd, verify=True)
        for k, v in self.w1.items():
            self.assertTrue(torch.equal(sd[k], torch.from_numpy(v)), k)
        ck = self.copy(self.multi, "sd-flip")
        flip(os.path.join(ck, F[1]), 77)
        fresh = {k: torch.full((64, 64), 7.0) for k in self.w1}
        COUNTS["tried"] += 1
        with self.assertRaises(shardd.ShardError) as cm:
            st.load_state_dict(ck, fresh, verify=True)
        self.assertEqual(cm.exception.name, "bad_checksum")
        self.assertIn(F[1], cm.exception.message)
        COUNTS["caught"] += 1
        self.assertTrue(all(bool((v == 7.0).all()) for v in fresh.values()), "filled before the check")
        st.load_state_dict(ck, fresh)  # without verify the damage goes unseen
        with self.assertRaises(shardd.ShardError) as cm:
            st.load_state_dict(self.off, {k: torch.zeros(64, 64) for k in self.w1}, verify=True)
        self.assertEqual(cm.exception.name, "bad_checksum")

    @unittest.skipIf(torch is None, "needs torch")
    def test_safe_open_reads_the_single_file_with_its_checksum(self):
        try:
            from safetensors import safe_open
        except ImportError:
            self.skipTest("needs safetensors")
        with safe_open(os.path.join(self.single, "model.safetensors"), "np") as h:
            self.assertEqual(h.metadata()[KEY], "%08x" % recorded(self.single)["model.safetensors"])
            self.assertEqual(sorted(h.keys()), sorted(self.w1))
            for k in h.keys():
                np.testing.assert_array_equal(h.get_tensor(k), self.w1[k])
        for name in F:
            with safe_open(os.path.join(self.multi, name), "np") as h:
                for k in h.keys():
                    np.testing.assert_array_equal(h.get_tensor(k), self.w1[k])

    @unittest.skipIf(torch is None, "needs torch")
    def test_transformers_loads_a_checkpoint_with_checksums(self):
        try:
            import transformers
            from transformers import AutoModelForCausalLM, LlamaConfig
        except ImportError:
            self.skipTest("needs transformers")
        transformers.logging.set_verbosity_error()
        cfg = LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        torch.manual_seed(5)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        st.save_pretrained(model, "hf-llama", max_shard_size="60KB", socket=D.socket, timeout=WAIT)
        folder = os.path.join(D.root, "hf-llama")
        sums = recorded(folder)
        shards = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
        self.assertGreater(len(shards), 1)
        self.assertEqual(sorted(sums), shards)
        for name in shards:
            self.assertEqual(sums[name], data_crc(os.path.join(folder, name)), name)
        rc, out, err = shardctl("verify", "--deep", folder)
        self.assertEqual(rc, 0, err)
        loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
        ids = torch.arange(24).reshape(2, 12) % 200
        with torch.no_grad():
            self.assertTrue(torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits))
        torch.manual_seed(6)
        fresh = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        st.load_state_dict(folder, fresh.state_dict(), verify=True)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(input_ids=ids).logits, fresh(input_ids=ids).logits))


def start():
    global D, D_OFF
    D = Daemon()
    D_OFF = Daemon(args=["--checksums=off"])
    return [D, D_OFF]


def counts():
    print("oracle: %s" % ("the crc32c package" if importlib.util.find_spec("crc32c") else
                          "a table-driven CRC-32C (no crc32c package)"))
    print("checksum: %d corruptions tried, %d caught" % (COUNTS["tried"], COUNTS["caught"]))
    return int(COUNTS["tried"] != COUNTS["caught"])


def main():
    return suite.run(__name__, daemons=start, after=counts)

if __name__ == "__main__":
    sys.exit(main())
