"""The store a processor uses (``KeyValueStore``), the write buffer the backends share
(``BufferedStore``: pending writes, read-your-writes, key encoding, reports), and
``StoreSpec``, how a runner opens one store per partition. The turn engine's calls on a
store are in lifecycle.py (``StoreLifecycle``), queries' in query.py (``Queryable``).
Backends live in their own modules and import their client libraries there only.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kasper_py.exceptions import BadQueryError, StoreError
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import NOOP_STORE_OBSERVER, StoreObserver
from kasper_py.serdes import Serde
from kasper_py.stores.lifecycle import (
    StoreLifecycle,
    already_applied,
    check_effectively_once_alone,
)
from kasper_py.stores.query import Queryable, Scan, ScanPage, prefix_end

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.kafka.ports import OutputPort

__all__ = [
    "BufferedStore",
    "ChangelogSource",
    "Changelogs",
    "KeyValueStore",
    "OwnedState",
    "Scan",  # re-exported, as before the split: its home is query.py
    "ScanPage",
    "StoreRuntime",
    "StoreSpec",
    "TopicPartitionKey",
    "Writes",
    "already_applied",  # re-exported: its home is lifecycle.py
    "check_effectively_once_alone",
    "encode_key",
    "encode_keys",
    "prefix_end",  # re-exported: its home is query.py
]

Writes = Mapping[bytes, bytes | None]
"""Encoded key -> encoded value, or ``None`` for a delete."""
T = TypeVar("T")


def encode_key(serde: Serde, key: Any) -> bytes:
    """``key`` as the key serde's bytes; a key that encodes to ``None`` is a StoreError."""
    encoded = serde.encode(key)
    if encoded is None:
        raise StoreError("a store key cannot be None")
    return bytes(encoded)


def encode_keys(serde: Serde, keys: Sequence[Any], prefix: bytes = b"") -> list[bytes]:
    """``prefix`` + ``encode_key(serde, key)`` for each of ``keys``, in order, with the
    serde's ``encode`` called straight from one pass: a batch of string keys costs a
    Python call a key, not three."""
    encode = serde.encode
    encoded: list[Any] = [encode(key) for key in keys]
    if not all(map(isinstance, encoded, repeat(bytes))):  # a None key, or bytes-like
        encoded = [encode_key(serde, key) for key in keys]
    return [prefix + key for key in encoded] if prefix else encoded


class ChangelogSource(Protocol):
    """Reads one changelog topic back, as ``stores.changelog.ChangelogReader`` does from
    Kafka: the watermarks of a partition, then its records from a position."""

    @property
    def positions(self) -> dict[int, int]:
        """The next offset to read of each assigned partition."""

    def watermarks(self, partition: int) -> tuple[int, int]:
        """(low, high) offsets of ``partition``."""

    def assign(self, starts: Mapping[int, int]) -> None:
        """Read these partitions from these offsets."""

    def unassign(self) -> None:
        """Stop reading."""

    def read_until(self, ends: Mapping[int, int], apply: Callable[[int, list[Any]], None],
                   observer: StoreObserver, *, processor: str, table: str,
                   reason: str = "") -> int:
        """Hand every record up to ``ends`` to ``apply`` (a partition and its next
        records, each with ``key()``, ``value()`` and ``offset()``); the count read."""

    def close(self) -> None:
        """Release the reader."""


class Changelogs(Protocol):
    """Where a runner keeps changelog topics other than in Kafka."""

    def reader(self, topic: str) -> ChangelogSource:
        """A reader of ``topic``."""


def _no_stream_time() -> int | None:
    return None


@dataclass(frozen=True)
class StoreRuntime:
    """What a store needs from the loop that owns it."""

    config: Config
    partition: int
    producer: OutputPort | None = None
    """The runner's output port, for changelog writes acked before the commit."""
    observer: StoreObserver = NOOP_STORE_OBSERVER
    """Where the store reports its operations and restores (the loop's metrics)."""
    changelogs: Changelogs | None = None
    """Changelog topics held in memory (``ProcessorDriver``'s), read in place of Kafka's
    to restore a local table; ``None``: the tables read their changelogs from Kafka."""
    wall_clock: Callable[[], float] = time.time
    """Seconds since the epoch, for tables with a time to live (``ttl=``): the loop's
    clock, or ``ProcessorDriver``'s, which moves only when the test moves it."""
    stream_time: Callable[[], int | None] = _no_stream_time
    """The partition's stream time (ms), for tables whose keys expire by event time:
    the turn engine sets it to the partition's clock when it opens the partition."""


