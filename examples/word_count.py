"""Word count: count the words of each batch and send one increment per word.

Lines arrive on `lines` (UTF-8 text); for every batch and partition the processor
sends (word, count-in-this-batch) to `word-counts`, keyed by word. Summing the
increments per word gives the totals; a downstream table (or rocksdb_wordcount.py,
which keeps the totals in a changelog-backed RocksDB table) does that.

Delivery: at-least-once. A crash replays the last uncommitted batch, so its
increments can be sent twice: totals overcount by at most one batch per crash.

`word-counts` is declared (``Config.output_topics``, as many partitions as `lines`) and
created at start when absent; a send to a topic that does not exist fails the turn.

    python examples/word_count.py --bootstrap 127.0.0.1:19092 --until-caught-up
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

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


class WordCount(MessageProcessor):
    """Sends, per batch, how many times each word occurred in it."""

    def __init__(self, context: ProcessorContext, output_topic: str = "word-counts") -> None:
        self.output_topic = output_topic

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = Counter(word for m in messages if m.value for word in m.value.lower().split())
        for word, count in sorted(counts.items()):
            sender.send(self.output_topic, str(count), key=word)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="word-count")
    parser.add_argument("--input", default="lines")
    parser.add_argument("--output", default="word-counts")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.input],
                    batch_size=args.batch_size, key_serde="str", value_serde="str",
                    output_topics=[OutputTopic(args.output)])
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    with TopicProcessor(config, lambda c: WordCount(c, args.output)) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        processor.run_until_stopped(until_caught_up=args.until_caught_up)
    return 0


if __name__ == "__main__":
    sys.exit(main())
