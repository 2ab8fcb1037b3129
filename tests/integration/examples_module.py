"""A tiny processor for the CLI and dashboard tests: upper-cases each value to
``$EXAMPLE_OUTPUT_TOPIC`` and counts values per key in an in-memory store, which
reports its operations to the observer it is handed, the way the real stores do.
``$EXAMPLE_FAIL_ON`` names a value it refuses; ``$EXAMPLE_PAUSE`` (seconds) slows
each batch down, so a test can stop a run with work left.

    kasper run examples_module:factory --stores examples_module:stores --config kasper.toml
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.observability.observe import StoreObserver
from kasper_py.stores.base import StoreRuntime, TopicPartitionKey
from kasper_py.stores.memory import MemoryStore, MemoryTable

STORE = "counts"


class Upper(MessageProcessor):
    """Sends ``value.upper()`` for every message; keeps a count per key."""

    def __init__(self, context: ProcessorContext) -> None:
        self.output_topic = os.environ["EXAMPLE_OUTPUT_TOPIC"]
        self.counts = context.store(STORE)
        if os.environ.get("EXAMPLE_FAIL_ON"):
            self.fail_on: bytes | None = os.environ["EXAMPLE_FAIL_ON"].encode()
        else:
            self.fail_on = None
        self.pause = float(os.environ.get("EXAMPLE_PAUSE") or 0)

    def process(self, messages: list[Message], sender: Sender) -> None:
        keys = {m.key for m in messages}
        counts = self.counts.get_many(keys)
        for message in messages:
            if self.fail_on is not None and message.value == self.fail_on:
                raise ValueError(f"refusing {message.value!r}")
            counts[message.key] = counts.get(message.key, 0) + 1
            sender.send(self.output_topic, message.value.upper(), key=message.key)
        self.counts.put_many(counts)
        time.sleep(self.pause)


factory = Upper


class ReportingStore(MemoryStore):
    """A MemoryStore that reports each ``get_many`` and each ``flush`` with writes as
    one round trip to ``observer``."""

    def __init__(self, observer: StoreObserver) -> None:
        super().__init__()
        self.observer = observer

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        started = time.perf_counter()
        found = super().get_many(keys)
        self.observer.on_store_op(STORE, "get_many", time.perf_counter() - started, 1)
        return found

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        started, writes = time.perf_counter(), bool(self._pending)
        super().flush(next_offsets)
        if writes:
            self.observer.on_store_op(STORE, "flush", time.perf_counter() - started, 1)


class ReportingTable(MemoryTable):
    """Opens ``ReportingStore``s; nothing to restore, so each open reports, as a
    changelog table does, a restore started with no records and done."""

    def open(self, runtime: StoreRuntime) -> MemoryStore:
        runtime.observer.on_restore_started(self.name, runtime.partition, 0)
        runtime.observer.on_restore_progress(self.name, runtime.partition, 0, 0)
        runtime.observer.on_restore_done(self.name, runtime.partition, 0, 0.0, False)
        return self.partitions.setdefault(runtime.partition, ReportingStore(runtime.observer))


def stores(_config: object) -> list[MemoryTable]:
    """The store the processor uses, for ``--stores examples_module:stores``."""
    return [ReportingTable(STORE)]
