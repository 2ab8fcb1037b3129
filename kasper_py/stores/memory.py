"""``MemoryStore``: a dict per partition, with the same buffered-write contract as
the durable stores. For tests and the testing module; state is lost on exit. Queries
read the flushed dict under a lock that ``flush`` holds while it applies a turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kasper_py.message import TopicPartitionKey
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import KeyValueStore, StoreRuntime, StoreSpec
from kasper_py.stores.query import Scan, ScanPage, in_range, next_key
from kasper_py.stores.ttl import Clock, ExpiryClock, Ttl

__all__ = ["MemoryStore", "MemoryTable"]

_DELETED = object()


class MemoryStore(KeyValueStore):
    """Keys and values are Python objects kept as they are; writes apply on ``flush``.
    Not a ``BufferedStore``: that one buffers serde bytes, and this store has none.
    With a ``ttl``, ``flush`` also removes up to ``ttl.sweep_limit`` expired keys."""

    def __init__(self, ttl: Ttl | None = None, clock: Clock = time.time,
                 expiry_clock: ExpiryClock | None = None) -> None:
        self.data: dict[Any, Any] = {}
        self.name = "memory"
        """The table's name, as metrics report it (``MemoryTable`` sets it)."""
        self.ttl = ttl
        self.expiry_clock = expiry_clock or (None if ttl is None else
                                             ttl.clock(clock, lambda: None))
        """With a ttl: the time writes are dated with and keys expire by (``Ttl.clock``)."""
        self._written: dict[Any, int] = {}
        """With a ttl: each key's last write (ms), oldest first (a rewrite moves it last)."""
        self._pending: dict[Any, Any] = {}
        self.flushes = 0
        self._lock = threading.Lock()
        """Held by ``flush`` while it applies a turn and by queries while they read."""

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Dict lookups; buffered writes win over flushed ones."""
        found = {}
        for key in keys:
            value = self._pending.get(key, self.data.get(key, _DELETED))
            if value is not _DELETED:
                found[key] = value
        return found

    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Buffer the writes until ``flush``; a ``None`` value is a delete, as in the
        durable stores."""
        for key, value in items.items():
            self._pending[key] = _DELETED if value is None else value

    def delete_many(self, keys: Iterable[Any]) -> None:
        """Buffer the deletes until ``flush``."""
        for key in keys:
            self._pending[key] = _DELETED

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Apply buffered writes to the dict, all at once for queries; with a ttl, then
        remove the keys whose last write is ``ttl`` or longer ago."""
        now = 0 if self.expiry_clock is None else self.expiry_clock.now()
        with self._lock:
            for key, value in self._pending.items():
                if value is _DELETED:
                    self.data.pop(key, None)
                else:
                    self.data[key] = value
            if self.ttl is not None:
                self._expire(now, self.ttl)
        self._pending.clear()
        self.flushes += 1

    def _expire(self, now: int, ttl: Ttl) -> None:
        """Record the turn's writes in the write order, then pop the oldest expired keys
        (at most ``ttl.sweep_limit``): the order's head only, never a full scan."""
        written = self._written
        for key in self._pending:
            written.pop(key, None)
            if key in self.data:
                written[key] = now
        expired: list[Any] = []
        for key, at in written.items():
            if at + ttl.ms > now or len(expired) == ttl.sweep_limit:
                break
            expired.append(key)
        for key in expired:
            del written[key]
            self.data.pop(key, None)
        if expired:
            self.observer.on_keys_expired(self.name, len(expired))

    def discard_pending(self) -> None:
        """Drop buffered writes, as a failed turn does."""
        self._pending.clear()

    def savepoint(self) -> object:
        """A copy of the buffered writes, for ``rollback``."""
        return dict(self._pending)

    def rollback(self, savepoint: object) -> None:
        """The buffered writes become the copy ``savepoint`` took."""
        assert isinstance(savepoint, dict)
        self._pending = dict(savepoint)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Flushed (key, value) pairs, in insertion order."""
        return iter(list(self.data.items()))

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Dict lookups in the flushed dict (pending writes are not read)."""
        with self._lock:
            return {key: self.data[key] for key in keys if key in self.data}

    def query_scan(self, scan: Scan) -> ScanPage:
        """Flushed pairs in the order of their keys' bytes (``bytes`` as they are, ``str``
        as UTF-8, anything else as its ``str()``); the cursor is the last key's hex. The
        keys are copied and sorted under the lock, so a scan costs O(n log n)."""
        with self._lock:
            pairs = list(self.data.items())
        lower, upper = scan.bounds()
        if scan.cursor is not None:
            lower = max(lower, next_key(bytes.fromhex(scan.cursor)))
        found = sorted(((_key_bytes(k), k, v) for k, v in pairs
                        if in_range(_key_bytes(k), lower, upper)), key=lambda kv: kv[0])
        page = found[:scan.limit]
        cursor = page[-1][0].hex() if len(found) > scan.limit else None
        return ScanPage([(k, v) for _, k, v in page], cursor, ordered=True)


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    return (key if isinstance(key, str) else str(key)).encode()


class MemoryTable(StoreSpec):
    """Declares an in-memory store called ``name``; one ``MemoryStore`` per partition.
    ``key_serde`` serves queries only: it reads a URL's key and gives the bytes the
    key's partition is computed from. ``ttl`` (seconds, or a ``Ttl``) removes a key that
    long after its last write, by the runtime's wall clock (or, with ``Ttl(by="event")``,
    by the partition's stream time)."""

    def __init__(self, name: str, *, key_serde: str | Serde = "str",
                 ttl: float | Ttl | None = None) -> None:
        self.name = name
        self.key_serde = serde_for(key_serde)
        self.ttl = Ttl.of(ttl)
        self.partitions: dict[int, MemoryStore] = {}

    def open(self, runtime: StoreRuntime) -> MemoryStore:
        """Return the partition's store, reusing it if this spec opened it before; it
        reports to ``runtime.observer`` (late records of windows kept in it)."""
        store = self.partitions.setdefault(runtime.partition, MemoryStore(self.ttl))
        if self.ttl is not None:  # the reopened partition's clocks, no earlier than before
            clock = self.ttl.clock(runtime.wall_clock, runtime.stream_time)
            if store.expiry_clock is not None:
                clock.seen(store.expiry_clock.now())
            store.expiry_clock = clock
        store.name = self.name
        store.observer = runtime.observer
        return store
