# save(): one rank's part of a checkpoint in one call, and the torchrun topology it defaults to.
from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import mmap
import os
import re
import threading
import time
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple, Union

from . import _arena_pool, _lib
from ._client import Arena, Client, _Descs, _place
from ._errors import ShardError, _error, parse_size, refusal
from ._lib import SaveOpts
from ._tensors import Slice, _span, check_shared_memory, copy_all, copy_units, prepare, wants_pinned_memory

# progress(bytes_written, bytes_total), called from the waiting thread.
Progress = Callable[[int, int], None]
# Seconds between status polls while a progress callback is given.
_PROGRESS_INTERVAL = 0.1

__all__ = ["save", "paused_gc", "PendingSave", "torchrun_env", "nodes_from_env", "default_save_id"]

_SAVE_ID_OK = re.compile(r"[A-Za-z0-9_.:@+=-]+\Z")
_SAVE_ID_BAD = re.compile(r"[^A-Za-z0-9_.:@+=-]")


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector held off while a save describes its tensors: every
    tensor makes a few objects, and with tens of thousands the collector's full passes over a
    process holding a model (and transformers) took more time than the save's own work (4 of
    9 s of a DeepSeek-V3-shaped model's hand-over). What it would have collected is collected
    once it runs again. A collector someone else turned off stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _env_int(env, key):
    v = env.get(key)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError("environment variable %s=%r is not an integer" % (key, v)) from None


def torchrun_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Optional[Any]]:
    """The job's topology as torchrun (torch.distributed.run) describes it in the environment.

    Keys: rank, world_size, local_rank, local_world_size, nnodes, node_rank,
    master_addr, master_port; None for whatever is not set. torchrun itself
    exports GROUP_RANK and GROUP_WORLD_SIZE for the node; NODE_RANK and
    NNODES, as other launchers set them, win when present.
    """
    env = os.environ if environ is None else environ
    out = {
        "rank": _env_int(env, "RANK"),
        "world_size": _env_int(env, "WORLD_SIZE"),
        "local_rank": _env_int(env, "LOCAL_RANK"),
        "local_world_size": _env_int(env, "LOCAL_WORLD_SIZE"),
        "nnodes": _env_int(env, "NNODES"),
        "node_rank": _env_int(env, "NODE_RANK"),
        "master_addr": env.get("MASTER_ADDR") or None,
        "master_port": _env_int(env, "MASTER_PORT"),
    }
    if out["nnodes"] is None:
        out["nnodes"] = _env_int(env, "GROUP_WORLD_SIZE")
    if out["node_rank"] is None:
        out["node_rank"] = _env_int(env, "GROUP_RANK")
    if out["nnodes"] is None and out["world_size"] and out["local_world_size"]:
        out["nnodes"] = out["world_size"] // out["local_world_size"]
    return out