class KeyValueStore(StoreLifecycle, Queryable):
    """A batch-first key-value store for one partition of one processor: what a
    processor calls (``get``/``put``/``delete`` and their ``_many`` forms, ``items``).

    Writes are buffered until ``flush()``, which the loop calls once per turn after
    ``process()``; reads see buffered writes. A batch therefore costs O(1) round trips.
    The class a store subclasses: it also takes the turn engine's interface
    (``StoreLifecycle``, lifecycle.py) and the queries' (``Queryable``, query.py), so
    one object serves its three callers, each of which sees only its own part.
    Backends build on ``BufferedStore``, which implements the buffer once.
    """

    key_serde: Serde
    value_serde: Serde
    observer: StoreObserver = NOOP_STORE_OBSERVER
    """Where the store reports its operations, restores and late records (the loop's
    metrics); set when the store is opened."""

    @abstractmethod
    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Values of the keys that exist; absent keys are left out."""

    @abstractmethod
    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Buffer writes of every key in ``items``; a ``None`` value deletes the key."""

    @abstractmethod
    def delete_many(self, keys: Iterable[Any]) -> None:
        """Buffer deletes of ``keys``."""

    @property
    def round_trips(self) -> int:
        """Requests that waited on a server or native library so far; 0 for stores
        without one (the in-memory store)."""
        return 0

    def get(self, key: Any, default: Any = None) -> Any:
        """Value of ``key``, or ``default``."""
        return self.get_many([key]).get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Buffer a write of ``key``; a ``None`` value deletes it."""
        self.put_many({key: value})

    def delete(self, key: Any) -> None:
        """Buffer a delete of ``key``."""
        self.delete_many([key])

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate over every (key, value); only local tables support this."""
        raise NotImplementedError(f"{type(self).__name__} does not support iteration")


