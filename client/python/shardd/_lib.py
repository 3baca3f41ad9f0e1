# Finds and loads libshardd with ctypes, and declares the C API of include/shardd/shardd.h.
import ctypes
import ctypes.util
import os
import threading

__all__ = ["lib", "SaveOpts", "TensorDesc", "Result", "TensorInfo", "library_path"]


class SaveOpts(ctypes.Structure):
    _fields_ = [
        ("save", ctypes.c_char_p),
        ("dir", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("max_shard_size", ctypes.c_uint64),
        ("prefix", ctypes.c_char_p),
        ("metadata", ctypes.POINTER(ctypes.c_char_p)),
        ("nmetadata", ctypes.c_size_t),
        ("overwrite", ctypes.c_int),
        ("nnodes", ctypes.c_int),
        ("node_rank", ctypes.c_int),
        ("leader", ctypes.c_char_p),
        ("write_mode", ctypes.c_char_p),
        ("keep_last", ctypes.c_int),
        ("join_timeout", ctypes.c_int),
        ("idle_timeout", ctypes.c_int),
        ("total_parameters", ctypes.c_int64),
    ]


class TensorDesc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("start", ctypes.POINTER(ctypes.c_uint64)),
        ("count", ctypes.POINTER(ctypes.c_uint64)),
        ("index", ctypes.c_int64),
    ]


class Result(ctypes.Structure):
    _fields_ = [
        ("dir", ctypes.c_char * 4096),
        ("files", ctypes.c_uint64),
        ("tensors", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
    ]


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("nbytes", ctypes.c_uint64),
        ("file", ctypes.c_char_p),
    ]


_p = ctypes.c_void_p
_s = ctypes.c_char_p
_i = ctypes.c_int
_sz = ctypes.c_size_t
_u64 = ctypes.c_uint64
_desc = ctypes.POINTER(TensorDesc)

# name: (restype, argtypes). Declared explicitly so a pointer is never
# truncated to a C int and a wrong argument fails in Python, not in C.
_PROTOTYPES = {
    "shardd_strerror": (_s, [_i]),
    "shardd_err_name": (_s, [_i]),
    "shardd_err_from_name": (_i, [_s]),
    "shardd_connect": (_i, [_s, ctypes.POINTER(_p)]),
    "shardd_close": (None, [_p]),
    "shardd_last_error": (_s, [_p]),
    "shardd_node_name": (_s, [_p]),
    "shardd_arena_create": (_i, [_p, _sz, ctypes.POINTER(_p)]),
    "shardd_arena_data": (_p, [_p]),
    "shardd_arena_size": (_sz, [_p]),
    "shardd_arena_name": (_s, [_p]),
    "shardd_arena_destroy": (_i, [_p]),
    "shardd_begin": (_i, [_p, ctypes.POINTER(SaveOpts)]),
    "shardd_save_opts_from_env": (_i, [ctypes.POINTER(SaveOpts), _p, _sz]),
    "shardd_put": (_i, [_p, _s, _desc, _p, _u64]),
    "shardd_put_copy": (_i, [_p, _s, _desc, _p, _u64, _p, _sz]),
    "shardd_put_inline": (_i, [_p, _s, _desc, _p, _sz]),
    "shardd_file": (_i, [_p, _s, _s, _p, _sz]),
    "shardd_file_part": (_i, [_p, _s, _s, _p, _sz]),
    "shardd_seal": (_i, [_p, _s]),
    "shardd_put_deferred": (_i, [_p, _s, _desc, _p, _u64]),
    "shardd_place": (_i, [_desc, _sz, _u64, _u64, ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
    "shardd_put_many": (_i, [_p, _s, _desc, ctypes.POINTER(_u64), _sz, _p, _i, ctypes.POINTER(_sz)]),
    "shardd_put_many_prefix": (_i, [_p, _s, _s, _desc, ctypes.POINTER(_u64), _sz, _p, _i, ctypes.POINTER(_sz)]),
    "shardd_declared": (_i, [_p, _s]),
    "shardd_ready": (_i, [_p, _s, _p, _u64]),
    "shardd_wait": (_i, [_p, _s, _i, ctypes.POINTER(Result)]),
    "shardd_wait_or_abort": (_i, [_p, _s, _i, ctypes.POINTER(Result)]),
    "shardd_wait_released": (_i, [_p, _s, _i]),
    "shardd_abort": (_i, [_p, _s]),
    "shardd_delete": (_i, [_p, _s]),
    "shardd_status": (_i, [_p, ctypes.POINTER(_p)]),
    "shardd_free": (None, [_p]),
    "shardd_ckpt_open": (_i, [_s, ctypes.POINTER(_p)]),
    "shardd_ckpt_close": (None, [_p]),
    "shardd_ckpt_count": (_sz, [_p]),
    "shardd_ckpt_tensor": (_i, [_p, _sz, ctypes.POINTER(TensorInfo)]),
    "shardd_ckpt_find": (_i, [_p, _s, ctypes.POINTER(_sz)]),
    "shardd_ckpt_read": (_i, [_p, _s, ctypes.POINTER(_u64), ctypes.POINTER(_u64), _p, _sz]),
    "shardd_ckpt_verify": (_i, [_p]),
}

_LIB_NAMES = ("libshardd.so", "libshardd.so.0")

_lock = threading.Lock()
_loaded = None
_loaded_path = None


def _recorded_path():
    """The libshardd `pip install` found (setup.py writes _install.py); None for other installs."""
    try:
        from ._install import LIBSHARDD
    except ImportError:
        return None
    return LIBSHARDD or None


def _candidates():
    """Where to look, in order: $LIBSHARDD, the path recorded at install, the linker's search,
    then beside the package."""
    env = os.environ.get("LIBSHARDD")
    if env:
        # An explicit choice must not silently fall back to another copy.
        return [env], True
    # The copy pip was pointed at wins over whatever else the linker finds.
    out = []
    recorded = _recorded_path()
    if recorded:
        out.append(recorded)
    found = ctypes.util.find_library("shardd")
    if found:
        out.append(found)
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, os.path.dirname(here)):
        out.extend(os.path.join(d, n) for n in _LIB_NAMES)
    return out, False


def _load():
    global _loaded, _loaded_path
    tried = []
    paths, explicit = _candidates()
    for path in paths:
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            if explicit:
                break
            continue
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _loaded, _loaded_path = handle, path
        return handle
    hint = "" if explicit else "; set LIBSHARDD to the path of libshardd.so"
    raise OSError("cannot load libshardd: tried " + (", ".join(tried) or "nothing") + hint)


def lib():
    """The loaded library, loading it on first use so `import shardd` never needs it."""
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        return _load()


def library_path():
    """Path (or soname) libshardd was loaded from."""
    lib()
    return _loaded_path