def default_save_id(dir: str) -> str:
    """A save id every rank derives alike from the destination.

    The dir itself (slashes as ':') when that is a valid id; otherwise a
    readable prefix plus a hash, so different dirs never share an id.
    """
    readable = dir.strip("/").replace("/", ":")
    if (":" not in dir and _SAVE_ID_OK.match(readable) and not readable.startswith(".")
            and len(readable) <= 128):
        return readable
    digest = hashlib.sha256(dir.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    prefix = _SAVE_ID_BAD.sub("_", readable).lstrip(".")[:100]
    return (prefix + "-" if prefix else "save-") + digest


def nodes_from_env() -> Dict[str, Any]:
    """The multi-node topology of a torchrun-style environment, read by libshardd.

    Returns {rank, world_size, nnodes, node_rank, leader} exactly as
    shardd_save_opts_from_env reads them: RANK and WORLD_SIZE (required),
    NNODES (else GROUP_WORLD_SIZE, else WORLD_SIZE / LOCAL_WORLD_SIZE), NODE_RANK
    (else GROUP_RANK), and the leader as $SHARDD_LEADER, else
    $MASTER_ADDR:$SHARDD_PEER_PORT (default port 7077); leader is None on one
    node. Raises ShardError (invalid_argument) naming the missing or malformed
    variable.
    """
    lib = _lib.lib()
    opts = SaveOpts()
    leader = ctypes.create_string_buffer(1024)
    rc = lib.shardd_save_opts_from_env(ctypes.byref(opts), leader, len(leader))
    if rc:
        raise _error(rc, lib.shardd_last_error(None))
    return {"rank": opts.rank, "world_size": opts.world_size, "nnodes": opts.nnodes,
            "node_rank": opts.node_rank,
            "leader": opts.leader.decode("utf-8", "surrogateescape") if opts.leader else None}


def _topology(rank, world_size, nnodes, node_rank, leader):
    """{rank, world_size, nnodes, node_rank, leader}: what the caller gave, else the environment.

    Given rank and world_size, the environment is not read at all. Otherwise a
    torchrun environment spanning nodes is read as libshardd reads it, and a
    one-node one defaults to $RANK/$WORLD_SIZE, else 0/1.
    """
    topo = {"rank": rank, "world_size": world_size, "nnodes": None, "node_rank": None,
            "leader": None}
    if rank is None or world_size is None:
        env = torchrun_env()
        if (env["nnodes"] or 1) > 1 and (nnodes is None or nnodes > 1):
            topo = nodes_from_env()
            topo.update({k: v for k, v in (("rank", rank), ("world_size", world_size))
                         if v is not None})
        else:
            topo["rank"] = rank if rank is not None else (env["rank"] or 0)
            topo["world_size"] = (world_size if world_size is not None
                                  else env["world_size"] if env["world_size"] is not None else 1)
    for key, value in (("nnodes", nnodes), ("node_rank", node_rank), ("leader", leader)):
        if value is not None:
            topo[key] = value
    topo["nnodes"] = int(topo["nnodes"] or 1)
    topo["node_rank"] = int(topo["node_rank"] or 0)
    topo["rank"], topo["world_size"] = int(topo["rank"]), int(topo["world_size"])
    return topo


# This process's saves still being handed over in the background (save(..., wait=False)): a
# later save waits for them first, so that a pooled connection and arena serve one at a time.
_handovers: "list[_HandOver]" = []
_handovers_lock = threading.Lock()  # saves from several threads share the list


class _HandOver(threading.Thread):
    """The rest of a wait=False save's hand-over once its bytes are in the arena: the puts, the
    files and the seal. Describing tens of thousands of slices costs the daemon a round of work
    on every rank's lines (a DeepSeek-V3-shaped model's 45,395 tensors); the caller need not
    wait for it. Releases the pooled lane when done; `error` is what it raised."""

    def __init__(self, rest, lane):
        super().__init__(name="shardd-handover", daemon=False)
        self._rest, self._lane = rest, lane
        self.error: Optional[BaseException] = None

    def run(self):
        try:
            self._rest()
        except BaseException as e:  # kept for the waiter: a thread has nobody to raise to
            self.error = e
        finally:
            self._rest = None
            self._lane.lock.release()


def _join_handovers() -> None:
    # Joined outside the lock (a hand-over may take a while); only finished ones are dropped, so a
    # thread never drops one another thread has not seen end.
    with _handovers_lock:
        pending = list(_handovers)
    for handover in pending:
        handover.join()
    with _handovers_lock:
        _handovers[:] = [h for h in _handovers if h.is_alive()]


class PendingSave:
    """A save this rank has handed over but not waited for (save(..., wait=False)).

    Future-like: done(), result(timeout) and exception(timeout) behave as
    concurrent.futures.Future's do (TimeoutError when the save is still
    running); wait(timeout) is result() raising ShardError("timeout") instead.
    """

    def __init__(self, client: Optional[Client], save_id: str, arena: Optional[Arena], owns_client: bool,
                 progress: Optional[Progress] = None, pool=None, handover: Optional[_HandOver] = None):
        self._client = client
        self._handover = handover  # the background rest of the hand-over, if any
        self.save_id = save_id
        self.arena = arena
        self._owns = owns_client
        self._progress = progress
        self._pool = pool  # the _arena_pool lane the save was handed over through, if any
        self._result: Optional[Dict[str, Any]] = None
        self._exception: Optional[BaseException] = None
        self._last_progress: Optional[Tuple[int, int]] = None

    @property
    def client(self) -> Client:
        """The connection this save is waited on. A pooled save's is its own, opened at the first
        wait, so that waiting never holds up the pool's connection."""
        if self._client is None:
            self._client = Client(self._pool.socket)
        return self._client

    def _close_owned(self) -> None:
        if self._owns:
            self._owns = False
            if self._client is not None:
                self._client.close()

    def _report(self, written: int, total: int) -> None:
        if self._progress is not None and (written, total) != self._last_progress:
            self._last_progress = (written, total)
            self._progress(written, total)

    def _poll_progress(self) -> None:
        for entry in self.client.status().get("saves", []):
            # Until every rank has declared, the planned bytes still grow: no total to report yet.
            if entry.get("ranks_declared", 0) < entry.get("world_size", 0):
                continue
            if entry.get("save") == self.save_id:
                self._report(int(entry.get("bytes_written", 0)), int(entry.get("bytes_planned", 0)))

    def _wait_once(self, timeout: Optional[float]) -> Dict[str, Any]:
        if self._progress is None:
            return self.client.wait(self.save_id, timeout)
        # The daemon reports progress only in status: poll it between short waits.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = _PROGRESS_INTERVAL if deadline is None else max(0.0, min(_PROGRESS_INTERVAL,
                                                                           deadline - time.monotonic()))
            try:
                result = self.client.wait(self.save_id, step)
            except ShardError as e:
                if e.name != "timeout" or (deadline is not None and time.monotonic() >= deadline):
                    raise
                self._poll_progress()
                continue
            self._report(result["bytes"], result["bytes"])
            return result

    def wait_released(self, timeout: Optional[float] = None) -> None:
        """Blocks until the arena the save read from may be overwritten.

        Until then the daemon reads the arena as it writes: bytes written into it
        meanwhile change what is saved (a change seen under a zero-copy write fails
        the save with ShardError "bad_state" naming the rank)."""
        if self._pool is None:
            self.client.wait_released(self.save_id, timeout)
            return
        # The daemon says so on the connection the save was handed over through.
        with self._pool.lock:
            if self._pool.client is not None and not self._pool.client.closed:
                self._pool.client.wait_released(self.save_id, timeout)

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Blocks until the save ends; returns the result dict or raises ShardError."""
        if self._result is not None:
            return self._result
        if self._exception is not None:
            raise self._exception
        if self._handover is not None:
            began = time.monotonic()
            self._handover.join(timeout)
            if self._handover.is_alive():
                raise refusal("timeout", "save %s: still being handed over after %s s" % (self.save_id, timeout))
            if timeout is not None:  # one timeout for the hand-over and the save together
                timeout = max(0.0, timeout - (time.monotonic() - began))
            error, self._handover = self._handover.error, None
            if error is not None:
                self._exception = error
                self._close_owned()
                raise error
        try:
            self._result = self._wait_once(timeout)
        except ShardError as e:
            if e.name == "timeout":
                raise
            self._exception = e
            self._close_owned()
            raise
        self._close_owned()
        return self._result

    def done(self) -> bool:
        """True once the save has committed or failed; never blocks."""
        if self._result is None and self._exception is None:
            try:
                self.wait(0)
            except ShardError as e:
                if e.name == "timeout":
                    return False
            except Exception as e:  # the hand-over's own error (a bad file value): the save ended
                if e is not self._exception:
                    raise
        return True

    def result(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The result dict; raises the save's ShardError, or TimeoutError while it still runs."""
        try:
            return self.wait(timeout)
        except ShardError as e:
            if e.name == "timeout" and self._exception is None:
                raise TimeoutError("save %s still running after %s s" % (self.save_id, timeout)) from e
            raise

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The save's ShardError, or None once it committed; TimeoutError while it still runs."""
        try:
            self.result(timeout)
        except ShardError:
            return self._exception
        except Exception as e:  # the hand-over's own error is the save's; TimeoutError is not
            if e is not self._exception:
                raise
            return e
        return None

    def __repr__(self) -> str:
        state = ("committed" if self._result is not None else "failed" if self._exception is not None
                 else "pending")
        return "<shardd.PendingSave %s %s>" % (self.save_id, state)


