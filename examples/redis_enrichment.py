"""Enrichment from Redis: a stream of clicks joined with a table of users held in Redis.

`users` (key: user id, value: JSON profile) and `clicks` (key: user id, value: JSON
{"page"}) are co-partitioned. The processor upserts every profile into the Redis table
"profiles" (keys `<name>/profiles/<user id>`, shared across partitions because the user
id decides the partition, and readable by any other service), and sends every click with
its user's profile to `enriched-clicks`. Each batch costs one MGET and one MULTI/EXEC.

Delivery: at-least-once. A crash replays the last uncommitted batch: its enriched clicks
can be sent twice (at most one batch per crash); profile writes are idempotent.

    python examples/redis_enrichment.py --sample 5000 --until-caught-up
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

import redis

from _sample import create_topics  # isort: skip - the examples' shared sample helper
from confluent_kafka import Producer

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.stores.redis import RedisTable

USERS, CLICKS, ENRICHED = "users", "clicks", "enriched-clicks"


class Enrich(MessageProcessor):
    """Applies the batch's profile updates, then enriches its clicks from the table."""

    def __init__(self, context: ProcessorContext, prefix: str = "") -> None:
        self.profiles = context.store("profiles")
        self.users_topic, self.enriched_topic = prefix + USERS, prefix + ENRICHED

    def process(self, messages: list[Message], sender: Sender) -> None:
        # Profiles first, so a click sees an update that arrived in the same batch
        # (reads see buffered writes); the order of topics within a batch is not fixed.
        self.profiles.put_many({m.key: m.value for m in messages if m.topic == self.users_topic})
        clicks = [m for m in messages if m.topic != self.users_topic]
        profiles = self.profiles.get_many({m.key for m in clicks})
        for click in clicks:
            enriched = {**click.value, "user": click.key, "profile": profiles.get(click.key)}
            sender.send(self.enriched_topic, enriched, key=click.key)


def produce_sample(bootstrap: str, prefix: str, partitions: int, clicks: int) -> None:
    """Create the topics, write 100 user profiles, then `clicks` clicks by those users."""
    create_topics(bootstrap, [prefix + t for t in (USERS, CLICKS, ENRICHED)], partitions)
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True})
    for n in range(100):
        profile = {"name": f"user {n}", "country": rng.choice(["fr", "de", "jp", "br"])}
        producer.produce(prefix + USERS, json.dumps(profile), key=f"u{n}")
    producer.flush(30)
    for n in range(clicks):
        user = f"u{rng.randrange(100)}"
        producer.produce(prefix + CLICKS, json.dumps({"page": f"/p/{n % 17}"}), key=user)
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:16379/0")
    parser.add_argument("--name", default="redis-enrichment")
    parser.add_argument("--prefix", default="", help="prefix for the three topic names")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="produce this many sample clicks")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    if args.sample:
        produce_sample(args.bootstrap, args.prefix, args.partitions, args.sample)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap,
                    input_topics=[args.prefix + USERS, args.prefix + CLICKS],
                    batch_size=args.batch_size, key_serde="str", value_serde="json")
    table = RedisTable("profiles", url=args.redis_url, shared=True)
    with TopicProcessor(config, lambda c: Enrich(c, args.prefix), stores=[table]) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        processor.run_until_stopped(until_caught_up=args.until_caught_up)
    print_sample(args.redis_url, args.name)
    return 0


def print_sample(redis_url: str, name: str) -> None:
    """Show one profile as another service would read it from Redis."""
    value: Any = redis.Redis.from_url(redis_url).get(f"{name}/profiles/u0")
    print(f"{name}/profiles/u0 =", value.decode() if value else None)


if __name__ == "__main__":
    sys.exit(main())
