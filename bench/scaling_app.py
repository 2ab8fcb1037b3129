"""The processors bench_scaling.py runs through ``kasper run``: a passthrough to
``$SCALING_OUTPUT`` and a word count in a RocksDB table.

    kasper run scaling_app:passthrough --app-dir bench ...
    kasper run scaling_app:word_count --stores scaling_app:tables --app-dir bench ...
"""

from __future__ import annotations

import os

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.rocksdb import RocksDBTable


class Passthrough(MessageProcessor):
    """Every message on to the output topic, same key, value and partition."""

    def __init__(self, _context: ProcessorContext) -> None:
        self.output = os.environ["SCALING_OUTPUT"]

    def process(self, messages: list[Message], sender: Sender) -> None:
        send, output = sender.send, self.output
        for m in messages:
            send(output, m.value, m.key, m.partition)


class WordCount(MessageProcessor):
    """Counts the words of each value in the table ``counts``: one read, one write."""

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = [w for m in messages for w in m.value.split()]
        totals = self.counts.get_many(set(words))
        for word in words:
            totals[word] = totals.get(word, 0) + 1
        self.counts.put_many(totals)


def passthrough(context: ProcessorContext) -> MessageProcessor:
    return Passthrough(context)


def word_count(context: ProcessorContext) -> MessageProcessor:
    return WordCount(context)


def tables(_config: Config) -> list[StoreSpec]:
    return [RocksDBTable("counts", key_serde="str", value_serde="json")]
