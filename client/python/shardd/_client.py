# Client and Arena: thin, checked wrappers over libshardd's connection and save calls (errors in _errors.py).
import ctypes
import json
import os

from . import _lib
from ._errors import ShardError, _bytes, _error, _text, parse_size
from ._lib import Result, SaveOpts, TensorDesc
from ._tensors import dtype_name

__all__ = ["Client", "Arena", "place"]

_INT_MAX = 2**31 - 1


def _deadline(seconds, name):
    """A begin deadline for the C struct: 0 the daemon's default, -1 never."""
    if seconds is None:
        return 0
    if seconds < 0:
        raise ValueError("%s must be None or >= 0 seconds" % name)
    return min(max(1, int(seconds)), _INT_MAX) if seconds else -1


def _timeout_ms(timeout):
    """Seconds (None: forever) to libshardd's int milliseconds (< 0: forever)."""
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be None or >= 0 seconds")
    return min(int(round(timeout * 1000)), _INT_MAX)


def _dims(values, what):
    values = tuple(int(v) for v in values)
    if values and min(values) < 0:
        raise ValueError("%s[%d] must not be negative" % (what, next(i for i, v in enumerate(values) if v < 0)))
    return (ctypes.c_uint64 * len(values))(*values)


# dtype as given -> its safetensors name as bytes: save() describes tens of thousands of tensors of a few dtypes.
_DTYPE_ASCII = {}


def _dtype_ascii(dtype):
    try:
        return _DTYPE_ASCII[dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype object
        pass
    name = dtype_name(dtype).encode("ascii")
    if isinstance(dtype, str):
        _DTYPE_ASCII[dtype] = name
    return name


def _desc(name, dtype, shape, start, count, index):
    """A TensorDesc plus the ctypes objects it points into (keep them alive together)."""
    shape = _dims(shape, "shape")
    keep = [_bytes(name, "tensor name"), _dtype_ascii(dtype), shape]
    d = TensorDesc(keep[0], keep[1], len(shape), shape, None, None, -1 if index is None else int(index))
    if (start is None) != (count is None):
        raise ValueError("tensor %r: give both start and count, or neither" % (name,))
    if start is not None:
        start, count = _dims(start, "start"), _dims(count, "count")
        if len(start) != len(shape) or len(count) != len(shape):
            raise ValueError("tensor %r: start and count need %d entries each" % (name, len(shape)))
        keep += [start, count]
        d.start, d.count = start, count
    return d, keep


# TensorDesc's layout as a numpy record, so that tens of thousands are filled a column at a time.
def _desc_record():
    import numpy as np

    kinds = {"name": np.uint64, "dtype": np.uint64, "ndim": np.int32, "shape": np.uint64, "start": np.uint64,
             "count": np.uint64, "index": np.int64}
    names = [f[0] for f in TensorDesc._fields_]
    return np.dtype({"names": names, "formats": [kinds[n] for n in names],
                     "offsets": [getattr(TensorDesc, n).offset for n in names], "itemsize": ctypes.sizeof(TensorDesc)})


def _addr(b):
    """The address of a bytes object's (NUL-terminated) text; valid while b lives."""
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value


class _Descs:
    """TensorDescs of (name, dtype, shape, start, count, index) tuples, with what they point into.

    Built as one numpy record array over one text of all the names and one array of all the
    dims: what each slice costs here is a few list appends, not ctypes objects.
    """

    def __init__(self, slices):
        import numpy as np

        slices = list(slices)
        names, dtypes, ndims, dims, boxed, index = [], [], [], [], [], []
        for name, dtype, shape, start, count, idx in slices:
            names.append(_bytes(name, "tensor name"))
            dtypes.append(_dtype_ascii(dtype))
            at = len(dims)
            dims.extend(shape)
            ndim = len(dims) - at
            ndims.append(ndim)
            if (start is None) != (count is None):
                raise ValueError("tensor %r: give both start and count, or neither" % (name,))
            if start is not None:
                dims.extend(start)
                dims.extend(count)
                if len(dims) - at != 3 * ndim:
                    raise ValueError("tensor %r: start and count need %d entries each" % (name, ndim))
                boxed.append(len(names) - 1)
            index.append(-1 if idx is None else idx)
        n = self.n = len(names)
        try:
            self._dims = np.array([int(d) for d in dims] or [0], dtype=np.int64)
        except OverflowError:
            raise ValueError("a dimension of a tensor does not fit in 64 bits") from None
        if self._dims.min() < 0:
            self._negative(slices)
        self._text = b"\0".join(names) + b"\0"
        room = np.fromiter(map(len, names), np.uint64, n) + np.uint64(1)  # each name and its NUL
        self._dtypes = {d: _addr(d) for d in set(dtypes)}
        rec = self._rec = np.zeros(max(n, 1), _desc_record())
        rec["name"][:n] = np.uint64(_addr(self._text)) + np.cumsum(room) - room
        rec["dtype"][:n] = [self._dtypes[d] for d in dtypes]
        ndim = np.array(ndims, dtype=np.int64)
        rec["ndim"][:n] = ndim
        # Each slice's dims in order: shape, then (boxed) start and count.
        per = ndim.copy()
        per[boxed] *= 3
        first = np.cumsum(per) - per
        base = np.uint64(self._dims.ctypes.data)
        rec["shape"][:n] = base + first.astype(np.uint64) * np.uint64(8)
        if boxed:
            rec["start"][boxed] = rec["shape"][boxed] + ndim[boxed].astype(np.uint64) * np.uint64(8)
            rec["count"][boxed] = rec["start"][boxed] + ndim[boxed].astype(np.uint64) * np.uint64(8)
        rec["index"][:n] = index
        self.array = ctypes.cast(rec.ctypes.data, ctypes.POINTER(TensorDesc))

    @staticmethod
    def _negative(slices):  # slices: a list here, read twice
        for name, _dtype, shape, start, count, _index in slices:
            for what, values in (("shape", shape), ("start", start), ("count", count)):
                for i, v in enumerate(values or ()):
                    if int(v) < 0:
                        raise ValueError("tensor %r: %s[%d] must not be negative" % (name, what, i))


def _place(descs, max_shard_size=0, base=0):
    """(numpy array of offsets, end) of shardd_place over a _Descs."""
    import numpy as np

    offsets = np.zeros(max(descs.n, 1), np.uint64)
    end = ctypes.c_uint64(0)
    lib = _lib.lib()
    rc = lib.shardd_place(descs.array, descs.n, int(max_shard_size or 0), int(base),
                          offsets.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), ctypes.byref(end))
    if rc:
        raise _error(rc, lib.shardd_last_error(None))
    return offsets[:descs.n], end.value


