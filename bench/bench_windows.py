"""Tumbling-window count on RocksDB against the plain RocksDB word count, in the same
run on the same broker, and against Quix Streams' tumbling window where it is installed.

The input is one word a record (keys from a 1000-word vocabulary), its Kafka timestamp
--spacing-ms (1) after the previous record's, shuffled by up to 2 s (the last ones now).
The spacing sets how many windows a batch touches: at 1 ms a batch of 10,000 records
spans 10 s of event time, so about one window per word; at 10 ms, 100 s, about two.
``wordcount`` adds each
batch's counts per word to a RocksDB table (one get_many, one put_many per partition
per batch) and sends every changed total; ``tumbling`` counts per word and 1-minute
window with 10 s of grace in a ``WindowedTable`` on RocksDB and sends every window the
batch changed (emit="updates"), expiring closed windows. Each loop runs in its own
process, at-least-once. A benchmark, not a test: the target (tumbling >= 0.6x word
count) is printed, never asserted.

    python bench/bench_windows.py --messages 1000000 --partitions 2
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
import uuid
from collections import Counter
from typing import Any

from benchkit import (
    StopWhenDone,
    arguments,
    child_answered,
    create_topics,
    delete_topics,
    fill,
    run_in_child,
)

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.windows import Tumbling, WindowedTable, count

KINDS = ("wordcount", "tumbling")


def records(messages: int, spacing: int) -> list[dict[str, Any]]:
    """One word a record, ``spacing`` ms apart in event time up to now, shuffled by up to
    2 s (recent times: the broker's retention deletes old ones)."""
    rng = random.Random(3)
    start = int(time.time() * 1000) - messages * spacing - 2000
    times = [start + n * spacing + rng.randrange(2000) for n in range(messages)]
    words = [b"w%d" % (n * 7919 % 1000) for n in range(messages)]
    return [{"key": word, "value": b"1", "timestamp": at}
            for word, at in zip(words, times, strict=True)]


class WordCount(MessageProcessor):
    """Running totals per word (the plain RocksDB word count)."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.counts = context.store("counts")
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        batch = Counter(m.key for m in messages)
        totals = self.counts.get_many(batch)
        for word, n in batch.items():
            totals[word] = totals.get(word, 0) + n
        self.counts.put_many(totals)
        for word, total in totals.items():
            sender.send(self.output, b"%d" % total, key=word)


class WindowedCount(MessageProcessor):
    """Counts per word and 1-minute tumbling window, 10 s of grace."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.counts = WindowedTable(context, "counts", Tumbling(60, grace=10), count())
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for window in self.counts.update((m.key, m.timestamp, None) for m in messages):
            sender.send(self.output, b"%d" % window.value, key=window.key)


def loop_child(args: argparse.Namespace) -> dict[str, Any]:
    kind = args.child
    config = Config(name=f"bench-win-{kind}-{uuid.uuid4().hex[:8]}",
                    bootstrap_servers=args.bootstrap, input_topics=[args.source],
                    batch_size=args.batch_size, batch_wait=1.0, key_serde="str",
                    value_serde="bytes", state_dir=args.state_dir)
    if kind == "wordcount":
        table = RocksDBTable("counts")
        factory: Any = lambda context: WordCount(context, args.output)  # noqa: E731
    else:
        table = RocksDBTable("counts", key_serde="bytes", value_serde="bytes")
        factory = lambda context: WindowedCount(context, args.output)  # noqa: E731
    observer = StopWhenDone(args.messages)
    processor = TopicProcessor(config, factory, stores=[table], observer=observer)
    observer.processor = processor
    started = time.perf_counter()
    processor.run_loop()
    elapsed = time.perf_counter() - started
    return {"kind": kind, "name": config.name, "seconds": elapsed,
            "msgs_per_s": args.messages / elapsed}


def run_child(kind: str, args: argparse.Namespace, source: str, output: str) -> dict[str, Any]:
    found = run_in_child(__file__, kind, args, source, output)
    delete_topics(args.bootstrap, [f"{found['name']}-counts-changelog"])
    return found


def quix_note() -> str:
    """Quix Streams is compared only where it is installed; say so where it is not."""
    if importlib.util.find_spec("quixstreams") is None:
        return ("Quix Streams: not installed here, so its tumbling window is not compared "
                "(pip install quixstreams to add it)")
    return ("Quix Streams: installed, but this bench does not drive it yet; "
            "its tumbling window is not compared")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=1_000_000, partitions=2)
    parser.add_argument("--spacing-ms", type=int, default=1)
    parser.add_argument("--child", choices=KINDS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if child_answered(args, loop_child):
        return
    source = f"bench-words-{uuid.uuid4().hex[:8]}"
    output = f"bench-out-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [source, output], args.partitions)
    fill(args.bootstrap, source, args.partitions, records(args.messages, args.spacing_ms))
    print(f"input: {args.messages} one-word records {args.spacing_ms} ms apart on "
          f"{args.partitions} partitions, batch_size {args.batch_size}")
    best: dict[str, float] = {}
    for _ in range(args.rounds):  # alternate, so both loops see the same machine conditions
        for kind in KINDS:
            r = run_child(kind, args, source, output)
            best[kind] = max(best.get(kind, 0.0), r["msgs_per_s"])
            print(f"  {kind:10} {r['msgs_per_s']:>10,.0f} records/s")
    ratio = best["tumbling"] / best["wordcount"]
    print(f"rocksdb word count:        {best['wordcount']:>10,.0f} records/s")
    print(f"rocksdb tumbling count:    {best['tumbling']:>10,.0f} records/s")
    print(f"tumbling / word count: {ratio:.2f} (target >= 0.6)")
    print(quix_note())
    delete_topics(args.bootstrap, [source, output])


if __name__ == "__main__":
    main()
