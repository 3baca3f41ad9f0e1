# An independent safetensors reader for the binding's tests: what shardd wrote, parsed by code that shares none of it.
import json
import os
import struct

import numpy as np

# 8-byte little-endian header length, JSON header, then the data; dtypes straight from the format's definition.
ST_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8",
    "C64": "<c8",
    # No numpy type: compared as raw little-endian bit patterns.
    "BF16": "<u2", "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E4M3FNUZ": np.uint8,
    "F8_E5M2FNUZ": np.uint8, "F8_E8M0": np.uint8,
}


def read_safetensors(path):
    """({name: numpy array}, {name: dtype string}, metadata, [names in data order])."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    arrays, dtypes = {}, {}
    end = 0
    for name, t in header.items():
        b, e = t["data_offsets"]
        dt = np.dtype(ST_DTYPES[t["dtype"]])
        count = int(np.prod(t["shape"], dtype=np.int64))
        assert e - b == count * dt.itemsize, (name, t)
        arrays[name] = np.frombuffer(data[b:e], dtype=dt).reshape(t["shape"])
        dtypes[name] = t["dtype"]
        end = max(end, e)
    assert end == len(data), "%s: %d data bytes, header covers %d" % (path, len(data), end)
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    return arrays, dtypes, meta, order


def read_checkpoint(folder):
    """({name: array}, {name: dtype}, {name: file}, metadata of the first shard)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    arrays, dtypes, where, meta = {}, {}, {}, None
    for fn in files:
        a, d, m, _ = read_safetensors(os.path.join(folder, fn))
        assert not set(a) & set(arrays), "tensor in two files"
        arrays.update(a)
        dtypes.update(d)
        where.update({k: fn for k in a})
        meta = m if meta is None else meta
    return arrays, dtypes, where, meta


def as_stored(a):
    """The array as a safetensors reader sees it: little-endian, raw bits for types numpy lacks."""
    a = np.array(a, order="C")  # ascontiguousarray would turn a 0-d array into 1-d
    if a.dtype.kind == "V":
        return a.view("<u%d" % a.dtype.itemsize) if a.dtype.itemsize > 1 else a.view(np.uint8)
    return a.astype(a.dtype.newbyteorder("<"))


def without_checksum(meta):
    """A single file's __metadata__ less the data checksum shardd records there (8 hex digits, checked)."""
    meta = dict(meta)
    crc = meta.pop("shardd_data_crc32c", None)
    if crc is None or len(crc) != 8 or any(c not in "0123456789abcdef" for c in crc):
        raise AssertionError("no data checksum of 8 lowercase hex digits in __metadata__: %r" % (crc,))
    return meta


CHECKSUM_KEY = "shardd_data_crc32c"
_CRC32C_TABLE = []


def crc32c(data, crc=0):
    """The standard CRC-32C (Castagnoli) of bytes, extending crc: the crc32c package where it is
    installed (the project's venv: an implementation independent of shardd's), else a table in pure
    Python (about a second for a few MiB)."""
    try:
        import crc32c as fast
        return fast.crc32c(data, crc)
    except ImportError:
        pass
    if not _CRC32C_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC32C_TABLE.append(c)
    t, c = _CRC32C_TABLE, crc ^ 0xFFFFFFFF
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def data_crc32c(path):
    """The CRC-32C of a safetensors file's data section (every byte after its header), as shardd records it."""
    with open(path, "rb") as f:
        f.seek(8 + struct.unpack("<Q", f.read(8))[0])
        crc = 0
        for block in iter(lambda: f.read(16 << 20), b""):
            crc = crc32c(block, crc)
    return crc


def recorded_checksums(folder):
    """{shard file: CRC} as shardd recorded them (the index's metadata, or a single file's
    __metadata__); {} when none are."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            sums = json.load(f)["metadata"].get(CHECKSUM_KEY, {})
        return {k: int(v, 16) for k, v in sums.items()}
    (name,) = [n for n in os.listdir(folder) if n.endswith(".safetensors")]
    with open(os.path.join(folder, name), "rb") as f:
        meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0])).get("__metadata__", {})
    return {name: int(meta[CHECKSUM_KEY], 16)} if CHECKSUM_KEY in meta else {}


def checked_checksums(folder):
    """{shard file: 8 hex digits} as shardd recorded them, one for every shard, each asserted equal
    to the CRC-32C of that file's data section on disk."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    rec = recorded_checksums(folder)
    assert sorted(rec) == files, "%s: checksums recorded for %s, shards %s" % (folder, sorted(rec), files)
    out = {}
    for fn in files:
        got = data_crc32c(os.path.join(folder, fn))
        assert rec[fn] == got, "%s/%s: recorded checksum %08x, its data section's CRC-32C is %08x" % (
            folder, fn, rec[fn], got)
        out[fn] = "%08x" % got
    return out
