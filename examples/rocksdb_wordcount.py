"""RocksDB word count: running totals per word in a local table backed by a changelog.

Lines arrive on `lines` (UTF-8 text). Each partition keeps its word totals in a RocksDB
database under --state-dir; every write is also produced to the compacted topic
`<name>-counts-changelog`, so a lost or stale folder is restored from Kafka before any
processing. For every batch the processor sends (word, new total) to `word-totals`.

Delivery: at-least-once. A crash replays the last uncommitted batch, so totals (and
their messages) can overcount by at most one batch per crash; nothing is lost.

    python examples/rocksdb_wordcount.py --sample 20000 --until-caught-up
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from typing import Any

from _sample import create_topics  # isort: skip - the examples' shared sample helper
from confluent_kafka import Producer

from kasper_py import (
    Config,
    Message,
    MessageProcessor,
    OutputTopic,
    ProcessorContext,
    Sender,
    TopicProcessor,
)
from kasper_py.kafka.admin import ensure_output_topics
from kasper_py.stores.rocksdb import RocksDBTable

VOCABULARY = ["kafka", "batch", "state", "table", "changelog", "offset", "commit",
              "partition", "restore", "word"]


class RunningWordCount(MessageProcessor):
    """Adds each batch's word counts to the table: one MultiGet, one WriteBatch."""

    def __init__(self, context: ProcessorContext, output_topic: str) -> None:
        self.counts = context.store("counts")
        self.output_topic = output_topic

    def process(self, messages: list[Message], sender: Sender) -> None:
        batch = Counter(word for m in messages if m.value for word in m.value.lower().split())
        totals = self.counts.get_many(batch)
        for word, count in batch.items():
            totals[word] = totals.get(word, 0) + count
        self.counts.put_many(totals)
        for word, total in sorted(totals.items()):
            sender.send(self.output_topic, str(total), key=word)


def produce_sample(bootstrap: str, topic: str, partitions: int, lines: int) -> None:
    """Create `topic` and write `lines` random lines of five words."""
    create_topics(bootstrap, [topic], partitions)
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n in range(lines):
        producer.produce(topic, " ".join(rng.choices(VOCABULARY, k=5)))
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="rocksdb-wordcount")
    parser.add_argument("--input", default="lines")
    parser.add_argument("--output", default="word-totals")
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="produce this many sample lines")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    if args.sample:
        produce_sample(args.bootstrap, args.input, args.partitions, args.sample)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.input],
                    batch_size=args.batch_size, state_dir=args.state_dir,
                    key_serde="str", value_serde="str", output_topics=[OutputTopic(args.output)])
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    tables: list[Any] = []

    def factory(context: ProcessorContext) -> RunningWordCount:
        processor = RunningWordCount(context, args.output)
        tables.append(processor.counts)
        return processor

    with TopicProcessor(config, factory, stores=[RocksDBTable("counts")]) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        if processor.run_until_stopped(until_caught_up=args.until_caught_up) is None:
            totals: Counter[str] = Counter()
            for table in tables:  # a word has a total in each partition it occurs in
                totals.update(dict(table.items()))
            print("top words:", totals.most_common(5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
