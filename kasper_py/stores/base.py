"""The store protocol (``KeyValueStore``), the write buffer the backends share
(``BufferedStore``: pending writes, read-your-writes, key encoding, reports), the
read-only query path (``query_get_many``, ``query_scan``: committed state, from any
thread), and ``StoreSpec``, how a TopicProcessor opens one store per partition.
Backends live in their own modules and import their client libraries there only.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kasper_py.exceptions import BadQueryError, StoreError
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import NOOP_STORE_OBSERVER, StoreObserver
from kasper_py.serdes import Serde

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.kafka.ports import OutputPort

__all__ = [
    "BufferedStore",
    "KeyValueStore",
    "Scan",
    "ScanPage",
    "StoreRuntime",
    "StoreSpec",
    "TopicPartitionKey",
    "Writes",
    "already_applied",
    "check_effectively_once_alone",
    "encode_key",
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


def already_applied(applied: Mapping[TopicPartitionKey, int],
                    next_offsets: Mapping[TopicPartitionKey, int]) -> bool:
    """True when an effectively-once store already holds every offset of the batch
    (a replayed batch, whose writes must not be applied twice)."""
    return bool(next_offsets) and all(
        applied.get(tp, -1) >= offset for tp, offset in next_offsets.items())


def check_effectively_once_alone(stores: Mapping[str, KeyValueStore]) -> None:
    """Refuse an effectively-once store beside other stores of one partition: replay
    skips the input its offsets cover, which the other stores may not have applied."""
    exact = [name for name, store in stores.items() if store.effectively_once]
    if exact and len(stores) > 1:
        raise StoreError(
            f"store {exact[0]!r} is effectively-once, so it must be the processor's only "
            f"store (got {sorted(stores)}): replay skips input its offsets cover, which "
            "the other stores may not have applied")


@dataclass(frozen=True)
class Scan:
    """A query's scan of one partition's store, in the key serde's bytes: keys starting
    with ``prefix``, from ``start`` (inclusive) to ``end`` (exclusive), after ``cursor``
    (where the last page stopped, as the backend wrote it), at most ``limit`` of them."""

    prefix: bytes = b""
    start: bytes | None = None
    end: bytes | None = None
    cursor: str | None = None
    limit: int = 100

    def bounds(self) -> tuple[bytes, bytes | None]:
        """The scan as one key range ``[lower, upper)`` (``upper`` ``None``: no end)."""
        lower = max(self.start or b"", self.prefix)
        upper = self.end
        after = prefix_end(self.prefix) if self.prefix else None
        if after is not None and (upper is None or after < upper):
            upper = after
        return lower, upper

    def ranged(self) -> bool:
        """True when the scan asks for a key range (``start`` or ``end``), not only a prefix."""
        return self.start is not None or self.end is not None

    def refuse_range(self, backend: str, why: str) -> None:
        """Raise ``BadQueryError`` for a range scan ``backend`` cannot do, saying ``why``."""
        if self.ranged():
            raise BadQueryError(f"{backend} tables cannot be scanned by key range: {why}; "
                                "scan with prefix= only")


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: (key, value) pairs decoded with the store's serdes, and the
    cursor of the next page (``None``: the scan is done)."""

    items: list[tuple[Any, Any]]
    cursor: str | None
    ordered: bool
    """True when ``items`` are in key-byte order (and pages follow each other in it)."""


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (``None``: no such key,
    the prefix is all 0xff bytes)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def next_key(key: bytes) -> bytes:
    """The smallest key above ``key``: where the page after ``key`` starts."""
    return key + b"\x00"


def in_range(key: bytes, lower: bytes, upper: bytes | None) -> bool:
    """True when ``lower <= key < upper``."""
    return key >= lower and (upper is None or key < upper)


@dataclass(frozen=True)
class StoreRuntime:
    """What a store needs from the loop that owns it."""

    config: Config
    partition: int
    producer: OutputPort | None = None
    """The runner's output port, for changelog writes acked before the commit."""
    observer: StoreObserver = NOOP_STORE_OBSERVER
    """Where the store reports its operations and restores (the loop's metrics)."""