class BufferedStore(KeyValueStore):
    """The write buffer every backend shares: ``put_many``/``delete_many`` encode into
    pending writes (encoded key -> encoded value, ``None`` a delete), ``get_many``
    answers from them before asking the backend, ``flush`` hands them to the backend.

    A backend implements ``_read_many`` and ``_write``, adds one to ``_round_trips``
    per request it waits on, and runs other requests (``open``) through ``_observed``.
    Backend keys are ``key_prefix`` + the key serde's bytes.
    """

    def __init__(self, name: str, key_serde: Serde, value_serde: Serde,
                 observer: StoreObserver, *, key_prefix: bytes = b"") -> None:
        self.name = name
        self.key_serde, self.value_serde = key_serde, value_serde
        self.observer = observer
        self._key_prefix = key_prefix
        self._pending: dict[bytes, bytes | None] = {}
        self._round_trips = 0

    @abstractmethod
    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """Values of the backend keys that exist, in one request."""

    @abstractmethod
    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Write ``writes`` (effectively-once: atomically with ``next_offsets``).
        Called when there are writes, or offsets an effectively-once store records."""

    @property
    def round_trips(self) -> int:
        """Requests that waited on the backend so far (a pipeline, a script or a wave
        of concurrent statements counts once; a retry counts again)."""
        return self._round_trips

    def _count_round_trips(self, requests: int) -> None:
        """``requests`` more waited on the backend (``retries.with_retries``'s count)."""
        self._round_trips += requests

    def key(self, key: Any) -> bytes:
        """The backend key of ``key``: ``key_prefix`` + the key serde's bytes."""
        return self._key_prefix + encode_key(self.key_serde, key)

    def encoded_keys(self, keys: Sequence[Any]) -> list[bytes]:
        """The backend keys of ``keys``, in order (``encode_keys``)."""
        return encode_keys(self.key_serde, keys, self._key_prefix)

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Buffered writes first, then one ``_read_many`` of the other keys."""
        keys = list(keys)  # read twice: encoded, then paired with its encodings
        decode, pending = self.value_serde.decode, self._pending
        found: dict[Any, Any] = {}
        missing: dict[bytes, Any] = {}
        encoded = self.encoded_keys(keys)
        if not pending:  # as at the start of most turns: every key is read
            missing = dict(zip(encoded, keys, strict=True))
        else:
            for key, backend_key in zip(keys, encoded, strict=True):
                if backend_key not in pending:
                    missing[backend_key] = key
                elif (value := pending[backend_key]) is not None:
                    found[key] = decode(value)
        if missing:
            values = self._observed("get_many", lambda: self._read_many(list(missing)))
            found.update((missing[k], decode(v)) for k, v in values.items())
        return found

    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Buffer writes until ``flush``; a ``None`` value deletes the key."""
        encoded = self.encoded_keys(list(items))
        self._pending.update(zip(encoded, map(self.value_serde.encode, items.values()),
                                 strict=True))

    def delete_many(self, keys: Iterable[Any]) -> None:
        """Buffer deletes until ``flush``."""
        self._pending.update(dict.fromkeys(self.encoded_keys(list(keys))))

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Hand the buffered writes to ``_write``; the buffer is empty afterwards, even
        when the write failed (the loop stops, and the batch is replayed)."""
        self._expire()
        writes, self._pending = self._pending, {}
        if writes or (self.effectively_once and next_offsets):
            self._observed("flush", lambda: self._write(writes, next_offsets))

    def _expire(self) -> int:
        """Buffer a delete for each key whose time to live has passed, before the
        buffer is written; return how many (none by default: RocksDB's ttl does)."""
        return 0

    def savepoint(self) -> object:
        """A copy of the buffered writes (usually few or none: a savepoint is taken
        before the partition's ``process()``, so it holds what timers wrote)."""
        return dict(self._pending)

    def rollback(self, savepoint: object) -> None:
        """The buffered writes become the copy ``savepoint`` took."""
        assert isinstance(savepoint, dict)
        self._pending = dict(savepoint)

    def discard_pending(self) -> None:
        """Drop the buffered writes, as a failed turn does, and what ``_write`` handed
        on but the backend has not applied yet (``_drop_unapplied``)."""
        self._pending.clear()
        self._drop_unapplied()

    def _drop_unapplied(self) -> None:
        """Forget writes ``_write`` handed on that wait for ``after_delivery`` (none by
        default: most backends apply in ``_write``)."""

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """One ``_query_read`` of the encoded keys; the pending writes are not read."""
        keys = list(keys)  # read twice: encoded, then paired with its encodings
        encoded = dict(zip(self.encoded_keys(keys), keys, strict=True))
        values = self._query_read(list(encoded))
        decode = self.value_serde.decode
        return {encoded[k]: decode(v) for k, v in values.items()}

    def _query_read(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """Committed values of backend keys, safe from any thread (the query path)."""
        raise BadQueryError(f"{type(self).__name__} cannot be queried")

    def decoded_page(self, pairs: Iterable[tuple[bytes, bytes]], cursor: str | None,
                     *, ordered: bool) -> ScanPage:
        """A ``ScanPage`` of backend (key, value) pairs, ``key_prefix`` stripped."""
        cut = len(self._key_prefix)
        decode_key, decode_value = self.key_serde.decode, self.value_serde.decode
        items = [(decode_key(k[cut:]), decode_value(v)) for k, v in pairs]
        return ScanPage(items, cursor, ordered)

    def _observed(self, op: str, request: Callable[[], T]) -> T:
        """Run ``request`` and report it as ``op``: its latency, and the round trips
        the backend counted meanwhile (also when it raised)."""
        started, before = time.perf_counter(), self.round_trips
        try:
            return request()
        finally:
            self.observer.on_store_op(self.name, op, time.perf_counter() - started,
                                      self.round_trips - before)


@dataclass(frozen=True)
class OwnedState:
    """What a store keeps for its processor outside the loop's memory, for ``kasper app
    reset``: the Kafka ``topics`` it owns (a changelog), its folders on this host
    (``paths``), and ``external``, a description of state held elsewhere (a Redis or
    Cassandra table) that the reset cannot remove."""

    topics: tuple[str, ...] = ()
    paths: tuple[Path, ...] = ()
    external: str | None = None


class StoreSpec(ABC):
    """Declares a named store; the loop opens it once per assigned partition."""

    name: str

    def owned_state(self, config: Config) -> OwnedState:
        """What the store keeps for processor ``config.name`` beyond a run (see
        ``OwnedState``); by default nothing: its state lives in the process."""
        return OwnedState()

    @abstractmethod
    def open(self, runtime: StoreRuntime) -> KeyValueStore:
        """Open (and restore, if needed) the store of ``runtime.partition``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources shared by the partitions' stores (connections, pools)."""
