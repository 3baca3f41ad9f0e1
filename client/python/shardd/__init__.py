# shardd: hand tensors to the node's shardd daemon from Python (ctypes over libshardd, nothing to compile).
"""Python binding of libshardd.

    import numpy as np, shardd
    shardd.save({"embed.weight": np.ones((4, 8), np.float32)}, "run1/step-100")
    weights = shardd.load("/ckpt/run1/step-100")

libshardd is found through $LIBSHARDD, else the path `pip install` recorded,
else the linker's search path, else beside this package. The daemon's
socket is $SHARDD_SOCKET unless given.
Low-level calls mirror include/shardd/shardd.h: Client(socket).begin / put /
put_copy / put_inline / file / seal / wait / wait_released / abort / delete / status,
Client.arena(size) for shared memory, and Checkpoint(path) to read one back.
Every failure raises ShardError with the stable error name (.name) and the
daemon's or reader's message.
"""

from ._arena_pool import release_arenas
from ._client import Arena, Client, place
from ._errors import ShardError, error_names, parse_size
from ._lib import library_path
from ._load import Checkpoint, TensorInfo, load, load_slices
from ._save import PendingSave, default_save_id, delete, nodes_from_env, save, torchrun_env
from ._tensors import DTYPES, Slice, dtype_name

__version__ = "0.1.0"

__all__ = [
    "Arena", "Client", "ShardError", "PendingSave", "Slice", "Checkpoint", "TensorInfo",
    "save", "delete", "load", "load_slices", "torchrun_env", "nodes_from_env", "default_save_id", "dtype_name",
    "error_names", "library_path", "parse_size", "place", "release_arenas", "DTYPES",
]
