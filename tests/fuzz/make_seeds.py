#!/usr/bin/env python3
"""Regenerates the hand-made seed corpora in tests/fuzz/corpus/ (run from anywhere)."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- request
# Byte 0: bit 7 set -> small line cap (8 + 4 * (b & 0x3f)); the rest is the stream.
session = b"""{"op":"hello","id":1,"proto":1}
{"op":"attach","id":2,"shm":"/shardd-demo"}
{"op":"begin","id":3,"save":"step-1","dir":"demo/step-1","rank":0,"world_size":1,"metadata":{"step":"1"}}
{"op":"put","id":4,"save":"step-1","name":"lm_head.weight","dtype":"F32","shape":[2,2],"region":1,"offset":0,"index":1}
{"op":"put","id":5,"save":"step-1","name":"embed.weight","dtype":"BF16","shape":[2,3],"start":[0,0],"count":[1,3],"data":"gD8AQEBA","index":0}
{"op":"put","id":6,"save":"step-1","name":"embed.weight","dtype":"BF16","shape":[2,3],"start":[1,0],"count":[1,3],"data":"gECgQMBA"}
{"op":"file","id":8,"save":"step-1","path":"config.json","data":"eyJtb2RlbF90eXBlIjoiZGVtbyJ9Cg=="}
{"op":"status","id":9}
{"op":"seal","id":10,"save":"step-1"}
{"op":"wait","id":11,"save":"step-1"}
{"op":"detach","id":12,"region":1}
{"op":"abort","id":17,"save":"step-2"}
"""
put("request", "session", b"\x00" + session)
put("request", "session-crlf", b"\x00" + session.replace(b"\n", b"\r\n"))
put("request", "session-small-cap", b"\x9f" + session)
lines = {
    "hello-bad-proto": b'{"op":"hello","proto":2,"id":[1,{"a":null}]}',
    "begin-full": b'{"op":"begin","id":"x","save":"s:1@a+b=c","dir":"a/b/c","rank":3,"world_size":4,'
                  b'"max_shard_size":1e3,"prefix":"shard","metadata":{"format":"pt","k":"v\\u00e9"},"overwrite":true}',
    "begin-keep-last": b'{"op":"begin","save":"s","dir":"run/step-3","rank":0,"world_size":1,"keep_last":2}',
    "begin-keep-last-zero": b'{"op":"begin","save":"s","dir":"d","rank":0,"world_size":1,"keep_last":0}',
    "begin-total-parameters": b'{"op":"begin","save":"s","dir":"d","rank":0,"world_size":1,"total_parameters":30560}',
    "begin-bad-dir": b'{"op":"begin","id":14,"save":"step-2","dir":"../elsewhere","rank":0,"world_size":1}',
    "begin-rank-past-world": b'{"op":"begin","save":"s","dir":"d","rank":1,"world_size":1,"max_shard_size":null}',
    "put-empty-no-source": b'{"op":"put","save":"s","name":"router.bias","dtype":"F32","shape":[3],"start":[3],"count":[0]}',
    "put-empty-region-end": b'{"op":"put","save":"s","name":"w","dtype":"BF16","shape":[5,2],"start":[0,2],"count":[5,0],"region":1,"offset":16,"deferred":true}',
    "put-empty-inline": b'{"op":"put","save":"s","name":"w","dtype":"U8","shape":[8,16],"start":[8,0],"count":[0,16],"data":""}',
    "put-scalar": b'{"op":"put","save":"s","name":"w","dtype":"F32","shape":[],"data":"AACAPw=="}',
    "put-box-outside": b'{"op":"put","save":"s","name":"w","dtype":"I64","shape":[4,4],"start":[2,0],"count":[3,4],"region":1,"offset":0}',
    "put-huge": b'{"op":"put","save":"s","name":"w","dtype":"F64","shape":[9007199254740992,9007199254740992],"region":1,"offset":0}',
    "put-fraction": b'{"op":"put","save":"s","name":"w","dtype":"U8","shape":[2.5],"data":""}',
    "put-negative": b'{"op":"put","save":"s","name":"w","dtype":"U8","shape":[-1],"data":""}',
    "put-both-sources": b'{"op":"put","save":"s","name":"w","dtype":"U8","shape":[1],"data":"AA==","region":1}',
    "put-bad-b64": b'{"op":"put","save":"s","name":"w","dtype":"U16","shape":[1],"data":"AB=="}',
    "put-f4": b'{"op":"put","save":"s","name":"w","dtype":"F4","shape":[2],"region":1,"offset":0}',
    "put-ctrl-name": b'{"op":"put","save":"s","name":"a\\u0007b","dtype":"U8","shape":[1],"data":"AA=="}',
    "put-metadata-name": b'{"op":"put","save":"s","name":"__metadata__","dtype":"U8","shape":[1],"data":"AA=="}',
    "puts-mixed": b'{"op":"puts","save":"s","slices":[{"name":"a","dtype":"F32","shape":[4],"region":1,"offset":0,"index":0},'
                  b'{"name":"b","dtype":"BF16","shape":[2,3],"start":[1,0],"count":[1,3],"data":"gECgQMBA"},'
                  b'{"name":"c","dtype":"U8","shape":[3],"start":[3],"count":[0],"deferred":true,"region":1,"offset":9}]}',
    "puts-bad-slice": b'{"op":"puts","save":"s","slices":[{"name":"a","dtype":"U8","shape":[1],"data":"AA=="},'
                      b'{"name":"__metadata__","dtype":"U8","shape":[1],"data":"AA=="},7]}',
    "puts-not-array": b'{"op":"puts","save":"s","slices":{"name":"a"}}',
    # libshardd's shape, which the daemon scans without jansson (proto/puts_scan.c)
    "puts-scanned": b'{"op":"puts","id":21,"save":"s","slices":[{"name":"layers.0.w","dtype":"BF16","shape":[80,128],'
                    b'"index":3,"region":1,"offset":4096},{"name":"b","dtype":"F32","shape":[4,6],"start":[2,0],'
                    b'"count":[2,6],"prefix":"optimizer","region":2,"offset":0,"deferred":true},'
                    b'{"name":"e","dtype":"U8","shape":[0]}]}',
    "file-bad-path": b'{"op":"file","save":"s","path":"../x","data":""}',
    "dup-keys": b'{"op":"seal","save":"a","save":"b"}',
    "nul-escape": b'{"op":"wait","save":"a\\u0000b"}',
    "bad-utf8": b'{"op":"wait","save":"\xc3\x28"}',
    "not-object": b'[1,2,3]',
    "no-op": b'{"id":{"deep":[1,2.5,"x"]}}',
    "unknown-op": b'{"op":"frobnicate","id":19}',
    "big-int": b'{"op":"detach","region":99999999999999999999999}',
    "truncated": b'{"op":"status","id":"la',
}
for name, line in lines.items():
    put("request", name, b"\x00" + line + b"\n")
put("request", "half-line-then-stall", b"\x00" + b'{"op":"status"}\n{"op":"hel')
put("request", "small-limits", b"\x40" + b'{"op":"put","save":"s","name":"layers.0.w","dtype":"U8","shape":[1,1,1],'
    b'"data":"AA=="}\n{"op":"put","save":"s","name":"w","dtype":"U8","shape":[1,1,1],"data":"AA=="}\n')
put("request", "too-long-line", b"\x81" + b'{"op":"status","id":"' + b"x" * 40 + b'"}\n')

# ----------------------------------------------------------------- reader
def st(tensors, meta=None, pad_to=8, data=None, raw_header=None):
    """A .safetensors file: tensors = [(name, dtype, shape, nbytes)] laid out in order."""
    if raw_header is None:
        h = {}
        if meta is not None:
            h["__metadata__"] = meta
        off = 0
        for name, dt, shape, nb in tensors:
            h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
            off += nb
        raw_header = json.dumps(h, separators=(",", ":")).encode()
    else:
        off = 0
    while len(raw_header) % pad_to:
        raw_header += b" "
    if data is None:
        data = bytes(range(256)) * (off // 256 + 1)
        data = data[:off]
    return struct.pack("<Q", len(raw_header)) + raw_header + data


put("reader", "one-f32", st([("w", "F32", [3], 12)], meta={"format": "pt"}))
put("reader", "two-tensors", st([("a.weight", "BF16", [2, 2], 8), ("b", "I64", [1], 8)]))
put("reader", "scalar-and-empty", st([("s", "F64", [], 8), ("e", "U8", [0, 5], 0)]))
put("reader", "empty-header", st([], raw_header=b"{}"))
put("reader", "metadata-only", st([], meta={"format": "pt", "k": "v"}))
put("reader", "wrong-size", st([("w", "F32", [3], 10)]))
put("reader", "hole", st([], raw_header=b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                                   b'"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}', data=b"\0" * 6))
put("reader", "overlap", st([], raw_header=b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                                      b'"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', data=b"\0" * 4))
put("reader", "trailing", st([("w", "U8", [2], 2)]) + b"xx")
put("reader", "dup-key", st([], raw_header=b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                      b'"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', data=b"\0"))
put("reader", "extra-field", st([], raw_header=b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}',
                                data=b"\0"))
put("reader", "f4-dtype", st([("w", "F4", [2], 1)]))
put("reader", "overflow-shape", st([], raw_header=b'{"w":{"dtype":"F64","shape":[4294967296,4294967296],'
                                         b'"data_offsets":[0,0]}}'))
put("reader", "length-past-end", struct.pack("<Q", 1000) + b"{}")
put("reader", "short", b"\x02\0\0")
put("reader", "not-object", st([], raw_header=b"[1]"))
put("reader", "index", json.dumps({"metadata": {"total_size": 20, "total_parameters": 5},
                                   "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                  "b": "model-00002-of-00002.safetensors"}}).encode())
# A key repeated inside a metadata entry the reader walks past: refused, as jansson refused it.
put("reader", "index-nested-dup", b'{"metadata":{"total_size":20,"extra":[{"k":{"x":1,"x":2}}]},'
                                  b'"weight_map":{"a":"model-00001-of-00001.safetensors"}}')

# --------------------------------------------------------------- coverage
# Byte 0: mode (0 random small, 1 grid, 2 scaled grid, 3 wide 64-bit); bit 2: no keep[].
put("coverage", "grid-2x3-cuts", bytes([1, 1, 1, 0b10, 2, 0b100, 0]))          # 2x3 split on both dims
put("coverage", "grid-drop", bytes([1, 1, 3, 0b110, 3, 0b110, 1, 0, 2, 0, 0]))  # a gap
put("coverage", "grid-replica", bytes([5, 2, 2, 0b10, 2, 0b10, 2, 0b10, 1, 1, 0, 0, 0]))
put("coverage", "grid-nudge", bytes([1, 0, 5, 0b11110, 1, 2, 0, 0, 0b11]))    # an overlap
put("coverage", "grid-full-4d", bytes([1, 3, 5, 0xff, 5, 0xff, 3, 0xff, 1, 0xff, 0]))  # 288 boxes: heap path
put("coverage", "random-2d", bytes([0, 2, 3, 4, 3, 0, 0, 3, 4, 0, 2, 1, 3, 1, 2, 0, 1]))
put("coverage", "scalar", bytes([0, 0, 0, 3]))
# an edited grid and random boxes with zero counts: empty boxes beside real ones
put("coverage", "grid-empty-slices", bytes([1, 1, 3, 0b110, 3, 0b110, 2, 4, 0, 0, 0, 4, 5, 2, 1]))
put("coverage", "random-empties", bytes([0, 2, 3, 4, 4, 0, 3, 0, 4, 3, 0, 0, 4, 1, 2, 2, 0, 0, 3, 4, 0]))
put("coverage", "scaled-grid", bytes([2, 0, 0, 0, 0, 0, 0, 1, 0, 4, 2, 0b10, 3, 0b100, 1, 2, 0, 1, 0, 0x2]))
put("coverage", "wide", bytes([3, 3]) + b"\xff" * 8 + b"\x01" + b"\x10" * 8 + b"\x20" + b"\xff" * 8 + b"\x30"
    + bytes([2]) + b"\x00" * 60)

# -------------------------------------------------------------- handshake
# Byte 0: bit 0 we dialled; bits 1..7 read size - 1. The rest: frames (u32 big-endian header
# length, header JSON) as a stranger sends them before login.
def frame(h):
    b = h if isinstance(h, bytes) else json.dumps(h, separators=(",", ":")).encode()
    return struct.pack(">I", len(b)) + b


NONCE = "ab" * 32
hello = {"t": "hello", "v": 3, "node": "node-b", "nonce": NONCE, "listen": "127.0.0.1:7077"}
put("handshake", "hello-auth", b"\xfe" + frame(hello) + frame({"t": "auth", "proof": "00" * 32}))
put("handshake", "hello-auth-bytewise", b"\x00" + frame(hello) + frame({"t": "auth", "proof": "0" * 63}))
put("handshake", "connector-side", b"\x07" + frame(dict(hello, listen="[::1]:9")) + frame({"t": "auth"}))
put("handshake", "error-escapes", b"\x10" + frame({"t": "error", "code": "protocol",
                                                   "message": "\x1b[2J\x1b]0;owned\x07\r\nfake line \u009b" + "x" * 400}))
put("handshake", "hello-v1", b"\x20" + frame(dict(hello, v=1)))
put("handshake", "hello-bad-nonce", b"\x20" + frame(dict(hello, nonce="zz" * 32)))
put("handshake", "hello-long-name", b"\x20" + frame(dict(hello, node="n" * 200, listen="h" * 400)))
put("handshake", "auth-first", b"\x20" + frame({"t": "auth", "proof": "11" * 32}))
put("handshake", "not-object", b"\x20" + frame(b"[1,2]"))
put("handshake", "bad-json", b"\x20" + frame(b'{"t":"hel'))
put("handshake", "len-field", b"\x20" + frame({"t": "hello", "len": 5}) + b"abcde")
put("handshake", "too-long", b"\x20" + struct.pack(">I", 1 << 20) + b"{")
put("handshake", "half-frame", b"\x00" + struct.pack(">I", 100) + b'{"t":"hello"')
