# Reading checkpoints back through libshardd's strict reader: whole tensors, or each rank's box of them.
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _lib
from ._client import _dims
from ._errors import _bytes, _error, _text
from ._lib import TensorInfo as _CTensorInfo
from ._tensors import _TORCH, Slice

__all__ = ["Checkpoint", "TensorInfo", "load", "load_slices"]

PathLike = Union[str, "os.PathLike[str]"]
Box = Tuple[Sequence[int], Sequence[int]]

# safetensors name -> little-endian numpy type string; the rest need ml_dtypes.
_NUMPY = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8",
    "C64": "<c8",
}
_ML_DTYPES = {
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
}
_TORCH_BY_NAME = {st: t[len("torch."):] for t, st in _TORCH.items()}
_FRAMEWORKS = ("numpy", "torch")


class TensorInfo(NamedTuple):
    name: str
    dtype: str              # safetensors name: "F32", "BF16", ...
    shape: Tuple[int, ...]
    nbytes: int
    file: str               # the shard holding it


def _fspath(path: PathLike, what: str) -> str:
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError("%s must be str or os.PathLike[str], not %s" % (what, type(path).__name__))
    return path


def numpy_dtype(st_dtype: str):
    """The numpy dtype holding a safetensors dtype; BF16 and F8 types need ml_dtypes."""
    import numpy as np

    if st_dtype in _NUMPY:
        return np.dtype(_NUMPY[st_dtype])
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("%s has no numpy dtype without ml_dtypes: install ml_dtypes, load with "
                        "framework='torch', or read the raw bytes with Checkpoint.read_into"
                        % st_dtype) from None
    return np.dtype(getattr(ml_dtypes, _ML_DTYPES[st_dtype]))


def torch_dtype(st_dtype: str):
    """The torch dtype of a safetensors dtype; TypeError when this torch lacks it."""
    import torch

    dt = getattr(torch, _TORCH_BY_NAME.get(st_dtype, ""), None)
    if dt is None:
        raise TypeError("torch %s has no dtype for %s: load with framework='numpy' or read the raw "
                        "bytes with Checkpoint.read_into" % (torch.__version__, st_dtype))
    return dt


