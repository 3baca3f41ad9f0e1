# Many boxes of one checkpoint read at once: each file's header parsed once, its boxes read in long runs and scattered with few copies.
"""read_boxes fills many views from one open Checkpoint, file by file.

A box per read call costs a round of opening, checking and closing its file,
and an MoE checkpoint holds tens of thousands of per-expert tensors. Here
each file is opened once and proven to be the file the strict reader
checked (libshardd reads one element of it, which refuses a file replaced
since; the descriptor read here must be the file its name then held). Its
header is parsed once, and every box asked of it is checked against what
the strict reader recorded (dtype, shape, bytes) before a byte is read.

Then the boxes are read in runs of the file, in file order, a hole of at
most GAP bytes read through rather than skipped:
  - a box whose bytes are one stretch of the file, bound for a contiguous CPU
    view (an expert's matrix, an FSDP shard's rows), is read straight into
    its view: one preadv reads a run of such boxes, no copy;
  - any other box (a column block, a transposed piece, a CUDA view) is read
    into a staging buffer with its neighbours, and boxes that step evenly
    through both the file and one destination tensor (a fused parameter's
    experts, in the file's order) are scattered by one strided copy.
"""
from __future__ import annotations

import ctypes
import json
import os
import stat
import struct
from typing import Dict, List, Tuple

from ._errors import refusal
from ._tensors import DTYPE_SIZES, row_major_strides

__all__ = ["read_boxes"]

GAP = 32 << 10          # a hole up to this many bytes between two wanted stretches is read through
STAGE = 64 << 20        # the most bytes one staged run holds (a larger box is a run of its own)
HEADER_MAX = 100 << 20  # safetensors' own limit on a header
IOV_MAX = 1024          # buffers per preadv (Linux's UIO_MAXIOV)


class _Read:
    """One box: its bytes [lo, hi) in the file, the view it fills, and the box's element strides."""
    __slots__ = ("lo", "hi", "view", "count", "strides", "itemsize", "direct")

    def __init__(self, lo, hi, view, count, strides, itemsize, direct):
        self.lo, self.hi, self.view, self.count = lo, hi, view, count
        self.strides, self.itemsize, self.direct = strides, itemsize, direct


def _changed(file: str, why: str):
    return refusal("bad_format", "%s: changed since the checkpoint was opened (%s)" % (file, why))


def _io_error(file: str, length: int, offset: int, why: str):
    return refusal("io_error", "%s: cannot read %d bytes at %d: %s" % (file, length, offset, why))


def _preadv(fd: int, buffers: List[memoryview], offset: int, file: str) -> None:
    """Fills every buffer from offset on, through short reads; io_error naming the file."""
    while buffers:
        want = sum(b.nbytes for b in buffers)
        try:
            n = os.preadv(fd, buffers, offset)
        except OSError as e:
            raise _io_error(file, want, offset, e.strerror) from None
        if n == 0:
            raise _io_error(file, want, offset, "the file is shorter than its header says")
        offset += n
        while buffers and n >= buffers[0].nbytes:
            n -= buffers[0].nbytes
            buffers = buffers[1:]
        if n:
            buffers = [buffers[0][n:]] + buffers[1:]


def _memory(view) -> memoryview:
    """The writable bytes of a contiguous CPU tensor."""
    n = view.numel() * view.element_size()
    return memoryview((ctypes.c_char * n).from_address(view.data_ptr())).cast("B")


def _header(fd: int, file: str, size: int) -> Tuple[dict, int]:
    """(the file's header as parsed JSON, where its data begins)."""
    head = os.pread(fd, 8, 0)
    if len(head) != 8:
        raise _changed(file, "no header")
    n = struct.unpack("<Q", head)[0]
    if n > HEADER_MAX or 8 + n > size:
        raise _changed(file, "header length %d" % n)
    raw = os.pread(fd, n, 8)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise _changed(file, "header: %s" % e) from None
    if not isinstance(header, dict):
        raise _changed(file, "header is no object")
    return header, 8 + n


