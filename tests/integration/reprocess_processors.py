"""Processors the reprocessing tests run both through the live loop and through Spark.

Spark's Python workers import this module by name: the tests ship it with
``SparkContext.addPyFile``, as a user ships their processors with ``--py-files``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from typing import Any

from kasper_py import (
    AsyncMessageProcessor,
    Config,
    Message,
    MessageProcessor,
    ProcessorContext,
    Sender,
)
from kasper_py.arrow import ArrowMessageProcessor, send_table
from kasper_py.stack import redis_url
from kasper_py.stores.redis import RedisTable

STORE = "counts"


class Tagged(MessageProcessor):
    """Sends each message to ``output`` as ``topic|partition|offset|timestamp|value``, keyed
    and with headers as it came; the producer picks the output partition by key. Raises
    ``ValueError`` on a message whose value is ``fail_on``."""

    def __init__(self, context: ProcessorContext, output: str,
                 fail_on: bytes | None = None) -> None:
        self.output, self.fail_on = output, fail_on

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            if m.value == self.fail_on:
                raise ValueError(f"cannot handle {m.value!r}")
            value = b"%s|%d|%d|%d|%s" % (m.topic.encode(), m.partition, m.offset,
                                         -1 if m.timestamp is None else m.timestamp, m.value)
            sender.send(self.output, value, key=m.key, headers=m.headers or None)


class AsyncTagged(AsyncMessageProcessor):
    """``Tagged``'s output from an async lookup per message (1 ms of ``asyncio.sleep``),
    one key's messages in offset order; raises ``ValueError`` on ``fail_on``."""

    def __init__(self, context: ProcessorContext, output: str,
                 fail_on: bytes | None = None) -> None:
        super().__init__(context)
        self.tagged = Tagged(context, output, fail_on)

    async def process_message(self, message: Message, sender: Sender) -> None:
        await asyncio.sleep(0.001)
        self.tagged.process([message], sender)


class ArrowDoubler(ArrowMessageProcessor):
    """Sends ``{"offset": ..., "doubled": 2 * amount}`` keyed by ``user`` for each JSON
    event, computed on the batch's Arrow columns."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        super().__init__(context)
        self.output = output

    def process_table(self, table: Any, sender: Sender) -> None:
        import pyarrow.compute as pc  # on the executors too: pyspark[sql] brings pyarrow

        doubled = table.select(["user", "offset"]).append_column(
            "doubled", pc.multiply(table.column("amount"), 2))
        send_table(sender, self.output, doubled, key="user")


class ArrowTopicsDoubler(ArrowDoubler):
    """``ArrowDoubler`` for several input topics: each output also names its input's
    topic; a batch with a negative amount raises."""

    def process_table(self, table: Any, sender: Sender) -> None:
        import pyarrow.compute as pc  # on the executors too

        if pc.any(pc.less(table.column("amount"), 0)).as_py():
            raise ValueError("negative amount")
        doubled = table.select(["user", "topic", "offset"]).append_column(
            "doubled", pc.multiply(table.column("amount"), 2))
        send_table(sender, self.output, doubled, key="user")


class ArrowBytesDoubler(ArrowMessageProcessor):
    """For ``value_serde="bytes"`` (the table's values parsed by Arrow's JSON reader):
    sends each row's offset, timestamp and doubled amount as JSON bytes keyed by ``user``;
    a batch with a negative amount raises."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        super().__init__(context)
        self.output = output

    def process_table(self, table: Any, sender: Sender) -> None:
        import pyarrow.compute as pc  # on the executors too

        if pc.any(pc.less(table.column("amount"), 0)).as_py():
            raise ValueError("negative amount")
        rows = table.select(["user", "offset", "timestamp", "amount"]).to_pylist()
        sender.send_many(self.output, [
            (row["user"], json.dumps({"offset": row["offset"], "timestamp": row["timestamp"],
                                      "doubled": 2 * row["amount"]}).encode(), None, None)
            for row in rows])


