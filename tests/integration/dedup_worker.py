"""A deduplicating worker for the kill -9 test: each message's key is its id; the first
occurrence of each id within an hour of event time is sent to ``output`` (key and
value as read), the repeats dropped, under exactly-once, the ids held in a RocksDB
table with its changelog.

    python dedup_worker.py BOOTSTRAP NAME TOPIC OUTPUT STATE_DIR [--until-caught-up]
"""

from __future__ import annotations

import time

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.windows import Deduplicator

from eos_worker import run_worker  # isort: skip - a sibling script


class FirstOccurrences(MessageProcessor):
    """Sends the first record of each key, drops its repeats."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.dedup = Deduplicator(context, "seen", within=3600)
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in self.dedup.first_occurrences(messages, lambda m: m.key, lambda m: m.timestamp):
            sender.send(self.output, m.value, m.key)
        time.sleep(0.02)  # a kill lands mid-run


def main() -> None:
    run_worker(FirstOccurrences, [RocksDBTable("seen", key_serde="bytes", value_serde="bytes")],
               batch_size=300, value_serde="str")


if __name__ == "__main__":
    main()