def _open_proven(ck, file: str, probe: str) -> int:
    """A descriptor of `file` that is the file the strict reader checked: libshardd reads an element
    of `probe` (a non-empty tensor of it) through its own check of device and inode, between this
    open and a second look at the name, which must still be the file opened here."""
    path = os.path.join(ck._folder, file)
    try:
        # Non-blocking, as libshardd opens: a FIFO swapped in under the name must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise refusal("io_error", "%s: cannot open: %s" % (file, e.strerror)) from None
    try:
        mine = os.fstat(fd)
        if not stat.S_ISREG(mine.st_mode):
            raise refusal("bad_format", "%s: not a regular file" % file)
        shape = ck.info(probe).shape
        one = bytearray(DTYPE_SIZES[ck.info(probe).dtype])
        ck.read_into(probe, one, (0,) * len(shape), (1,) * len(shape))
        now = os.stat(path)
        if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            raise refusal("bad_format", "%s: replaced by another file since the checkpoint was opened" % file)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _plan(file: str, fills, table, header: dict, data_start: int, size: int) -> List[_Read]:
    """The reads of one file's boxes, each tensor checked against what the strict reader recorded."""
    out = []
    strides_of: Dict[Tuple[int, ...], Tuple[int, ...]] = {}
    for source, view, start, count in fills:
        info = table[source]
        try:
            entry = header[source]
            begin, end = entry["data_offsets"]
            fits = (entry["dtype"] == info.dtype and tuple(entry["shape"]) == info.shape and type(begin) is int
                    and type(end) is int and end - begin == info.nbytes and begin >= 0 and data_start + end <= size)
        except (KeyError, TypeError, ValueError):
            fits = False
        if not fits:
            raise _changed(file, "tensor %r" % source)
        strides = strides_of.get(info.shape)
        if strides is None:
            strides = strides_of[info.shape] = row_major_strides(info.shape)
        itemsize = DTYPE_SIZES[info.dtype]
        lo = data_start + begin
        count = tuple(count)
        if tuple(view.shape) != count or len(start) != len(count) or \
                any(a < 0 or a + c > n for a, c, n in zip(start, count, info.shape)):
            raise ValueError("tensor %r: the box start=%s count=%s into a view of shape %s does not fit its "
                             "shape %s" % (source, list(start), list(count), list(view.shape), list(info.shape)))
        cpu = view.device.type == "cpu" and view.is_contiguous()
        if count == info.shape:  # the whole tensor: the common case, no sums
            out.append(_Read(lo, lo + info.nbytes, view, info.shape, strides, itemsize, cpu))
            continue
        first = sum(s * st for s, st in zip(start, strides))
        last = sum((s + c - 1) * st for s, c, st in zip(start, count, strides))
        numel = 1
        for c in count:
            numel *= c
        lo += first * itemsize
        out.append(_Read(lo, lo + (last - first + 1) * itemsize, view, count, strides, itemsize,
                         cpu and last - first + 1 == numel))
    return out


def _runs(reads: List[_Read], limit: int, most: int, overlap: bool) -> List[List[_Read]]:
    """Reads in file order, cut into runs: a new one where the hole is over GAP, the run would
    pass `limit` bytes or hold `most` reads, or (unless `overlap`) a read overlaps the one before."""
    runs: List[List[_Read]] = []
    end = 0
    for r in sorted(reads, key=lambda r: r.lo):
        run = runs[-1] if runs else None
        if run is None or r.lo - end > GAP or (r.lo < end and not overlap) or r.hi - run[0].lo > limit or \
                len(run) >= most:
            runs.append([r])
            end = r.hi
        else:
            run.append(r)
            end = max(end, r.hi)
    return runs