class WordCount(MessageProcessor):
    """Counts the words of each line per partition in the ``counts`` store.

    Also checks, on every batch, what both the loop and reprocessing promise: at most
    ``Config.largest_batch`` messages, all of this partition, topic by topic (no topic twice), each
    topic's offsets increasing across batches. A broken promise fails the run.
    """

    def __init__(self, context: ProcessorContext) -> None:
        self.partition = context.partition
        self.batch_size = context.config.largest_batch
        self.counts = context.store(STORE)
        self.last_offsets: dict[str, int] = {}

    def process(self, messages: list[Message], sender: Sender) -> None:
        self._check(messages)
        words = Counter(word for m in messages for word in m.value.split())
        current = self.counts.get_many(list(words))
        self.counts.put_many({w: current.get(w, 0) + n for w, n in words.items()})

    def _check(self, messages: list[Message]) -> None:
        if len(messages) > self.batch_size:
            raise AssertionError(f"batch of {len(messages)} > batch_size {self.batch_size}")
        topics = [m.topic for i, m in enumerate(messages) if i == 0 or
                  messages[i - 1].topic != m.topic]
        if len(topics) != len(set(topics)):
            raise AssertionError(f"topics interleaved within a batch: {topics}")
        for m in messages:
            if m.partition != self.partition:
                raise AssertionError(f"partition {m.partition} given to {self.partition}")
            if m.offset <= self.last_offsets.get(m.topic, -1):
                raise AssertionError(f"{m.topic} offset {m.offset} after "
                                     f"{self.last_offsets[m.topic]}")
            self.last_offsets[m.topic] = m.offset


def word_count_stores(_config: Config) -> list[Any]:
    """The word count's store: a Redis table whose keys start with the processor name."""
    return [RedisTable(STORE, url=redis_url(), key_serde="str", value_serde="json")]


class FailsFirstAttempt(Tagged):
    """Tagged, except that the first process() call anywhere raises: it creates
    ``marker`` then fails, so only a retried Spark task gets past it."""

    def __init__(self, context: ProcessorContext, output: str, marker: str) -> None:
        super().__init__(context, output)
        self.marker = marker

    def process(self, messages: list[Message], sender: Sender) -> None:
        if not os.path.exists(self.marker):
            with open(self.marker, "w") as flag:
                flag.write("first attempt failed")
            raise RuntimeError("first attempt")
        super().process(messages, sender)


class JsonCount(MessageProcessor):
    """Counts ``value["word"]`` per partition in the ``counts`` store and sends each
    message's running count to ``output``, keyed by the word (JSON values)."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output
        self.counts = context.store(STORE)

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = [m.value["word"] for m in messages]
        counts = self.counts.get_many(set(words))
        for word in words:
            counts[word] = counts.get(word, 0) + 1
            sender.send(self.output, {"word": word, "count": counts[word]}, key=word)
        self.counts.put_many(counts)


def exact_count_stores(_config: Config) -> list[Any]:
    """An effectively-once Redis table of counts (its applied offsets skip replays)."""
    return [RedisTable(STORE, url=redis_url(), key_serde="str", value_serde="json",
                       effectively_once=True)]


class TaggedCount(Tagged):
    """Tagged, and counts each value's first word in the ``counts`` store: with an
    effectively-once table the counts are exact however often input is replayed."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        super().__init__(context, output)
        self.counts = context.store(STORE)

    def process(self, messages: list[Message], sender: Sender) -> None:
        super().process(messages, sender)
        words = Counter(m.value.split(b"-")[0].decode() for m in messages)
        current = self.counts.get_many(list(words))
        self.counts.put_many({w: current.get(w, 0) + n for w, n in words.items()})



def tagged_count_to_out_topic(context: ProcessorContext) -> TaggedCount:
    """TaggedCount to the ``out-<run>`` topic of an ``in-<run>`` input (the names
    ``new_topic`` gives): a factory a command line can name (``module:attr``) that takes
    its output from the config, as executors on a cluster do not see the driver's
    environment."""
    return TaggedCount(context, "out" + context.config.input_topics[0].removeprefix("in"))
