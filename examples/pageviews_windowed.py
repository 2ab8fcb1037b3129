"""Page views per user per minute: a 1-minute tumbling window with 10 s of grace, kept
in a local RocksDB table backed by a changelog.

Views arrive on `pageviews`, keyed by user, their Kafka timestamp the time of the view,
out of order by up to 8 s. Stream time per partition is the latest view time seen; a
minute's window closes 10 s after the minute ends, and its final count is sent to
`pageviews-per-minute` as {"user", "start", "end", "views"} (times in ms). A view that
arrives after its window closed is dropped and counted in kasper_late_records_total.
The sample writes a few such late views, and ends with one view per user ten minutes
on, so every sampled minute closes.

Delivery: at-least-once (a crash may send a minute's final count again); with
--exactly-once, counts, window state and offsets commit in one transaction.

    python examples/pageviews_windowed.py --sample 2000 --until-caught-up
"""

from __future__ import annotations

import argparse
import random
import sys
import time
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
from kasper_py.windows import Tumbling, WindowedTable, count

USERS = ["ana", "bo", "cy"]
MINUTE = 60_000
LATE = 5
"""Views the sample sends after their window closed."""


class PageViewsPerMinute(MessageProcessor):
    """Counts views per user and minute; sends each minute's count when it closes."""

    def __init__(self, context: ProcessorContext, output_topic: str) -> None:
        self.context = context
        self.views = WindowedTable(context, "views", Tumbling(60, grace=10), count(),
                                   emit="final")
        self.output_topic = output_topic
        self.sent: list[tuple[str, int, int]] = []
        """(user, minute start, views) of every final count this processor sent."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        event_time = self.context.event_time  # Kafka's timestamp, or Config's extractor
        for window in self.views.update((m.key, event_time(m), m.value) for m in messages):
            sender.send(self.output_topic, {"user": window.key, "start": window.start,
                                            "end": window.end, "views": window.value},
                        key=window.key)
            self.sent.append((window.key, window.start, window.value))


def sample_start(count: int) -> int:
    """Where ``count`` sample views start (ms, a whole minute) so that the last, closing
    views are a few minutes old: neither past the broker's retention nor in the future."""
    start = int(time.time() * 1000) - count * 250 - 15 * MINUTE
    return start - start % MINUTE


def sample_views(count: int, start: int) -> list[tuple[str, int, str]]:
    """(user, view time ms, page) in the order the sample writes them: ``count`` views a
    quarter second apart from ``start``, shuffled by up to 8 s, then ``LATE`` late views
    of the first minute, then one view per user ten minutes after the last."""
    rng = random.Random(11)
    views = [(rng.choice(USERS), start + n * 250, f"/page/{rng.randrange(20)}")
             for n in range(count)]
    views.sort(key=lambda view: view[1] + rng.randrange(8000))
    views += [(USERS[n % len(USERS)], start + 1000 * n, "/late") for n in range(LATE)]
    end = start + count * 250 + 10 * MINUTE
    return views + [(user, end, "/closing") for user in USERS]


def expected_counts(views: list[tuple[str, int, str]]) -> Counter[tuple[str, int]]:
    """Views per (user, minute start) of the sampled minutes, late and closing ones left out."""
    return Counter((user, at - at % MINUTE) for user, at, page in views
                   if page not in ("/late", "/closing"))


def produce_sample(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    """Create `topic` and write the sample views, each with its view time as timestamp;
    print where the sample starts."""
    start = sample_start(count)
    print("sample start:", start)
    create_topics(bootstrap, [topic], partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    for user, at, page in sample_views(count, start):
        producer.produce(topic, f'"{page}"', key=user, timestamp=at)
        producer.poll(0)
    producer.flush(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="pageviews-windowed")
    parser.add_argument("--input", default="pageviews")
    parser.add_argument("--output", default="pageviews-per-minute")
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="produce this many sample views")
    parser.add_argument("--until-caught-up", action="store_true")
    parser.add_argument("--exactly-once", action="store_true")
    args = parser.parse_args(argv)
    if args.sample:
        produce_sample(args.bootstrap, args.input, args.partitions, args.sample)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.input],
                    batch_size=500, state_dir=args.state_dir, key_serde="str",
                    value_serde="json", processing_guarantee="exactly_once"
                    if args.exactly_once else "at_least_once",
                    output_topics=[OutputTopic(args.output)])
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    processors: list[PageViewsPerMinute] = []

    def factory(context: ProcessorContext) -> PageViewsPerMinute:
        processors.append(PageViewsPerMinute(context, args.output))
        return processors[-1]

    # Windows encode their own entries: the table keeps bytes as they are.
    views = RocksDBTable("views", key_serde="bytes", value_serde="bytes")
    with TopicProcessor(config, factory, stores=[views]) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        if processor.run_until_stopped(until_caught_up=args.until_caught_up) is None:
            report(processors)
    return 0


def report(processors: list[Any]) -> None:
    """Print the final counts sent in this run, and the late views dropped."""
    print("final counts (user, minute start, views):")
    for user, start, views in sorted(s for p in processors for s in p.sent):
        print(f"  {user:4} {start} {views}")
    print("late views dropped:", sum(p.views.late_records for p in processors))


if __name__ == "__main__":
    sys.exit(main())
