"""The store protocol every backend implements, and ``StoreSpec``, how a
TopicProcessor opens one store per partition. Backends live in their own
modules and import their client libraries there only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kasper_py.exceptions import StoreError
from kasper_py.serdes import Serde

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.ports import OutputPort

__all__ = [
    "KeyValueStore",
    "StoreRuntime",
    "StoreSpec",
    "TopicPartitionKey",
    "already_applied",
    "check_effectively_once_alone",
    "encode_key",
    "read_pending",
]

TopicPartitionKey = tuple[str, int]


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


def read_pending(pending: Mapping[bytes, bytes | None], keys: Iterable[Any],
                 encode_key: Callable[[Any], bytes],
                 decode: Callable[[bytes], Any]) -> tuple[dict[Any, Any], dict[bytes, Any]]:
    """Serve reads from a store's buffered writes (``None`` marks a delete).

    Returns the values found in ``pending``, decoded, and the keys it does not hold, as
    ``{encoded key: key}``, which the store then reads from its backend in one go.
    """
    found: dict[Any, Any] = {}
    missing: dict[bytes, Any] = {}
    for key in keys:
        encoded = encode_key(key)
        if encoded in pending:
            value = pending[encoded]
            if value is not None:
                found[key] = decode(value)
        else:
            missing[encoded] = key
    return found, missing


@dataclass(frozen=True)
class StoreRuntime:
    """What a store needs from the loop that owns it."""

    config: Config
    partition: int
    producer: OutputPort | None = None
    """The runner's output port, for changelog writes acked before the commit."""


class KeyValueStore(ABC):
    """A batch-first key-value store for one partition of one processor.

    Writes are buffered until ``flush()``, which the loop calls once per turn after
    ``process()``; reads see buffered writes. A batch therefore costs O(1) round trips.
    """

    key_serde: Serde
    value_serde: Serde
    effectively_once: bool = False
    """True when ``flush`` records the input offsets atomically with the writes; the
    loop then acks outputs before flushing and skips input the store already applied."""

    @abstractmethod
    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Values of the keys that exist; absent keys are left out."""

    @abstractmethod
    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Buffer writes of every key in ``items``."""

    @abstractmethod
    def delete_many(self, keys: Iterable[Any]) -> None:
        """Buffer deletes of ``keys``."""

    @abstractmethod
    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Write the buffered changes out. ``next_offsets`` are the input offsets the
        turn will commit for this partition (stores that apply effectively-once keep them)."""

    def get(self, key: Any, default: Any = None) -> Any:
        """Value of ``key``, or ``default``."""
        return self.get_many([key]).get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Buffer a write of ``key``."""
        self.put_many({key: value})

    def delete(self, key: Any) -> None:
        """Buffer a delete of ``key``."""
        self.delete_many([key])

    def after_delivery(self) -> None:  # noqa: B027 - optional hook
        """Called after every output and changelog message of the turn was acked,
        before the commit (local tables apply their writes here)."""

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets already applied to this store; replayed messages below
        them are skipped. Empty unless the store is effectively-once."""
        return {}

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate over every (key, value); only local tables support this."""
        raise NotImplementedError(f"{type(self).__name__} does not support iteration")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or files."""


class StoreSpec(ABC):
    """Declares a named store; the loop opens it once per assigned partition."""

    name: str

    @abstractmethod
    def open(self, runtime: StoreRuntime) -> KeyValueStore:
        """Open (and restore, if needed) the store of ``runtime.partition``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources shared by the partitions' stores (connections, pools)."""