def place(slices, max_shard_size=0, base=0):
    """Arena offsets for zero-copy writes (shardd_place): ([offset per slice], end).

    slices: (name, dtype, shape, start, count, index) tuples, every slice this
    rank will put in the save; start/count/index may be None. A slice that is a
    whole tensor or a dim-0 piece of at least 64 KiB gets an offset congruent to
    its file offset modulo 4096, as the daemon will plan the files; an
    inner-dimension piece of at least 64 KiB a multiple of 512 (its rows can
    then be gathered into one direct write where the device allows).
    """
    descs = _Descs(slices)
    offsets, end = _place(descs, max_shard_size, base)
    return offsets.tolist(), end


def _buffer(data):
    """(pointer, length, owner) of a C-contiguous bytes-like object."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, bytes):
        # bytes never move, so their address is good for as long as `data` lives.
        return (ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p) if data else None), len(data), data
    if type(data).__module__ == "numpy" and hasattr(data, "ctypes"):
        # numpy dtypes like bfloat16 have no buffer-protocol format; the address does.
        if not data.flags.c_contiguous:
            raise ValueError("data must be C-contiguous")
        return (data.ctypes.data if data.nbytes else None), data.nbytes, data
    mv = memoryview(data)
    if not mv.c_contiguous:
        raise ValueError("data must be C-contiguous")
    n = mv.nbytes
    if n == 0:
        return None, 0, mv
    if mv.readonly:
        # ctypes will not take the address of read-only memory, so pin a copy.
        b = mv.tobytes()
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p), n, b
    flat = mv.cast("B")
    c = (ctypes.c_char * n).from_buffer(flat)
    return ctypes.addressof(c), n, (flat, c)


class _Segment:
    """One shardd_arena. Unmapped when the last object that can reach its memory is gone."""

    def __init__(self, ptr):
        self.ptr = ptr
        self.cuda_registered = None  # the address CUDA page-locked, if any

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        pinned, self.cuda_registered = self.cuda_registered, None
        try:
            if pinned:
                from ._tensors import cuda_host_unregister

                cuda_host_unregister(pinned)
            if ptr:
                _lib.lib().shardd_arena_destroy(ptr)
        except Exception:  # interpreter shutdown: the OS reclaims the mapping
            pass


class Arena:
    """Shared memory attached to the daemon through one Client: a memfd sealed
    against shrinking, passed over the socket (or, with SHARDD_ARENA=shm in the
    environment, a POSIX shm segment attached by name).

    `buffer` is a writable memoryview and `array` a writable numpy uint8 view
    of it. Views keep the memory mapped even after close(); the segment is
    unmapped (unlinked) and detached once the arena and every view are gone.
    """

    def __init__(self, client, size):
        self._client = client
        self._seg = None
        self._mv = None
        self.last_save = None  # the save that last read from this arena, if any
        self._create(size)

    def _create(self, size):
        size = int(size)
        if size < 1:
            raise ValueError("arena size must be at least 1 byte")
        c = self._client._handle()
        lib = _lib.lib()
        out = ctypes.c_void_p()
        rc = lib.shardd_arena_create(c, size, ctypes.byref(out))
        if rc:
            raise _error(rc, lib.shardd_last_error(c))
        seg = _Segment(out.value)
        addr = lib.shardd_arena_data(seg.ptr)
        self._size = lib.shardd_arena_size(seg.ptr)
        self._name = _text(lib.shardd_arena_name(seg.ptr))
        # A ctypes subclass can carry the segment, so every memoryview and
        # numpy array made from it keeps the mapping alive.
        cls = type("_ArenaBytes", (ctypes.c_ubyte * self._size,), {})
        raw = cls.from_address(addr)
        raw._segment = seg
        self._addr = addr
        self._seg = seg
        self._mv = memoryview(raw).cast("B")
        self.last_save = None

    def _check(self):
        if self._mv is None:
            raise ValueError("arena is closed")

    @property
    def client(self):
        return self._client

    @property
    def size(self):
        self._check()
        return self._size

    @property
    def name(self):
        """"memfd:shardd-PID-N" (or the POSIX shm name with SHARDD_ARENA=shm), for logs."""
        self._check()
        return self._name

    @property
    def buffer(self):
        """A writable memoryview (format 'B') of the whole segment."""
        self._check()
        return self._mv

    @property
    def array(self):
        """A writable numpy uint8 view of the whole segment."""
        return self.view()

    def view(self, dtype="uint8", shape=None, offset=0):
        """A writable numpy view of the segment: `shape` elements of `dtype` from byte `offset`."""
        import numpy as np

        self._check()
        dtype = np.dtype(dtype)
        if shape is None:
            shape = ((self._size - offset) // dtype.itemsize,)
        return np.ndarray(shape, dtype=dtype, buffer=self._mv, offset=offset)

    def pin(self):
        """Page-locks the segment for CUDA's DMA when torch sees a GPU; returns whether it is.

        save() does this itself before copying a CUDA tensor. Without a GPU (or
        without torch) nothing is registered and copies go through pageable memory.
        """
        self._check()
        if not self._seg.cuda_registered:
            from ._tensors import cuda_host_register

            if cuda_host_register(self._addr, self._size):
                self._seg.cuda_registered = self._addr
        return bool(self._seg.cuda_registered)

    @property
    def pinned(self):
        """Whether CUDA has page-locked this segment (Arena.pin)."""
        self._check()
        return bool(self._seg.cuda_registered)

    def resize(self, size):
        """Replaces the segment by a new one of `size` bytes; the old bytes are not kept.

        Safe while a save still reads the old segment: the daemon keeps its
        own mapping, and views of the old memory stay valid.
        """
        self._check()
        self._release()
        self._create(size)

    def wait_released(self, timeout=None):
        """Blocks until the last save that read from this arena no longer needs it.

        Write `buffer` or `array` again only after this: from seal until then the
        daemon reads them as it writes the checkpoint."""
        if self.last_save is not None:
            self._client.wait_released(self.last_save, timeout)
            self.last_save = None

    def _release(self):
        self._mv = None
        self._seg = None

    def close(self):
        """Drops the arena; the memory goes once no numpy view or memoryview of it remains."""
        self._release()

    @property
    def closed(self):
        return self._mv is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._mv is None:
            return "<shardd.Arena closed>"
        return "<shardd.Arena %s %d bytes>" % (self._name, self._size)


class Client:
    """One connection to the node's shardd. Use it from one thread at a time.

    socket: the daemon's Unix socket; None means $SHARDD_SOCKET, else
    /run/shardd/shardd.sock. Every method raises ShardError on failure.
    Timeouts are in seconds, None waiting forever.
    """

    def __init__(self, socket=None):
        self._c = None
        lib = _lib.lib()
        out = ctypes.c_void_p()
        rc = lib.shardd_connect(None if socket is None else _bytes(socket, "socket"), ctypes.byref(out))
        if rc:
            raise _error(rc, lib.shardd_last_error(None))
        self._c = out.value
        self.socket = socket

    # ---- connection -------------------------------------------------------

    def _handle(self):
        if not self._c:
            raise ValueError("client is closed")
        return self._c

    def _check(self, rc):
        if rc:
            raise _error(rc, _lib.lib().shardd_last_error(self._c))

    @property
    def node(self):
        """Host name the daemon reported."""
        return _text(_lib.lib().shardd_node_name(self._handle()))

    @property
    def closed(self):
        return not self._c

    def close(self):
        """Closes the connection. Arenas keep their memory; saves already sealed still commit."""
        c, self._c = self._c, None
        if c:
            _lib.lib().shardd_close(c)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<shardd.Client %s>" % ("closed" if not self._c else self.node)

    # ---- arenas -----------------------------------------------------------

    def arena(self, size):
        """A new shared-memory arena of `size` bytes, attached through this client."""
        return Arena(self, size)

    # ---- saves ------------------------------------------------------------

    def begin(self, save, dir, rank=0, world_size=1, max_shard_size=None, prefix=None,
              metadata=None, overwrite=False, nnodes=1, node_rank=0, leader=None, write_mode=None,
              keep_last=None, join_timeout=None, idle_timeout=None, total_parameters=None):
        """Joins (or creates) save `save`, writing to `dir` under the daemon's root.

        A save spanning nodes (one shardd per node, peers over TCP) gives
        nnodes > 1, this rank's node_rank, the leader ("host:port" of node 0's
        shardd peer listener) and optionally write_mode ("owner", "shared"),
        the same on every rank. shardd.nodes_from_env() reads them from torchrun's
        environment.

        keep_last=N: once this save commits, the caller's older checkpoints in
        the same parent folder beyond the newest N are deleted (as delete()
        does); the same N on every rank.

        join_timeout / idle_timeout (seconds; None: the daemon's defaults, 0:
        never): the save fails with "timeout" when not every rank has begun
        this long after the first, or when its unsealed ranks all stay silent
        this long. The first rank's begin sets them.

        total_parameters: what the index's metadata.total_parameters says, the
        same on every rank (None: the elements of every tensor saved); at
        most those elements, else the save fails at seal with invalid_argument.
        """
        keep = []
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                      or keep_last < 1):
            raise ValueError("keep_last must be a whole number of at least 1, got %r" % (keep_last,))
        if total_parameters is not None and (isinstance(total_parameters, bool) or
                                             not isinstance(total_parameters, int) or total_parameters < 1):
            raise ValueError("total_parameters must be a whole number of at least 1, got %r" % (total_parameters,))
        nnodes, node_rank = int(nnodes or 1), int(node_rank or 0)
        if nnodes > 1 and not leader:
            raise ValueError("begin: nnodes is %d but no leader (node 0's shardd HOST:PORT) is given"
                             % nnodes)
        opts = SaveOpts(_bytes(save, "save"), _bytes(os.fspath(dir), "dir"), int(rank), int(world_size),
                        parse_size(max_shard_size) or 0, None if prefix is None else _bytes(prefix, "prefix"),
                        None, 0, 1 if overwrite else 0, nnodes, node_rank,
                        None if leader is None else _bytes(leader, "leader"),
                        None if write_mode is None else _bytes(write_mode, "write_mode"),
                        keep_last or 0,
                        _deadline(join_timeout, "join_timeout"), _deadline(idle_timeout, "idle_timeout"),
                        total_parameters or 0)
        if metadata:
            flat = []
            for k, v in metadata.items():
                flat += [_bytes(k, "metadata key"), _bytes(v, "metadata value %r" % (k,))]
            arr = (ctypes.c_char_p * len(flat))(*flat)
            keep.append(arr)
            opts.metadata = arr
            opts.nmetadata = len(metadata)
        self._check(_lib.lib().shardd_begin(self._handle(), ctypes.byref(opts)))

    def _arena_ptr(self, arena):
        if not isinstance(arena, Arena) or arena.client is not self:
            raise ValueError("arena must be an Arena made by this client")
        arena._check()
        return arena._seg.ptr

    def put(self, save, name, dtype, shape, arena, offset, start=None, count=None, index=None):
        """Puts a slice whose bytes (row-major, box-shaped) are already at `offset` in `arena`.

        dtype: a safetensors name ("F32", "BF16") or a numpy dtype. shape:
        the global shape; start/count: the slice box (None: whole tensor).
        index: position in the state dict (None: natural name order).
        """
        d, keep = _desc(name, dtype, shape, start, count, index)
        ptr = self._arena_ptr(arena)
        self._check(_lib.lib().shardd_put(self._handle(), _bytes(save, "save"), ctypes.byref(d), ptr,
                                          int(offset)))
        arena.last_save = save
        del keep

    def put_copy(self, save, name, dtype, shape, arena, offset, data, start=None, count=None,
                 index=None):
        """Copies `data` (bytes-like, C-contiguous) to `offset` in `arena`, then puts it."""
        d, keep = _desc(name, dtype, shape, start, count, index)
        ptr = self._arena_ptr(arena)
        src, n, owner = _buffer(data)
        self._check(_lib.lib().shardd_put_copy(self._handle(), _bytes(save, "save"), ctypes.byref(d),
                                               ptr, int(offset), src, n))
        arena.last_save = save
        del keep, owner

    def put_inline(self, save, name, dtype, shape, data, start=None, count=None, index=None):
        """Sends the bytes inside the request (base64): for small tensors."""
        d, keep = _desc(name, dtype, shape, start, count, index)
        src, n, owner = _buffer(data)
        self._check(_lib.lib().shardd_put_inline(self._handle(), _bytes(save, "save"), ctypes.byref(d),
                                                 src, n))
        del keep, owner

    def file(self, save, path, data, part=False):
        """A plain file (config.json, ...) written beside the shards; str data is UTF-8. part=True:
        this rank's part of the file, which holds every rank's part in rank order."""
        src, n, owner = _buffer(data)
        fn = _lib.lib().shardd_file_part if part else _lib.lib().shardd_file
        self._check(fn(self._handle(), _bytes(save, "save"), _bytes(path, "path"), src, n))
        del owner

    def put_deferred(self, save, name, dtype, shape, arena, offset, start=None, count=None,
                     index=None):
        """Streaming: puts a slice whose bytes will be at `offset` in `arena` later.

        Put every slice this way, call declared(), then fill the arena front to
        back calling ready(save, arena, upto) as it fills; seal() says it is all
        there. The daemon writes while this rank copies.
        """
        d, keep = _desc(name, dtype, shape, start, count, index)
        ptr = self._arena_ptr(arena)
        self._check(_lib.lib().shardd_put_deferred(self._handle(), _bytes(save, "save"),
                                                   ctypes.byref(d), ptr, int(offset)))
        arena.last_save = save
        del keep

    def put_many(self, save, arena, slices, deferred=False):
        """Puts many slices at once: many to a request line, without waiting for each answer.

        slices: (name, dtype, shape, offset[, start, count[, index]]) tuples whose bytes
        are (deferred=True: will be) at offset in arena. Raises on the first refusal;
        the error's `index` attribute says which slice (the slices before it were put).
        """
        import numpy as np

        slices = list(slices)
        descs = _Descs((sl[0], sl[1], sl[2], sl[4] if len(sl) > 5 else None, sl[5] if len(sl) > 5 else None,
                        sl[6] if len(sl) > 6 else None) for sl in slices)
        offsets = np.array([int(sl[3]) for sl in slices] or [0], dtype=np.uint64)
        self._put_descs(save, arena, descs, offsets, deferred)

    def _put_descs(self, save, arena, descs, offsets, deferred=False, prefix=None):
        """put_many of a _Descs whose bytes are at `offsets` (a numpy uint64 array) in arena; with
        prefix, into files of that prefix (a file series of their own)."""
        ptr = self._arena_ptr(arena)
        failed = ctypes.c_size_t(0)
        rc = _lib.lib().shardd_put_many_prefix(self._handle(), _bytes(save, "save"),
                                               None if prefix is None else _bytes(prefix, "prefix"), descs.array,
                                               offsets.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), descs.n,
                                               ptr, 1 if deferred else 0, ctypes.byref(failed))
        try:
            self._check(rc)
        except ShardError as e:
            e.index = failed.value
            raise
        arena.last_save = save

    def declared(self, save):
        """This rank puts nothing more and sends no more files in `save`."""
        self._check(_lib.lib().shardd_declared(self._handle(), _bytes(save, "save")))

    def ready(self, save, arena, upto):
        """The bytes of this rank's deferred puts in `arena` below offset `upto` are in place."""
        ptr = self._arena_ptr(arena)
        self._check(_lib.lib().shardd_ready(self._handle(), _bytes(save, "save"), ptr, int(upto)))

    def seal(self, save):
        """This rank has put everything."""
        self._check(_lib.lib().shardd_seal(self._handle(), _bytes(save, "save")))

    def wait(self, save, timeout=None, abort=False):
        """Blocks until the save ends. Returns {'state', 'save', 'dir', 'files', 'tensors', 'bytes'}.

        On a timeout (ShardError "timeout") the save goes on and a later wait
        picks it up again; with abort=True it is aborted first (for every
        rank, nothing published) and the error says so.
        """
        r = Result()
        fn = _lib.lib().shardd_wait_or_abort if abort else _lib.lib().shardd_wait
        self._check(fn(self._handle(), _bytes(save, "save"), _timeout_ms(timeout), ctypes.byref(r)))
        return {"state": "committed", "save": save, "dir": _text(r.dir), "files": r.files,
                "tensors": r.tensors, "bytes": r.bytes}

    def wait_released(self, save, timeout=None):
        """Blocks until the daemon will never read this rank's memory for `save` again."""
        self._check(_lib.lib().shardd_wait_released(self._handle(), _bytes(save, "save"),
                                                    _timeout_ms(timeout)))

    def abort(self, save):
        """Fails the save for every rank; nothing is published."""
        self._check(_lib.lib().shardd_abort(self._handle(), _bytes(save, "save")))

    def delete(self, dir):
        """Deletes the checkpoint `dir` (under the daemon's root, or absolute beneath it) this uid committed.

        Atomic: the folder is renamed away, then removed by the daemon. Raises
        ShardError: bad_path, not_found, not_a_checkpoint (not written by
        shardd), permission_denied (another uid committed it), conflict (a
        save is writing to it).
        """
        self._check(_lib.lib().shardd_delete(self._handle(), _bytes(os.fspath(dir), "dir")))

    def status(self):
        """The daemon's status: {'saves': [...], 'clients', 'regions', 'totals': {...}}."""
        lib = _lib.lib()
        out = ctypes.c_void_p()
        self._check(lib.shardd_status(self._handle(), ctypes.byref(out)))
        try:
            return json.loads(ctypes.string_at(out.value).decode("utf-8"))
        finally:
            lib.shardd_free(out.value)