def _writable(out) -> Tuple[Optional[int], int, Any]:
    """(address, length, keep-alive) of a writable C-contiguous buffer: numpy array, CPU torch tensor,
    bytearray or memoryview."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        if out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError("out must be a contiguous CPU tensor")
        return out.data_ptr(), out.numel() * out.element_size(), out
    np = sys.modules.get("numpy")
    if np is not None and isinstance(out, np.ndarray):
        # Not through memoryview: ml_dtypes types have no buffer-protocol format.
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be a writable C-contiguous array")
        return (out.ctypes.data if out.nbytes else None), out.nbytes, out
    mv = memoryview(out)
    if mv.readonly or not mv.c_contiguous:
        raise ValueError("out must be a writable C-contiguous buffer")
    mv = mv.cast("B") if mv.nbytes else mv
    if mv.nbytes == 0:
        return None, 0, mv
    holder = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(holder), mv.nbytes, holder


class Checkpoint:
    """A checkpoint folder (index and shards, or one .safetensors) or a single .safetensors file,
    checked in full by libshardd's strict reader when opened.

        with shardd.Checkpoint("run1/step-100") as ck:
            ck.names(); ck.info("w").shape
            w = ck.read("w", start=(128, 0), count=(128, 4096))

    Opening reads headers only, and builds no per-tensor objects: info(), names() and membership
    ask libshardd's table on demand, so they need the checkpoint open (ValueError once closed), while
    len() does not. verify=True (or verify() later) also reads
    every byte of every file once and checks each file's CRC-32C against the
    one shardd recorded when it wrote it.
    """

    def __init__(self, path: PathLike, verify: bool = False):
        self.path = _fspath(path, "path")
        lib = _lib.lib()
        handle = ctypes.c_void_p()
        rc = lib.shardd_ckpt_open(self.path.encode("utf-8", "surrogateescape"), ctypes.byref(handle))
        if rc:
            raise _error(rc, lib.shardd_last_error(None))
        self._handle = handle
        # Where the files' names are relative to, for reads that open them again (_load_runs).
        self._folder = self.path if os.path.isdir(self.path) else (os.path.dirname(self.path) or ".")
        self._headers: Dict[str, Any] = {}  # file -> its header as _load_runs parsed it, parsed once
        # The table stays in libshardd's compact records: a TensorInfo is made on first asking, so
        # opening costs the C check alone, even for millions of tensors.
        self._count = int(lib.shardd_ckpt_count(handle))
        self._info: Dict[str, TensorInfo] = {}
        self._complete = False  # _info holds every tensor (tensors() was called)
        if verify:
            try:
                self.verify()
            except BaseException:
                self.close()
                raise

    def verify(self) -> None:
        """The deep check: reads every byte of every file once, sequentially (the cost of reading
        the whole checkpoint from disk; the CRC itself runs at memory speed), of the files
        checked when the checkpoint was opened (one swapped in since is refused), and compares each file's data CRC-32C with the one
        recorded in the index (a single file: its __metadata__).

        Raises ShardError bad_checksum naming the file and both values when one differs (damaged,
        or swapped in from another checkpoint), and bad_checksum when the checkpoint records no
        checksums (written with checksums = off, or not by shardd); bad_format naming a file cut
        or grown since it was opened.
        """
        self._check(_lib.lib().shardd_ckpt_verify(self._live()))

    @staticmethod
    def _check(rc: int) -> None:
        if rc:
            raise _error(rc, _lib.lib().shardd_last_error(None))

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("the checkpoint is closed")
        return self._handle

    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            _lib.lib().shardd_ckpt_close(self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn down ctypes already
            pass

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _c_info(self, i: int) -> "_CTensorInfo":
        info = _CTensorInfo()
        self._check(_lib.lib().shardd_ckpt_tensor(self._live(), i, ctypes.byref(info)))
        return info

    def _make_info(self, i: int) -> TensorInfo:
        info = self._c_info(i)
        return TensorInfo(_text(info.name), _text(info.dtype), tuple(info.shape[:info.ndim]), int(info.nbytes),
                          _text(info.file))

    def _lookup(self, name: object) -> Optional[TensorInfo]:
        t = self._info.get(name) if isinstance(name, str) else None
        if t is not None or not isinstance(name, str):
            return t
        if self._complete:  # every tensor is in _info: not there is not in the checkpoint
            self._live()
            return None
        key = name.encode("utf-8", "surrogatepass")
        i = ctypes.c_size_t()
        if b"\0" in key or _lib.lib().shardd_ckpt_find(self._live(), key, ctypes.byref(i)):
            return None
        t = self._info[name] = self._make_info(i.value)
        return t

    def tensors(self) -> Dict[str, TensorInfo]:
        """{name: TensorInfo} of every tensor, in name order: made in one walk of libshardd's table
        (then info() and membership are dict lookups), for a caller that asks about most of them."""
        if not self._complete:
            handle, get = self._live(), _lib.lib().shardd_ckpt_tensor
            info = _CTensorInfo()  # one record filled in turn: 45,000 tensors read in tens of ms
            ref, table = ctypes.byref(info), {}
            for i in range(self._count):
                self._check(get(handle, i, ref))
                name = _text(info.name)
                table[name] = TensorInfo(name, info.dtype.decode(), tuple(info.shape[:info.ndim]), info.nbytes,
                                         _text(info.file))
            self._info, self._complete = table, True
        return self._info

    def names(self) -> List[str]:
        """Tensor names in name order."""
        return list(self)

    def __iter__(self) -> Iterator[str]:
        for i in range(self._count):
            yield _text(self._c_info(i).name)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, name: object) -> bool:
        return self._lookup(name) is not None

    def info(self, name: str) -> TensorInfo:
        t = self._lookup(name)
        if t is None:
            raise KeyError("tensor %r is not in %s" % (name, self.path))
        return t

    def _box(self, name: str, start, count) -> Tuple[TensorInfo, Any, Any, Tuple[int, ...]]:
        t = self.info(name)
        if (start is None) != (count is None):
            raise ValueError("tensor %r: give both start and count, or neither" % (name,))
        if start is None:
            return t, None, None, t.shape
        start, count = tuple(int(s) for s in start), tuple(int(c) for c in count)
        if len(start) != len(t.shape) or len(count) != len(t.shape):
            raise ValueError("tensor %r has %d dimensions: start and count need %d entries each"
                             % (name, len(t.shape), len(t.shape)))
        return t, _dims(start, "start"), _dims(count, "count"), count

    def read_into(self, name: str, out, start: Optional[Sequence[int]] = None,
                  count: Optional[Sequence[int]] = None) -> None:
        """Copies the box (the whole tensor when start and count are None), row-major and
        little-endian, into out: exactly the box's bytes of writable memory."""
        _, cstart, ccount, _ = self._box(name, start, count)
        addr, length, keep = _writable(out)
        self._check(_lib.lib().shardd_ckpt_read(self._live(), _bytes(name, "tensor name"), cstart,
                                                ccount, addr, length))
        del keep

    def read(self, name: str, start: Optional[Sequence[int]] = None,
             count: Optional[Sequence[int]] = None, framework: str = "numpy"):
        """The box (the whole tensor by default) as a new numpy array or CPU torch tensor."""
        if framework not in _FRAMEWORKS:
            raise ValueError("framework must be 'numpy' or 'torch', not %r" % (framework,))
        t, _, _, shape = self._box(name, start, count)
        if framework == "torch":
            import torch

            out = torch.empty(shape, dtype=torch_dtype(t.dtype))
        else:
            import numpy as np

            out = np.empty(shape, dtype=numpy_dtype(t.dtype))
        self.read_into(name, out, start, count)
        return out

    def read_slice(self, name: str, start: Sequence[int], count: Sequence[int],
                   framework: str = "numpy") -> Slice:
        """The box as a Slice of the global tensor, ready to save() again under a new layout."""
        return Slice(self.read(name, start, count, framework), self.info(name).shape, start)

    def __repr__(self) -> str:
        return "<shardd.Checkpoint %s: %d tensors%s>" % (self.path, self._count,
                                                         "" if self._handle is not None else ", closed")


