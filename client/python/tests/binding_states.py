# The states the binding's tests save: every numpy dtype and odd layout, and the two ranks' slices of one model.
import numpy as np

import shardd


def all_dtypes():
    rng = np.random.default_rng(7)
    out = {
        "bool": rng.integers(0, 2, (3, 5)).astype(np.bool_),
        "u8": rng.integers(0, 256, (4, 3), dtype=np.uint8),
        "i8": rng.integers(-128, 128, (7,), dtype=np.int8),
        "i16": rng.integers(-2**15, 2**15, (2, 3, 4), dtype=np.int16),
        "u16": rng.integers(0, 2**16, (5,), dtype=np.uint16),
        "f16": rng.standard_normal((3, 3)).astype(np.float16),
        "i32": rng.integers(-2**31, 2**31, (4, 4), dtype=np.int32),
        "u32": rng.integers(0, 2**32, (6,), dtype=np.uint32),
        "f32": rng.standard_normal((8, 2)).astype(np.float32),
        "i64": rng.integers(-2**63, 2**63 - 1, (3,), dtype=np.int64),
        "u64": rng.integers(0, 2**64 - 1, (2, 2), dtype=np.uint64),
        "f64": rng.standard_normal((5, 1)),
        "c64": (rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))).astype(np.complex64),
    }
    # Odd layouts the copy must still write row-major and little-endian.
    out["scalar"] = np.array(np.float32(2.5))
    out["empty"] = np.zeros((0, 4), np.int32)
    out["transposed"] = np.arange(24, dtype=np.float32).reshape(4, 6).T
    out["strided"] = np.arange(40, dtype=np.int64)[::3]
    out["bigendian"] = np.arange(10, dtype=">f8") / 3.0
    out["nan"] = np.array([np.nan, -0.0, np.inf], np.float32)
    return out


def two_rank_globals():
    rng = np.random.default_rng(99)
    return {
        "embed": rng.standard_normal((6, 4)).astype(np.float32),
        "proj": rng.integers(-1000, 1000, (4, 6), dtype=np.int16),
        "norm": rng.standard_normal(5),
        "bias": rng.integers(0, 256, (7,), dtype=np.uint8),
        "flags": rng.integers(0, 2, (2, 2, 2)).astype(np.bool_),
        "cplx": (rng.standard_normal((2, 3)) + 1j).astype(np.complex64),
    }


def two_rank_state(rank):
    """Rank `rank`'s slices: row, column (a strided view), uneven and last-axis splits, a replica."""
    g = two_rank_globals()
    bias_cut = [(0, 4), (4, 7)][rank]
    S = shardd.Slice
    return {
        "embed": S(g["embed"][3 * rank:3 * rank + 3], g["embed"].shape, (3 * rank, 0)),
        "proj": S(g["proj"][:, 3 * rank:3 * rank + 3], g["proj"].shape, (0, 3 * rank)),
        "norm": g["norm"],
        "bias": S(g["bias"][bias_cut[0]:bias_cut[1]], (7,), (bias_cut[0],)),
        "flags": S(g["flags"][:, :, rank:rank + 1], (2, 2, 2), (0, 0, rank)),
        "cplx": S(g["cplx"][rank:rank + 1], (2, 3), (rank, 0)),
    }
