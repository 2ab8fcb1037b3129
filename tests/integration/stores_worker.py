"""A word count over a durable store, run as its own process so tests can kill -9 it.

    python stores_worker.py KIND BOOTSTRAP NAME TOPIC BATCH_SIZE [--until-caught-up]
        [--effectively-once] [--state-dir DIR] [--redis-url URL]
        [--cassandra HOST:PORT] [--keyspace KS] [--opensearch-url URL] [--pause SECONDS]
        [--exactly-once] [--output TOPIC] [--force] [--group] [--metrics-port PORT]

KIND is redis, cassandra, opensearch or rocksdb. The store is called "counts"; each input value is
one or more words, and a word written "-word" deletes that word's count. With
``--output`` every input message is also sent on, key and value unchanged.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.stores.base import StoreSpec


class WordCount(MessageProcessor):
    """Adds each batch's word counts to the store "counts" with one get_many and one
    put_many; ``hook(messages)`` runs between the read and the writes."""

    def __init__(self, context: ProcessorContext, pause: float = 0.0,
                 hook: Callable[[list[Message]], None] | None = None,
                 output: str | None = None) -> None:
        self.counts = context.store("counts")
        self.pause = pause
        self.hook = hook
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = [word for m in messages for word in m.value.split()]
        totals: dict[str, Any] = self.counts.get_many({w.lstrip("-") for w in words})
        if self.hook is not None:
            self.hook(messages)
        for word in words:
            if word.startswith("-"):
                totals[word[1:]] = None
            else:
                totals[word] = (totals.get(word) or 0) + 1
        self.counts.put_many({w: n for w, n in totals.items() if n is not None})
        self.counts.delete_many([w for w, n in totals.items() if n is None])
        if self.output is not None:
            for m in messages:
                sender.send(self.output, m.value, m.key)
        if self.pause:
            time.sleep(self.pause)


def store_spec(kind: str, args: argparse.Namespace) -> StoreSpec:
    """The "counts" table of ``kind`` as the options describe it."""
    if kind == "redis":
        from kasper_py.stores.redis import RedisTable  # only the backend in use is imported

        return RedisTable("counts", url=args.redis_url, effectively_once=args.effectively_once)
    if kind == "cassandra":
        from kasper_py.stores.cassandra import CassandraTable

        host, port = args.cassandra.split(":")
        return CassandraTable("counts", contact_points=[host], port=int(port),
                              keyspace=args.keyspace, effectively_once=args.effectively_once)
    if kind == "opensearch":
        from kasper_py.stores.opensearch import OpenSearchTable

        return OpenSearchTable("counts", url=args.opensearch_url,
                               effectively_once=args.effectively_once)
    from kasper_py.stores.rocksdb import RocksDBTable

    return RocksDBTable("counts")


def main() -> None:
    parser = argparse.ArgumentParser()
    for positional in ("kind", "bootstrap", "name", "topic"):
        parser.add_argument(positional)
    parser.add_argument("batch_size", type=int)
    parser.add_argument("--until-caught-up", action="store_true")
    parser.add_argument("--effectively-once", action="store_true")
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:16379/0")
    parser.add_argument("--cassandra", default="127.0.0.1:19042")
    parser.add_argument("--keyspace", default="kasper_tests")
    parser.add_argument("--opensearch-url", default="http://127.0.0.1:19200")
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--exactly-once", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--group", action="store_true", help="assignment='group'")
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args()
    guarantee = "exactly_once" if args.exactly_once else "at_least_once"
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.topic],
                    batch_size=args.batch_size, batch_wait=0.2, state_dir=args.state_dir,
                    key_serde="str", value_serde="str", processing_guarantee=guarantee,
                    assignment="group" if args.group else "static",
                    metrics_port=args.metrics_port)
    processor = TopicProcessor(config, lambda c: WordCount(c, args.pause, output=args.output),
                               stores=[store_spec(args.kind, args)], force=args.force)
    print("started", flush=True)
    with processor:
        processor.run_until_stopped(until_caught_up=args.until_caught_up)


if __name__ == "__main__":
    main()