def load(path: PathLike, names: Optional[Iterable[str]] = None,
         boxes: Optional[Mapping[str, Box]] = None, framework: str = "numpy",
         verify: bool = False) -> Dict[str, Any]:
    """{name: array} of a checkpoint (folder or .safetensors file), checked by the strict reader.

    names: the tensors to read (default: all, in name order). boxes: {name:
    (start, count)} reads only that box of the tensor (the bytes of other
    boxes are never read). framework: "numpy" or "torch" (CPU tensors).
    Raises ShardError (bad_format, io_error, ...) naming the file and field; bad_file_set
    naming the file for a shard-named file the index does not name, or a named one missing.
    verify=True first checks every file's recorded CRC-32C (Checkpoint.verify: reads every byte of
    every file once, even of tensors not asked for) and raises bad_checksum before anything is read.
    """
    boxes = dict(boxes or {})
    with Checkpoint(path, verify=verify) as ck:
        wanted = ck.names() if names is None else list(names)
        for n in list(wanted) + list(boxes):
            ck.info(n)
        stray = sorted(set(boxes) - set(wanted))
        if stray:
            raise ValueError("boxes name %s, which names= leaves out" % ", ".join(map(repr, stray)))
        out = {}
        for n in wanted:
            start, count = boxes.get(n, (None, None))
            out[n] = ck.read(n, start, count, framework)
        return out


def load_slices(path: PathLike, requests: Iterable[Tuple[str, Sequence[int], Sequence[int]]],
                framework: str = "numpy", verify: bool = False) -> Dict[str, Slice]:
    """{name: Slice} for a rank's (name, start, count) boxes: what it needs to reshard.

    Each Slice carries the global shape and its start, so the dict can go
    straight to save() under the new layout. verify=True: as load's (every
    byte of every file is read once, not only this rank's boxes).
    """
    out: Dict[str, Slice] = {}
    with Checkpoint(path, verify=verify) as ck:
        for name, start, count in requests:
            if name in out:
                raise ValueError("tensor %r is asked for twice" % (name,))
            out[name] = ck.read_slice(name, start, count, framework)
    return out
