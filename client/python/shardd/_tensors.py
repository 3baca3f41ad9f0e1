# Turns numpy arrays and torch tensors into (safetensors dtype, box, source) and copies sources into arenas.
import operator
import sys

__all__ = ["Slice", "dtype_name", "DTYPES"]

# Every dtype the daemon accepts (proto/PROTOCOL.md, put), and the bytes of one element.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8,
}
DTYPES = frozenset(DTYPE_SIZES)


def row_major_strides(shape) -> tuple:
    """The element strides of a contiguous (row-major) tensor of shape."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return tuple(strides)

# numpy kind + item size -> safetensors name.
_NUMPY = {
    ("b", 1): "BOOL",
    ("u", 1): "U8", ("u", 2): "U16", ("u", 4): "U32", ("u", 8): "U64",
    ("i", 1): "I8", ("i", 2): "I16", ("i", 4): "I32", ("i", 8): "I64",
    ("f", 2): "F16", ("f", 4): "F32", ("f", 8): "F64",
    ("c", 8): "C64",
}

# ml_dtypes (and jax) extension types have kind 'V'; they are known by name.
_NUMPY_BY_NAME = {
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}

# str(torch dtype) -> safetensors name, as safetensors.torch maps them.
_TORCH = {
    "torch.bool": "BOOL",
    "torch.uint8": "U8", "torch.int8": "I8",
    "torch.int16": "I16", "torch.uint16": "U16",
    "torch.float16": "F16", "torch.bfloat16": "BF16",
    "torch.int32": "I32", "torch.uint32": "U32",
    "torch.float32": "F32", "torch.float64": "F64",
    "torch.int64": "I64", "torch.uint64": "U64",
    "torch.complex64": "C64",
    "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fnuz": "F8_E4M3FNUZ", "torch.float8_e5m2fnuz": "F8_E5M2FNUZ",
    "torch.float8_e8m0fnu": "F8_E8M0",
}


def _numpy_dtype_name(dt):
    name = _NUMPY.get((dt.kind, dt.itemsize))
    if name is None:
        name = _NUMPY_BY_NAME.get(dt.name)
    if name is None:
        raise TypeError("numpy dtype %s has no safetensors equivalent" % dt)
    return name


def dtype_name(dtype):
    """The safetensors name ("F32") for a safetensors name, numpy dtype or torch dtype."""
    if isinstance(dtype, str) and dtype.upper() in DTYPES:
        return dtype.upper()
    if type(dtype).__module__.startswith("torch"):
        name = _TORCH.get(str(dtype))
        if name is None:
            raise TypeError("torch dtype %s has no safetensors equivalent" % dtype)
        return name
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError("%r is not a safetensors, numpy or torch dtype" % (dtype,)) from None
    return _numpy_dtype_name(dt)


class Slice:
    """The part of a global tensor this rank holds.

    array: the local numpy array or torch tensor (its shape is the box's
    count); shape: the global shape; start: where the box begins, one entry
    per dimension.
    """

    __slots__ = ("array", "shape", "start")

    def __init__(self, array, shape, start):
        self.array = array
        self.shape = tuple(int(s) for s in shape)
        self.start = tuple(int(s) for s in start)

    @classmethod
    def of(cls, array, shape, start):
        """A Slice of shape and start given as tuples of ints already, taken as they are (an MoE
        save makes tens of thousands)."""
        s = cls.__new__(cls)
        s.array, s.shape, s.start = array, shape, start
        return s

    def __repr__(self):
        return "Slice(<%s>, shape=%s, start=%s)" % (type(self.array).__name__, list(self.shape),
                                                    list(self.start))


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


# torch dtype -> safetensors name, filled as dtypes are met: str(dtype) costs more than the lookup.
_TORCH_BY_DTYPE = {}


def _torch_source(name, t):
    """(safetensors dtype, shape, tensor) of a torch tensor on any device, ready for copy_into.
    It runs for every slice of a save (tens of thousands for an MoE model): nothing is made
    unless it must be (a detached or resolved tensor)."""
    torch = sys.modules["torch"]
    dt = _TORCH_BY_DTYPE.get(t.dtype)
    if dt is None:
        dt = _TORCH.get(str(t.dtype))
        if dt is None:
            raise TypeError("tensor %r: torch dtype %s has no safetensors equivalent" % (name, t.dtype))
        _TORCH_BY_DTYPE[t.dtype] = dt
    if t.layout != torch.strided:
        raise ValueError("tensor %r has layout %s: only dense tensors can be saved" % (name, t.layout))
    if t.is_meta:
        raise ValueError("tensor %r is on the meta device: it has no data to save" % (name,))
    if t.requires_grad:
        t = t.detach()
    # Lazy conjugate/negative views would otherwise be saved unresolved.
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return dt, tuple(t.shape), t


def _memory(src):
    """(device, numpy array over src's exact bytes) for the overlap test; None when empty.

    A torch tensor is described to numpy by its address and byte strides only:
    nothing is read, so this works for any device.
    """
    import numpy as np

    if _is_torch(src):
        if src.numel() == 0:
            return None
        size = src.element_size()
        iface = {"data": (src.data_ptr(), False), "shape": tuple(src.shape),
                 "strides": tuple(st * size for st in src.stride()), "typestr": "|V%d" % size,
                 "version": 3}
        return str(src.device), np.asarray(type("_Memory", (), {"__array_interface__": iface})())
    return ("cpu", src) if src.size else None


def _span(src):
    """(device, first byte address, one past the last) of src's elements; None when it has none.

    Cheap (no numpy array is made): it runs for every tensor of a save, and only spans that
    overlap as address ranges are compared element by element (_memory)."""
    if _is_torch(src):
        if src.numel() == 0:
            return None
        size = src.element_size()
        lo = src.data_ptr()
        if src.is_contiguous():
            return str(src.device), lo, lo + src.numel() * size
        # torch strides are never negative: the last element is the furthest.
        last = sum((n - 1) * st for n, st in zip(src.shape, src.stride()))
        return str(src.device), lo, lo + (last + 1) * size
    if not src.size:
        return None
    if src.flags.c_contiguous:
        lo = src.__array_interface__["data"][0]
        return "cpu", lo, lo + src.nbytes
    import numpy as np

    # numpy 2 moved byte_bounds out of the top-level namespace.
    byte_bounds = getattr(np, "byte_bounds", None) or np.lib.array_utils.byte_bounds
    lo, hi = byte_bounds(src)
    return "cpu", lo, hi


def check_shared_memory(named_srcs, spans=None):
    """ValueError naming two entries whose memory overlaps (tied weights). spans: each src's
    _span, where the caller has them already.

    Such a pair would be written twice and come back as two untied tensors;
    safetensors refuses it too. Entries that only share a storage without
    overlapping (views of one fused tensor) are fine.
    """
    if spans is None:
        spans = [_span(src) for _name, src in named_srcs]
    spans = sorted((span + (name, src) for (name, src), span in zip(named_srcs, spans) if span is not None),
                   key=operator.itemgetter(0, 1))
    # A sweep: only spans that overlap as address ranges are compared element by element. While
    # no span reaches past the next one's start (the common case) nothing is kept but that reach.
    open_spans, device, reach = [], None, 0
    for dev, lo, hi, name, src in spans:
        if dev != device or lo >= reach:
            open_spans, device, reach = [], dev, hi
        else:
            open_spans = [s for s in open_spans if s[2] > lo]
            reach = max(reach, hi)
        for other in open_spans:
            import numpy as np

            if np.shares_memory(_memory(src)[1], _memory(other[4])[1]):
                raise ValueError("tensors %r and %r share memory (tied weights): save one of them "
                                 "and tie them again after loading, or save a copy of one"
                                 % (other[3], name))
        open_spans.append((dev, lo, hi, name, src))


def nbytes(src):
    """Bytes a numpy array or torch tensor takes once copied row-major."""
    if _is_torch(src):
        return src.numel() * src.element_size()
    return src.nbytes


def copy_into(buf, offset, src):
    """Copies src (numpy array or torch tensor, any strides, any device) row-major to buf[offset:].

    A torch tensor is copied by torch itself into a CPU tensor over the arena:
    one device-to-host copy for a CUDA tensor, no numpy in between. Both
    torch and safetensors use the host's (little-endian) byte order.
    """
    if _is_torch(src):
        torch = sys.modules["torch"]
        dst = torch.frombuffer(buf, dtype=src.dtype, count=src.numel(), offset=offset)
        dst.view(src.shape).copy_(src)
        return
    import numpy as np

    dt = src.dtype
    if dt.byteorder == ">" or (dt.byteorder == "=" and sys.byteorder == "big"):
        dt = dt.newbyteorder("<")
    dst = np.ndarray(src.shape, dtype=dt, buffer=buf, offset=offset)
    np.copyto(dst, src, casting="equiv")


def copy_units(items, spans):
    """[(src, offset), ...]: what copy_all copies for every (name, src, offset) of items, in order;
    spans: each src's _span. Neighbours that are contiguous pieces of one storage, laid side by
    side in it and in the arena (one fused MoE parameter's experts, handed over expert by
    expert), become one unit, a flat view over them all: a DeepSeek-V3-shaped model's rank holds
    11,136 of them in 174 local tensors. Sources with no elements are left out."""
    torch = sys.modules.get("torch")
    units = []
    run = None  # [first src, its offset in buf, (device, end address), bytes so far]
    for (_name, src, offset), span in zip(items, spans):
        if span is None:
            continue
        if run is not None:
            if (span[1] == run[2][1] and span[0] == run[2][0] and offset == run[1] + run[3] and
                    _is_torch(src) and src.dtype == run[0].dtype and src.is_contiguous() and
                    src.untyped_storage().data_ptr() == run[0].untyped_storage().data_ptr()):
                run[2] = (span[0], span[2])
                run[3] += span[2] - span[1]
                continue
            units.append(_run_unit(torch, run))
            run = None
        if _is_torch(src) and src.is_contiguous():
            run = [src, offset, (span[0], span[2]), span[2] - span[1]]
        else:
            units.append((src, offset))
    if run is not None:
        units.append(_run_unit(torch, run))
    return units


def _run_unit(torch, run):
    first, offset, _end, size = run
    n = size // first.element_size()
    return (first if n == first.numel() else torch.as_strided(first, (n,), (1,), first.storage_offset())), offset


def copy_all(buf, units):
    """copy_into for every (src, offset) of copy_units' answer."""
    for src, offset in units:
        copy_into(buf, offset, src)


def wants_pinned_memory(srcs):
    """True when some tensor lives on a CUDA device, so a page-locked arena speeds its copy."""
    torch = sys.modules.get("torch")
    return torch is not None and any(isinstance(s, torch.Tensor) and s.device.type == "cuda" for s in srcs)


def cuda_host_register(addr, size):
    """Page-locks [addr, addr+size) for CUDA's DMA; False where torch has no usable GPU."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return False
    try:
        return int(torch.cuda.cudart().cudaHostRegister(addr, size, 0)) == 0
    except Exception:  # an old or CPU-only build: the copy still works, only slower
        return False


def cuda_host_unregister(addr):
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.cuda.cudart().cudaHostUnregister(addr)


def prepare(name, value):
    """(dtype, global shape, start or None, count, src) for one entry of save()'s dict.

    src is a numpy array (any strides, any byte order) or a torch tensor (any
    strides, any device) whose elements, copied row-major, are the slice's
    bytes (copy_into).
    """
    import numpy as np

    if not isinstance(name, str):
        raise TypeError("tensor names must be str, not %s" % type(name).__name__)
    box = None
    if isinstance(value, Slice):
        box, value = value, value.array
    if type(value) is not np.ndarray and _is_torch(value):
        dt, count, src = _torch_source(name, value)
    else:
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            # np.asarray would quietly turn {"epoch": 3} into an I64 scalar.
            raise TypeError("tensor %r is a %s, not a numpy array or torch tensor (plain values "
                            "belong in metadata= or files=)" % (name, type(value).__name__))
        if value.dtype.hasobject:
            raise TypeError("tensor %r holds Python objects" % (name,))
        dt = _numpy_dtype_name(value.dtype)
        count, src = value.shape, value
    count = tuple(int(c) for c in count)
    if box is None:
        return dt, count, None, count, src
    if len(box.shape) != len(count) or len(box.start) != len(count):
        raise ValueError("tensor %r: slice has %d dimensions but shape has %d and start %d"
                         % (name, len(count), len(box.shape), len(box.start)))
    return dt, box.shape, box.start, count, src
