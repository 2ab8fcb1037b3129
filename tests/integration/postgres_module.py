"""The word count of the PostgreSQL tests, run with ``kasper run postgres_module:WordLog
--stores postgres_module:stores``: each word's count upserted in the ``words`` table, and
one row per input message appended (``{"partition", "offset", "word"}``).

``$PG_KILL_AT`` (a step boundary of ``kasper_py.steps.BOUNDARIES``) makes the process
SIGKILL itself there, the ``$PG_KILL_AFTER``-th time it is reached (default 3); the
store's own hooks stand at the boundaries of an effectively-once turn (process,
produce, wait, flush, commit): ``flush`` begins right after the outputs' acks
(after_produce) and ``after_delivery`` follows the commit (after_commit).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.message import TopicPartitionKey
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.postgres import PostgresStore, PostgresTable

STORE = "words"
_reached: dict[str, int] = {}


def boundary(name: str) -> None:
    """SIGKILL this process if ``name`` is ``$PG_KILL_AT`` reached for the chosen time."""
    if os.environ.get("PG_KILL_AT") != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == int(os.environ.get("PG_KILL_AFTER", "3")):
        os.kill(os.getpid(), signal.SIGKILL)


class KillingStore(PostgresStore):
    """A PostgresStore that stops the process at the boundaries around its flush."""

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        # Only a flush with input to record counts: a turn may hold no batch of this
        # partition, and the engine still flushes its store with no offsets.
        if next_offsets:
            boundary("after_produce")
        super().flush(next_offsets)
        if next_offsets:
            boundary("after_flush")

    def after_delivery(self) -> None:
        super().after_delivery()
        boundary("after_commit")


class KillingTable(PostgresTable):
    """Opens ``KillingStore``s."""

    def open(self, runtime: StoreRuntime) -> KillingStore:
        return KillingStore(self, runtime)


class WordLog(MessageProcessor):
    """Counts words (upserts) and logs every message (appends)."""

    def __init__(self, context: ProcessorContext) -> None:
        store = context.store(STORE)
        assert isinstance(store, PostgresStore)
        self.store = store
        self.pause = float(os.environ.get("PG_PAUSE", "0"))

    def process(self, messages: list[Message], sender: Sender) -> None:
        boundary("before_process")
        words = [m.value for m in messages]
        counts = self.store.get_many(set(words))
        for word in words:
            counts[word] = counts.get(word, 0) + 1
        self.store.put_many(counts)
        self.store.append_many({"partition": m.partition, "offset": m.offset, "word": m.value}
                               for m in messages)
        time.sleep(self.pause)
        boundary("after_process")


def stores(config: Config) -> list[Any]:
    """The one table, at ``$PG_URL``, retrying ``$PG_RETRIES`` times."""
    return [KillingTable(STORE, url=os.environ["PG_URL"], table=os.environ["PG_TABLE"],
                         retries=int(os.environ.get("PG_RETRIES", "5")), backoff=0.05)]
