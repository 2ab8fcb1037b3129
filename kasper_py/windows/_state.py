"""What windowed tables and joins share: their place in a local table store, stream
time kept beside their entries, the check that the store holds what they last wrote,
and how late records are counted.

Entries are bytes to bytes, so one layout serves every local table: ``m`` holds the
stream time, a generation and an arrival sequence (JSON); the other entries are a
one-byte tag, the key's serde bytes, then big-endian 64-bit times (``_times``).
"""

from __future__ import annotations

import json
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import structlog

from kasper_py.exceptions import StoreError
from kasper_py.processor import ProcessorContext
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import KeyValueStore

__all__ = ["META", "TimedState", "bad_timestamp", "check_timestamp", "pack_times",
           "unpack"]

_log = structlog.get_logger("kasper_py")
META = b"m"
_TIMES = struct.Struct(">qq")


def pack_times(tag: bytes, key: bytes, first: int, second: int) -> bytes:
    """The entry key ``tag + key + first + second`` (two big-endian int64)."""
    return tag + key + _TIMES.pack(first, second)


def unpack(entry: bytes) -> tuple[bytes, bytes, int, int]:
    """(tag, key bytes, first, second) of an entry key made by ``pack_times``."""
    first, second = _TIMES.unpack_from(entry, len(entry) - 16)
    return entry[:1], entry[1:-16], first, second


def check_timestamp(key: Any, timestamp: Any) -> int:
    """``timestamp`` if it is a non-negative int of milliseconds, else a ``ValueError``
    naming the record's key."""
    if not isinstance(timestamp, int) or timestamp < 0:
        raise bad_timestamp(key, timestamp)
    return timestamp


def bad_timestamp(key: Any, timestamp: Any) -> ValueError:
    """The error for a record whose event time is not an int of milliseconds >= 0."""
    return ValueError(f"record with key {key!r} has timestamp {timestamp!r}: windows need "
                      "event times in milliseconds >= 0 (Message.timestamp, or an "
                      "extracted event time)")


class TimedState(ABC):
    """The entries of one windowed table or join in one partition's local table, with
    stream time (the largest event time seen, advanced by records only).

    The store buffers writes until the turn flushes them, and a failed turn drops them.
    So each batch writes a new generation number beside stream time; when the store's
    generation is not the one this object wrote last (the turn failed, or the processor
    is new), the in-memory index is rebuilt from the store's entries.
    """

    def __init__(self, context: ProcessorContext, store: str, key_serde: str | Serde) -> None:
        self.store_name = store
        self.store: KeyValueStore = context.store(store)
        self.key_serde = serde_for(key_serde)
        _check_bytes_store(store, self.store)
        self.stream_time = -1
        """The largest event time seen in this partition (ms); -1 before any record."""
        self._generation = -1
        self._sequence = 0
        self._key_bytes: dict[Any, bytes] = {}
        self._keys: dict[bytes, Any] = {}
        self._late = 0
        self.late_records = 0
        """Late records this object dropped (since it was built)."""
        self._rebuild()
        if self.stream_time >= 0:  # kept in the table: the partition's stream time resumes
            context.observe_stream_time(self.stream_time)

    # -- subclasses -------------------------------------------------------------------

    @abstractmethod
    def _clear(self) -> None:
        """Forget the in-memory index."""

    @abstractmethod
    def _load(self, tag: bytes, key: bytes, first: int, second: int) -> None:
        """Index one entry found in the store."""

    # -- for subclasses -------------------------------------------------------------

    def _sync(self) -> None:
        """Rebuild the index if the store is not as this object last left it."""
        meta = self.store.get(META)
        generation = -1 if meta is None else json.loads(meta)[1]
        if generation != self._generation:
            self._rebuild()

    def _key_of(self, key: Any) -> bytes:
        """The key serde's bytes of ``key`` (cached; the key must be hashable)."""
        encoded = self._key_bytes.get(key)
        if encoded is None:
            raw = self.key_serde.encode(key)
            if raw is None:
                raise ValueError(f"{self.store_name}: a record key cannot be None")
            encoded = bytes(raw)
            if len(self._key_bytes) > 100_000:
                self._key_bytes.clear()
                self._keys.clear()
            self._key_bytes[key] = encoded
            self._keys[encoded] = key
        return encoded

    def _decoded(self, key: bytes) -> Any:
        """The key whose serde bytes are ``key``."""
        decoded = self._keys.get(key, self)
        return self.key_serde.decode(key) if decoded is self else decoded

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def _late_record(self, key: Any, timestamp: int) -> None:
        self._late += 1
        self.late_records += 1
        _log.debug("kasper.late_record", store=self.store_name, key=key, timestamp=timestamp,
                   stream_time=self.stream_time)

    def _end_batch(self) -> None:
        """Write stream time and a new generation beside the batch's entries; report the
        batch's late records."""
        self._generation += 1
        self.store.put(META, json.dumps([self.stream_time, self._generation,
                                         self._sequence]).encode())
        if self._late:
            self.store.observer.on_late_records(self.store_name, self._late)
            self._late = 0

    # -- internals ------------------------------------------------------------------

    def _rebuild(self) -> None:
        self._clear()
        self.stream_time, self._generation, self._sequence = -1, -1, 0
        self._late = 0
        found = []
        for entry, value in self._entries():
            if entry == META:
                self.stream_time, self._generation, self._sequence = json.loads(value)
            else:
                found.append(unpack(entry))
        for tag, key, first, second in found:  # after META: indexing needs stream time
            self._load(tag, key, first, second)
        self._loaded()

    def _loaded(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Called once every entry is indexed."""

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        try:
            yield from self.store.items()
        except NotImplementedError:
            raise StoreError(f"store {self.store_name!r} is a {type(self.store).__name__}, "
                             "which cannot list its entries: windows and joins need a local "
                             "table (MemoryTable or RocksDBTable)") from None


def _check_bytes_store(name: str, store: KeyValueStore) -> None:
    """A serde store must keep bytes as they are: windows encode their own entries."""
    for what in ("key_serde", "value_serde"):
        serde = getattr(store, what, None)
        if serde is not None and getattr(serde, "name", None) != "bytes":
            raise ValueError(f"store {name!r} has {what}={serde.name!r}: windows and joins "
                             "encode their own entries, so declare it with "
                             "key_serde='bytes', value_serde='bytes'")
