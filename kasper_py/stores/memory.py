"""``MemoryStore``: a dict per partition, with the same buffered-write contract as
the durable stores. For tests and the testing module; state is lost on exit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kasper_py.stores.base import KeyValueStore, StoreRuntime, StoreSpec, TopicPartitionKey

__all__ = ["MemoryStore", "MemoryTable"]

_DELETED = object()


class MemoryStore(KeyValueStore):
    """Keys and values are Python objects kept as they are; writes apply on ``flush``.
    Not a ``BufferedStore``: that one buffers serde bytes, and this store has none."""

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}
        self._pending: dict[Any, Any] = {}
        self.flushes = 0

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
        """Apply buffered writes to the dict."""
        for key, value in self._pending.items():
            if value is _DELETED:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        self._pending.clear()
        self.flushes += 1

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


class MemoryTable(StoreSpec):
    """Declares an in-memory store called ``name``; one ``MemoryStore`` per partition."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.partitions: dict[int, MemoryStore] = {}

    def open(self, runtime: StoreRuntime) -> MemoryStore:
        """Return the partition's store, reusing it if this spec opened it before; it
        reports to ``runtime.observer`` (late records of windows kept in it)."""
        store = self.partitions.setdefault(runtime.partition, MemoryStore())
        store.observer = runtime.observer
        return store
