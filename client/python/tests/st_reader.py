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


def data_crc32c(path):
    """The CRC-32C of a safetensors file's data section (every byte after its header), as shardd records it:
    8 lowercase hex digits, from the crc32c package (an implementation independent of shardd's)."""
    import crc32c

    with open(path, "rb") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little"))
        crc = 0
        for block in iter(lambda: f.read(16 << 20), b""):
            crc = crc32c.crc32c(block, crc)
    return "%08x" % crc