class Prepared(NamedTuple):
    """What save() works out from its tensors before the daemon hears of the save: the copies into
    the arena, the slices' descriptions and their places. save() takes one in place of the tensors
    (with the same max_shard_size and prefix), so that a caller that saves the same tensors again
    (shardd.torch.save_pretrained of one model) need not work it out again; each unit's source is
    read at the save, so it must still be the tensors' memory."""
    units: list  # [(src, offset in the arena), ...] for copy_all
    groups: list  # [(file prefix or None, _Descs, numpy offsets), ...], one per file series
    end: int  # the arena bytes the save needs
    pinned: bool  # whether some source is on a CUDA device (a page-locked arena speeds its copy)
    max_shard_size: int
    prefix: Optional[str]


def prepare_save(tensors: Mapping[str, Any], ordered: Union[bool, Mapping[str, int]] = True,
                 prefixes: Optional[Mapping[str, str]] = None, prefix: Optional[str] = None,
                 max_shard_size: int = 0) -> Prepared:
    """save()'s work on its tensors (see save() for the arguments), refusing what can be refused
    locally (TypeError, ValueError) before the daemon hears of the save."""
    # Offsets by the placement rule, so whole tensors and dim-0 pieces are written
    # straight from the arena (no copy in the daemon); the rest is packed.
    # A list of Slices is several boxes of one tensor (a strided DTensor shard); all share its index.
    if isinstance(ordered, Mapping):
        unplaced = [name for name in tensors if name not in ordered]
        if unplaced:
            raise ValueError("ordered gives no index for %s" % ", ".join(map(repr, unplaced[:5])))
        index = {name: int(ordered[name]) for name in tensors}
    else:
        index = {name: position if ordered else None for position, name in enumerate(tensors)}
    with paused_gc():
        prepared = [(name,) + tuple(prepare(name, part)) + (index[name],)
                    for name, value in tensors.items()
                    for part in (value if _boxes(value) else [value])]
        # The slices of each file series, each placed (and then put) as its own files will hold them,
        # one series after the other in the arena.
        series: Dict[Optional[str], list] = {}
        for slice_ in prepared:
            series.setdefault(_series_of(prefixes, slice_[0], prefix), []).append(slice_)
        groups, items, end = [], [], 0
        for group_prefix, group in series.items():
            descs = _Descs((name, dt, shape, start, None if start is None else count, index)
                           for name, dt, shape, start, count, _src, index in group)
            offsets, end = _place(descs, max_shard_size, -(-end // _SERIES_ALIGN) * _SERIES_ALIGN)
            groups.append((group_prefix, descs, offsets))
            items += [(name, src, offset) for (name, _dt, _shape, _start, _count, src, _index), offset
                      in zip(group, offsets.tolist())]
        spans = [_span(src) for _name, src, _offset in items]
        check_shared_memory([(name, src) for name, src, _offset in items], spans)
        units = copy_units(items, spans)
    return Prepared(units, groups, end, wants_pinned_memory(src for src, _offset in units), max_shard_size, prefix)


def save(tensors: Mapping[str, Any], dir: Union[str, "os.PathLike[str]"], save_id: Optional[str] = None,
         client: Optional[Client] = None, rank: Optional[int] = None, world_size: Optional[int] = None,
         arena: Optional[Arena] = None, max_shard_size: Union[int, str, None] = None,
         metadata: Optional[Mapping[str, str]] = None,
         files: Optional[Mapping[str, Union[bytes, str]]] = None, wait: bool = True,
         timeout: Optional[float] = None, prefix: Optional[str] = None, overwrite: bool = False,
         ordered: Union[bool, Mapping[str, int]] = True, socket: Optional[str] = None, nnodes: Optional[int] = None,
         node_rank: Optional[int] = None, leader: Optional[str] = None,
         write_mode: Optional[str] = None,
         progress: Optional[Progress] = None,
         keep_last: Optional[int] = None, join_timeout: Optional[float] = None,
         idle_timeout: Optional[float] = None,
         total_parameters: Optional[int] = None,
         prefixes: Optional[Mapping[str, str]] = None,
         file_parts: Optional[Mapping[str, Union[bytes, str]]] = None) -> Union[Dict[str, Any], PendingSave]:
    """Saves this rank's tensors into the checkpoint `dir` (relative to the daemon's root).

    tensors: {name: array} in state-dict order, each value a numpy array or
    torch tensor (the whole tensor; any device, any strides), a Slice of a
    global tensor, or a list of Slices (several boxes of one tensor); or a
    Prepared (prepare_save) of such a dict, whose ordered and prefixes it keeps. Every
    rank of the save calls this with the same dir, save_id and world_size. The bytes are copied into `arena` (grown as needed; with neither arena
    nor client, one of this process's two pooled arenas, reused once the daemon has released it,
    see release_arenas; with only a client, a temporary one), put with index = position in the dict (ordered=False: natural name
    order instead, for ranks whose dicts hold different names; a {name: index}
    mapping: those indices, the same on every rank), then sealed.
    Once save() returns (wait=False included) the arrays may change: their
    bytes were copied into the arena. The arena itself is the daemon's until
    the save is released: a caller that writes into it (arena.array) must first
    call PendingSave.wait_released() (a later save() with the same arena waits
    for it); a change the daemon sees under a zero-copy write fails the save
    with ShardError "bad_state" naming the rank.

    rank/world_size default to $RANK/$WORLD_SIZE, else 0/1. Under a torchrun
    environment spanning nodes (NNODES/GROUP_WORLD_SIZE > 1) the save spans
    the nodes' daemons, with the topology nodes_from_env() reads; nnodes,
    node_rank, leader ("host:port" of node 0's peer listener) and write_mode
    ("owner" or "shared") override it.

    dir may be a pathlib.Path. max_shard_size: bytes, or a size string as
    save_pretrained takes it ("5GB", "500MiB"). Values must be numpy arrays
    or torch tensors (TypeError otherwise: plain numbers go in metadata or
    files); two names whose memory overlaps (tied weights) are refused with
    ValueError: save one, tie again after loading.

    metadata: str pairs added to every shard's header; files: {name: bytes or
    str} written beside the shards. prefixes: {tensor name: file prefix} for
    tensors that go in files of their own (PREFIX.safetensors, or
    PREFIX-00001-of-00002.safetensors ...: an optimizer's beside the model's),
    under the one index; every rank gives a tensor the same prefix.
    file_parts: {name: bytes or str}, this rank's part of a file that holds
    every rank's part in rank order (a rank may send none). wait=True returns the result dict;
    wait=False returns a PendingSave. timeout (seconds) applies to each wait;
    when the final wait (wait=True) times out, the save is aborted for every
    rank (nothing is published) and ShardError "timeout" raised, so no save
    is left open in the daemon. join_timeout/idle_timeout, total_parameters (the index's
    metadata.total_parameters): Client.begin.
    progress(bytes_written, bytes_total) is called while waiting, from the
    daemon's status. keep_last=N: after the commit the daemon deletes this
    uid's older checkpoints beside dir beyond the newest N. Raises ShardError.
    """
    dir = os.fspath(dir)
    if not isinstance(dir, str):
        raise TypeError("dir must be str or os.PathLike[str], not %s" % type(dir).__name__)
    max_shard_size = parse_size(max_shard_size)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable(bytes_written, bytes_total)")
    topo = _topology(rank, world_size, nnodes, node_rank, leader)
    topo["write_mode"] = write_mode
    topo["join_timeout"], topo["idle_timeout"] = join_timeout, idle_timeout
    topo["total_parameters"] = total_parameters
    if save_id is None:
        save_id = default_save_id(dir)
    if arena is not None and not isinstance(arena, Arena):
        raise TypeError("arena must be a shardd.Arena")
    if arena is not None and client is not None and arena.client is not client:
        raise ValueError("arena belongs to another client")

    if isinstance(tensors, Prepared):
        prepared = tensors
        if (prepared.max_shard_size, prepared.prefix) != (max_shard_size, prefix) or prefixes is not None:
            raise ValueError("a Prepared save keeps the max_shard_size, prefix and prefixes it was prepared with")
    else:
        prepared = prepare_save(tensors, ordered=ordered, prefixes=prefixes, prefix=prefix,
                                max_shard_size=max_shard_size)
    files = [(path, data, False) for path, data in (files or {}).items()] + \
        [(path, data, True) for path, data in (file_parts or {}).items()]
    end = prepared.end
    args = (save_id, dir, topo, prepared, max_shard_size, prefix, metadata, overwrite, files, keep_last)
    if client is None and arena is None:
        # The default path: this process's pooled connection and arenas (_arena_pool), so a
        # save costs a copy; its wait goes over a connection of its own.
        _join_handovers()
        lane, handover = _run_pooled(socket, end, timeout, args, later=not wait)
        return _finish(PendingSave(None, save_id, None, True, progress, lane, handover), wait, timeout)
    if client is None:
        client = arena.client
    temp_arena = None
    try:
        if arena is None:
            arena = temp_arena = client.arena(max(end, 1))
        else:
            # The arena may still feed the previous save it was used for.
            arena.wait_released(timeout)
            if arena.size < end:
                page = mmap.PAGESIZE
                arena.resize((end + page - 1) // page * page)
        if prepared.pinned:
            arena.pin()
        _run(client, arena, *args)
        if temp_arena is not None:
            # Safe right after seal: the daemon holds its own mapping.
            temp_arena.close()
            temp_arena = None
        return _finish(PendingSave(client, save_id, arena, False, progress), wait, timeout)
    finally:
        if temp_arena is not None:
            temp_arena.close()


class _LaneHeld(Exception):
    """The daemon refused begin on a pooled connection: it is a rank of this save already."""


def _run_pooled(socket, end, timeout, args, later=False):
    """(lane, _HandOver or None): later=True leaves the puts and the seal to a thread, which
    keeps the lane until it has sealed."""
    held = []
    while True:
        # The pool tells a connection that is a rank of this save by that rank's arena; a rank of
        # another thread that put no bytes, or whose bytes were released before its commit, it
        # cannot see. The daemon can, and refuses the begin harmlessly: then another lane (a new
        # one once every lane was tried, whose fresh connection is a rank of nothing).
        lane = _arena_pool.borrow(socket, args[0], skip=held)
        try:
            return _run_on_lane(lane, end, timeout, args, later)
        except _LaneHeld:
            held.append(lane)


def _run_on_lane(lane, end, timeout, args, later):
    handover = None
    try:
        for attempt in (0, 1):
            client = lane.connect(fresh=attempt == 1)
            try:
                try:
                    arena = lane.take(max(end, 1), timeout)
                except ShardError as e:
                    e.before_begin = True
                    raise
                if args[3].pinned:
                    arena.pin()
                rest = _run(client, arena, *args, later=later)
                if rest is not None:
                    handover = _HandOver(rest, lane)
                    try:
                        handover.start()
                    except RuntimeError:  # no thread to be had: the rest is done here
                        handover = None
                        rest()
                    else:
                        with _handovers_lock:
                            _handovers.append(handover)
                return lane, handover
            except ShardError as e:
                if (getattr(e, "before_begin", False) and e.name == "bad_state"
                        and "already is rank" in e.message):
                    raise _LaneHeld() from e
                # A daemon restarted since the last save closed the kept connection: until begin
                # has gone through nothing of this save reached any daemon, so it starts over, once.
                if attempt or e.name != "connect_failed" or not getattr(e, "before_begin", False):
                    raise
    finally:
        if handover is None:
            lane.lock.release()


def _finish(pending, wait, timeout):
    if not wait:
        return pending
    try:
        return pending.wait(timeout)
    except ShardError as e:
        if e.name != "timeout":
            raise
        # Nobody waits for it any more: end it now rather than leave it open in the daemon.
        return pending.client.wait(pending.save_id, 0, abort=True)
    finally:
        pending._close_owned()


# Where each file series starts in the arena: the placement's congruences (file offset modulo
# 4096) hold for the series placed after another.
_SERIES_ALIGN = 4096


def _series_of(prefixes, name, save_prefix):
    """The file prefix a tensor is put with: None for the save's own."""
    got = prefixes.get(name) if prefixes else None
    if got is not None and not isinstance(got, str):
        raise TypeError("prefixes[%r] must be a str, not %s" % (name, type(got).__name__))
    return None if got == (save_prefix or "model") else got


def _boxes(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Slice) for v in value)


def _run(client, arena, save_id, dir, topo, prepared, max_shard_size, prefix, metadata,
         overwrite, files, keep_last=None, later=False):
    """Begins, copies every slice into the arena, then puts, sends the files and seals; with
    later=True returns the puts-to-seal part as a function instead of running it."""
    try:
        client.begin(save_id, dir, max_shard_size=max_shard_size, prefix=prefix, metadata=metadata,
                     overwrite=overwrite, keep_last=keep_last, **topo)
    except ShardError as e:
        e.before_begin = True  # no daemon heard of this save: it may be retried
        raise
    def declare():
        # Every slice in a few request lines (puts), not a round trip each; a file series at a time.
        for group_prefix, descs, offsets in prepared.groups:
            client._put_descs(save_id, arena, descs, offsets, prefix=group_prefix)
        for path, data, part in files:
            client.file(save_id, path, data, part=part)
        client.seal(save_id)

    def or_abort(step):
        try:
            step()
        except BaseException:
            # Other ranks would otherwise wait for a seal that never comes.
            try:
                client.abort(save_id)
            except Exception:
                pass
            raise

    def copy():
        with paused_gc():
            buf = arena.buffer
            copy_all(buf, prepared.units)
            del buf

    or_abort(copy)
    if later:
        return lambda: or_abort(declare)
    or_abort(declare)
    return None


def delete(dir: Union[str, "os.PathLike[str]"], client: Optional[Client] = None,
           socket: Optional[str] = None) -> None:
    """Deletes the checkpoint `dir` this uid committed (see Client.delete); connects to `socket` when no client."""
    if client is not None:
        client.delete(dir)
        return
    with Client(socket) as c:
        c.delete(dir)