def _read_direct(fd: int, file: str, reads: List[_Read]) -> None:
    """Each run by one preadv straight into its views, its holes into a scratch buffer."""
    scratch = memoryview(bytearray(GAP))
    # Each read and each hole is one buffer.
    for run in _runs(reads, 1 << 62, IOV_MAX // 2, False):
        buffers, end = [], run[0].lo
        for r in run:
            if r.lo > end:
                buffers.append(scratch[:r.lo - end])
            buffers.append(_memory(r.view))
            end = r.hi
        _preadv(fd, buffers, run[0].lo, file)


def _steps(run: List[_Read], i: int, taken, by_lo, by_key):
    """The longest even stride from read i through later reads of its kind: [(index), ...]."""
    r = run[i]
    key = by_key[i]
    best = [i]
    tried = 0
    for j in range(i + 1, len(run)):
        if tried == 3:
            break
        if j in taken or by_key[j] != key:
            continue
        tried += 1
        file_step = run[j].lo - r.lo
        view_step = run[j].view.storage_offset() - r.view.storage_offset()
        if view_step <= 0 or file_step % r.itemsize:
            continue
        chain = [i, j]
        while True:
            k = by_lo.get(run[chain[-1]].lo + file_step)
            if k is None or k in taken or by_key[k] != key or \
                    run[k].view.storage_offset() - run[chain[-1]].view.storage_offset() != view_step:
                break
            chain.append(k)
        if len(chain) > len(best):
            best = chain
    return best


def _read_staged(fd: int, file: str, reads: List[_Read]) -> None:
    """Each run into a staging buffer by one pread, then into its views: reads that step evenly
    through the file and through one tensor by one strided copy, the rest one copy each."""
    import torch

    pinned = any(r.view.device.type == "cuda" for r in reads)
    for run in _runs(reads, STAGE, 1 << 62, True):
        base = run[0].lo
        length = max(r.hi for r in run) - base
        stage = torch.empty(-(-length // 8) * 8, dtype=torch.uint8, pin_memory=pinned)
        _preadv(fd, [_memory(stage)[:length]], base, file)
        typed: Dict[object, object] = {}
        by_lo = {r.lo: i for i, r in enumerate(run)}
        by_key = [(r.view.dtype, r.view.device, tuple(r.view.shape), r.view.stride(), r.strides,
                   r.view.untyped_storage().data_ptr()) for r in run]
        taken = set()
        for i, r in enumerate(run):
            if i in taken:
                continue
            at = r.lo - base
            if at % r.itemsize:  # misaligned for its dtype: through an aligned copy of its bytes
                src = stage[at:at + r.hi - r.lo].clone().view(r.view.dtype)
                src = torch.as_strided(src, r.count, r.strides, 0)
                taken.add(i)
                r.view.copy_(src)
                continue
            chain = _steps(run, i, taken, by_lo, by_key)
            taken.update(chain)
            whole = typed.get(r.view.dtype)
            if whole is None:
                whole = typed[r.view.dtype] = stage.view(r.view.dtype)
            if len(chain) == 1:
                r.view.copy_(torch.as_strided(whole, r.count, r.strides, at // r.itemsize))
                continue
            file_step = (run[chain[1]].lo - r.lo) // r.itemsize
            view_step = run[chain[1]].view.storage_offset() - r.view.storage_offset()
            n = len(chain)
            dst = torch.as_strided(r.view, (n,) + tuple(r.view.shape), (view_step,) + r.view.stride(),
                                   r.view.storage_offset())
            dst.copy_(torch.as_strided(whole, (n,) + r.count, (file_step,) + r.strides, at // r.itemsize))


def read_boxes(ck, fills) -> None:
    """Fills every view of fills, [(tensor name, view, start, count)], with its box (start, count)
    of the tensor: views of any strides and devices, in the box's shape. Each file is opened once;
    the names, shapes and dtypes are the caller's to have checked against ck. Each file's header
    is parsed on ck's first read of it, so a caller may read in several calls."""
    table = ck.tensors()
    by_file: Dict[str, list] = {}
    for fill in fills:
        if fill[1].numel():
            by_file.setdefault(table[fill[0]].file, []).append(fill)
    for file, mine in by_file.items():
        fd = _open_proven(ck, file, mine[0][0])
        try:
            size = os.fstat(fd).st_size
            # Parsed once a Checkpoint, as libshardd checked it once: the file is proven the same.
            header, data_start = ck._headers.get(file) or ck._headers.setdefault(file, _header(fd, file, size))
            reads = _plan(file, mine, table, header, data_start, size)
            _read_direct(fd, file, [r for r in reads if r.direct])
            _read_staged(fd, file, [r for r in reads if not r.direct])
        finally:
            os.close(fd)
