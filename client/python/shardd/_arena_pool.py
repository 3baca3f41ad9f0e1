# Each process's arenas for save()'s default path: one connection and up to two arenas per daemon, reused once the daemon has released them.
"""A fresh arena per save costs far more than the copy into it: a new memfd
whose every page faults in on first touch, attached (mapped, and pinned by
the daemon's io_uring) anew. So save() without client= or arena= borrows
from a pool kept per process and per daemon: one connection, and at most two
arenas (double-buffered: one may feed the save in flight while the next is
filled). An arena is handed out again only once the daemon has released the
save that read it; when both are still in use the caller waits for the older
one, so a trainer is blocked by the disk only if it outruns two saves.

The pool's memory (the two arenas, each as large as the largest save put
through it) stays until the process ends or release_arenas() is called.
A forked child starts with no pool of its own.
"""
from __future__ import annotations

import mmap
import os
import threading
from typing import Dict, List, Optional, Tuple

from ._client import Arena, Client
from ._errors import ShardError

__all__ = ["borrow", "release_arenas"]

_MAX_ARENAS = 2
_lock = threading.Lock()
_pools: Dict[Tuple, List["_Lane"]] = {}
_pid = os.getpid()
_inherited: List[List["_Lane"]] = []  # a parent's pools, kept from the collector: the parent still uses them


def _page_up(n: int) -> int:
    return (max(n, 1) + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


class _Lane:
    """One connection and its arenas; used by one save's hand-over at a time (`lock`)."""

    def __init__(self, socket: Optional[str]):
        self.socket = socket
        self.lock = threading.Lock()
        self.client: Optional[Client] = None
        self.arenas: List[Arena] = []  # least recently used first

    def connect(self, fresh: bool = False) -> Client:
        if fresh or self.client is None or self.client.closed:
            self.drop()
            self.client = Client(self.socket)
        return self.client

    def drop(self) -> None:
        for a in self.arenas:
            a.close()
        self.arenas = []
        if self.client is not None:
            self.client.close()
            self.client = None

    @staticmethod
    def _released(arena: Arena) -> bool:
        try:
            arena.wait_released(0)
        except ShardError as e:
            if e.name == "timeout":
                return False
            raise
        return True

    def member_of(self, save_id: str) -> bool:
        """Whether this connection is a rank of `save_id` still (one connection is one rank of a
        save, so a process playing several ranks of one save needs several lanes)."""
        return any(a.last_save == save_id and not self._released(a) for a in self.arenas
                   if self.client is not None and not self.client.closed)

    def take(self, size: int, timeout: Optional[float]) -> Arena:
        """An arena of at least `size` bytes that no save reads any more (the most recently used
        one that fits); grows or adds one as needed, waits for the older one when both are busy."""
        free = [a for a in self.arenas if self._released(a)]
        fits = [a for a in free if a.size >= size]
        if fits:
            arena = fits[-1]
        elif free:
            arena = free[-1]
            arena.resize(_page_up(size))
        elif len(self.arenas) < _MAX_ARENAS:
            arena = self.client.arena(_page_up(size))
        else:
            arena = self.arenas[0]
            arena.wait_released(timeout)
            if arena.size < size:
                arena.resize(_page_up(size))
        if arena in self.arenas:
            self.arenas.remove(arena)
        self.arenas.append(arena)
        return arena


def _key(socket: Optional[str]) -> Tuple:
    # The same daemon and arena kind as a fresh Client and arena would get now.
    env = os.environ
    return (socket, env.get("SHARDD_SOCKET"), env.get("XDG_RUNTIME_DIR"), env.get("SHARDD_ARENA"))


def borrow(socket: Optional[str], save_id: str, skip=()) -> _Lane:
    """A lane of this process's pool for `socket` (None: the default socket), locked for the
    caller (release its .lock when the save is handed over): the first idle one that is not a
    rank of `save_id` already, nor in `skip`, else a new one."""
    global _pid
    with _lock:
        if os.getpid() != _pid:
            _inherited.extend(_pools.values())
            _pools.clear()
            _pid = os.getpid()
        lanes = _pools.setdefault(_key(socket), [])
        for lane in lanes:
            if any(lane is s for s in skip):
                continue
            if lane.lock.acquire(blocking=False):
                try:
                    busy = lane.member_of(save_id)
                except ShardError:
                    busy = False  # a dead connection: the lane reconnects when used
                if not busy:
                    return lane
                lane.lock.release()
        lane = _Lane(socket)
        lane.lock.acquire()
        lanes.append(lane)
        return lane


def release_arenas() -> None:
    """Closes this process's pooled connections and arenas (saves already sealed still commit);
    the next save() makes new ones."""
    with _lock:
        pools = list(_pools.values()) if os.getpid() == _pid else []
        _pools.clear()
    for lanes in pools:
        for lane in lanes:
            with lane.lock:
                lane.drop()
