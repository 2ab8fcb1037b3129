"""A deduplicating worker for the kill -9 test: each message's key is its id; the first
occurrence of each id within an hour of event time is sent to ``output`` (key and
value as read), the repeats dropped, under exactly-once, the ids held in a RocksDB
table with its changelog.

    python dedup_worker.py BOOTSTRAP NAME TOPIC OUTPUT STATE_DIR [--until-caught-up]
"""

from __future__ import annotations

import argparse
import time

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.windows import Deduplicator


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
    parser = argparse.ArgumentParser()
    for positional in ("bootstrap", "name", "topic", "output", "state_dir"):
        parser.add_argument(positional)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args()
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.topic],
                    batch_size=300, batch_wait=0.2, state_dir=args.state_dir, key_serde="str",
                    value_serde="str", processing_guarantee="exactly_once")
    processor = TopicProcessor(config, lambda c: FirstOccurrences(c, args.output),
                               stores=[RocksDBTable("seen", key_serde="bytes",
                                                    value_serde="bytes")])
    print("started", flush=True)
    with processor:
        processor.run_until_stopped(until_caught_up=args.until_caught_up)


if __name__ == "__main__":
    main()
