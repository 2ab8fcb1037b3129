"""Reach: join two co-partitioned topics partition-wise, the Kasper way.

`followers` holds each user's follower count and `tweets` each tweet, both keyed by
user, with the same partition count; so partition p of both topics holds every
record of the same users, and one MessageProcessor per partition joins them with a
plain dict, no shuffle and no remote lookup. For every tweet it sends
{"tweet_id", "user", "reach"} to `reach`, where reach is the user's follower count.

A tweet is joined with the follower counts that arrived in its own batch or an
earlier one: like any stream-table join without time alignment, a tweet that
overtakes its user's first follower count gets reach 0.

Delivery: at-least-once. After a crash the last uncommitted batch is replayed, so a
tweet's reach can be sent twice; the follower table is plain memory and is rebuilt
from `followers` only for records not yet committed (use a RocksDB table, see
rocksdb_wordcount.py, to keep it across restarts).

    python examples/reach.py --bootstrap 127.0.0.1:19092 --sample 1000 --until-caught-up

As a target of the command line, the topic prefix is that of the first input topic
(``<prefix>tweets``), e.g. replaying history on the local Spark cluster:

    kasper reprocess reach:ReachProcessor --app-dir examples --name reach \
        --input-topics tweets,followers --master spark://127.0.0.1:17077
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from collections import Counter
from typing import Any

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor

TWEETS, FOLLOWERS, REACH = "tweets", "followers", "reach"


class ReachProcessor(MessageProcessor):
    """Keeps one partition's follower counts and sends each tweet's reach."""

    def __init__(self, context: ProcessorContext, prefix: str | None = None) -> None:
        if prefix is None:  # run by name (`kasper reprocess reach:ReachProcessor`)
            prefix = context.config.input_topics[0].removesuffix(TWEETS)
        self.partition = context.partition
        self.followers: dict[str, int] = {}
        self.tweets_topic = prefix + TWEETS
        self.followers_topic = prefix + FOLLOWERS
        self.reach_topic = prefix + REACH

    def process(self, messages: list[Message], sender: Sender) -> None:
        # Within a batch, topics arrive interleaved in no fixed order; applying the
        # follower updates first makes the result independent of that order.
        for message in messages:
            if message.topic == self.followers_topic:
                self.followers[message.value["user"]] = message.value["followers"]
        for message in messages:
            if message.topic == self.tweets_topic:
                user = message.value["user"]
                reach = {"tweet_id": message.value["tweet_id"], "user": user,
                         "reach": self.followers.get(user, 0)}
                sender.send(self.reach_topic, reach, key=user)


def make_config(args: argparse.Namespace) -> Config:
    return Config(
        name=args.name, bootstrap_servers=args.bootstrap,
        input_topics=(args.prefix + TWEETS, args.prefix + FOLLOWERS),
        batch_size=args.batch_size, batch_wait=args.batch_wait,
        key_serde="str", value_serde="json", metrics_port=args.metrics_port,
        max_latency=None,  # classic batches of --batch-size: followers read with the tweets
    )


def produce_sample(bootstrap: str, prefix: str, partitions: int, tweets: int) -> dict[str, int]:
    """Create the topics and write `tweets` tweets by 50 users; return followers per user."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = [prefix + t for t in (TWEETS, FOLLOWERS, REACH)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(30)
    rng = random.Random(7)
    followers = {f"user{i}": rng.randint(0, 10_000) for i in range(50)}
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True})
    for user, count in followers.items():
        producer.produce(prefix + FOLLOWERS, json.dumps({"user": user, "followers": count}),
                         key=user)
    producer.flush(30)  # followers first, so every tweet finds its user's count
    for n in range(tweets):
        user = rng.choice(list(followers))
        producer.produce(prefix + TWEETS, json.dumps({"tweet_id": n, "user": user}), key=user)
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    return followers


def summarise(bootstrap: str, topic: str, count: int, timeout: float = 60.0,
              followers: dict[str, int] | None = None) -> dict[str, Any]:
    """Read `count` reach messages back (or what arrives within `timeout`) and summarise;
    with `followers`, also count the messages whose reach differs from it."""
    import time

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"summary-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    reach: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(reach) < count and time.monotonic() < deadline:
        batch = consumer.consume(10_000, 0.5)
        reach.extend(json.loads(m.value()) for m in batch if m.error() is None)
    consumer.close()
    top = Counter({r["user"]: r["reach"] for r in reach}).most_common(3)
    summary = {"reach_messages": len(reach), "total_reach": sum(r["reach"] for r in reach),
               "users": len({r["user"] for r in reach}), "top_users_by_reach": top}
    if followers is not None:
        summary["wrong_reach"] = sum(r["reach"] != followers[r["user"]] for r in reach)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="reach")
    parser.add_argument("--prefix", default="", help="prefix for the three topic names")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--sample", type=int, default=0, help="produce this many sample tweets")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batch-wait", type=float, default=0.5)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--until-caught-up", action="store_true",
                        help="stop once every input partition is consumed")
    args = parser.parse_args(argv)
    if args.sample:
        produce_sample(args.bootstrap, args.prefix, args.partitions, args.sample)
    with TopicProcessor(make_config(args), lambda c: ReachProcessor(c, args.prefix)) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        processor.run_until_stopped(until_caught_up=args.until_caught_up)
    if args.sample:
        print(json.dumps(summarise(args.bootstrap, args.prefix + REACH, args.sample), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