class KeyValueStore(ABC):
    """A batch-first key-value store for one partition of one processor: what a
    processor and the loop call.

    Writes are buffered until ``flush()``, which the loop calls once per turn after
    ``process()``; reads see buffered writes. A batch therefore costs O(1) round trips.
    Backends build on ``BufferedStore``, which implements the buffer once.
    """

    key_serde: Serde
    value_serde: Serde
    effectively_once: bool = False
    """True when ``flush`` records the input offsets atomically with the writes; the
    loop then acks outputs before flushing and skips input the store already applied."""
    observer: StoreObserver = NOOP_STORE_OBSERVER
    """Where the store reports its operations, restores and late records (the loop's
    metrics); set when the store is opened."""
    windowed: tuple[Serde, Serde] | None = None
    """Set by a ``WindowedTable`` kept in this store: its key and value serdes, with
    which queries read the windows (``kasper_py.windows.table.windows_of``)."""

    @abstractmethod
    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Values of the keys that exist; absent keys are left out."""

    @abstractmethod
    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Buffer writes of every key in ``items``; a ``None`` value deletes the key."""

    @abstractmethod
    def delete_many(self, keys: Iterable[Any]) -> None:
        """Buffer deletes of ``keys``."""

    @abstractmethod
    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Write the buffered changes out. ``next_offsets`` are the input offsets the
        turn will commit for this partition (stores that apply effectively-once keep them)."""

    @abstractmethod
    def discard_pending(self) -> None:
        """Drop the buffered writes, as a failed turn does."""

    def savepoint(self) -> object:
        """A mark of the buffered writes as they are now, for ``rollback``: with
        ``Config.on_process_error="dead_letter"`` the turn undoes one partition's writes
        since a point of the turn, keeping what timers wrote before it. A store that
        buffers nothing returns anything and ignores ``rollback``."""
        raise NotImplementedError(f"{type(self).__name__} cannot undo part of a turn's "
                                  "writes (savepoint/rollback), which "
                                  "on_process_error='dead_letter' needs")

    def rollback(self, savepoint: object) -> None:
        """Put the buffered writes back as they were at ``savepoint`` (this store's own)."""
        raise NotImplementedError(f"{type(self).__name__} cannot undo part of a turn's writes")

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

    def after_delivery(self) -> None:  # noqa: B027 - optional hook
        """Called once the turn is committed (every output and changelog message acked,
        the offsets or the transaction committed): local tables apply their writes here;
        one that fails now is behind its changelog and reads the difference back at its
        next open."""

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets already applied to this store; replayed messages below
        them are skipped. Empty unless the store is effectively-once."""
        return {}

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate over every (key, value); only local tables support this."""
        raise NotImplementedError(f"{type(self).__name__} does not support iteration")

    # -- queries: committed state, from any thread ----------------------------------
    # The loop owns the store; queries come from other threads (the HTTP server's).
    # These never read the turn's pending writes, never report to the observer, and
    # never wait on the loop for longer than one read.

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Committed values of the keys that exist, for a query from any thread."""
        raise BadQueryError(f"{type(self).__name__} cannot be queried")

    def query_scan(self, scan: Scan) -> ScanPage:
        """One page of committed (key, value) pairs, for a query from any thread."""
        raise BadQueryError(f"{type(self).__name__} cannot be scanned")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or files."""


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

    def key(self, key: Any) -> bytes:
        """The backend key of ``key``: ``key_prefix`` + the key serde's bytes."""
        return self._key_prefix + encode_key(self.key_serde, key)

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Buffered writes first, then one ``_read_many`` of the other keys."""
        decode = self.value_serde.decode
        found: dict[Any, Any] = {}
        missing: dict[bytes, Any] = {}
        for key in keys:
            encoded = self.key(key)
            if encoded not in self._pending:
                missing[encoded] = key
            elif (value := self._pending[encoded]) is not None:
                found[key] = decode(value)
        if missing:
            values = self._observed("get_many", lambda: self._read_many(list(missing)))
            found.update((missing[k], decode(v)) for k, v in values.items())
        return found

    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Buffer writes until ``flush``; a ``None`` value deletes the key."""
        encode = self.value_serde.encode
        for key, value in items.items():
            self._pending[self.key(key)] = encode(value)

    def delete_many(self, keys: Iterable[Any]) -> None:
        """Buffer deletes until ``flush``."""
        for key in keys:
            self._pending[self.key(key)] = None

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Hand the buffered writes to ``_write``; the buffer is empty afterwards, even
        when the write failed (the loop stops, and the batch is replayed)."""
        writes, self._pending = self._pending, {}
        if writes or (self.effectively_once and next_offsets):
            self._observed("flush", lambda: self._write(writes, next_offsets))

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
        encoded = {self.key(key): key for key in keys}
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


class StoreSpec(ABC):
    """Declares a named store; the loop opens it once per assigned partition."""

    name: str

    @abstractmethod
    def open(self, runtime: StoreRuntime) -> KeyValueStore:
        """Open (and restore, if needed) the store of ``runtime.partition``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources shared by the partitions' stores (connections, pools)."""
