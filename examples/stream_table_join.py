"""Stream-table join: orders enriched with their customer, the customers held in a local
RocksDB table backed by a changelog.

`customers` (keyed by customer id, a JSON profile) and `orders` (keyed by customer id)
are co-partitioned, so each partition's processor sees every order and every profile
update of its customers: the profiles are kept in the table `customers`, and each order
is sent to `enriched-orders` with the profile as the table holds it. The loop aligns
the two topics by timestamp (docs/concepts.md): a batch ends, per partition, at the
newest timestamp both topics have reached, and waits for a topic whose records are still
on the broker (or not yet known: its first fetch has not answered), so no profile update
is applied before an order stamped earlier. Within the batch the messages are taken in
timestamp order: an order never sees a profile update stamped after it. A caught-up
topic is not waited for (`max_task_idle`, Kafka Streams' max.task.idle.ms, would wait),
so a profile update written after its order was processed is seen by later orders only.

Delivery: at-least-once. A crash replays the last uncommitted batch: its enriched orders
may be sent twice, with the same profiles.

    python examples/stream_table_join.py --sample 1000 --until-caught-up
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from _sample import create_topics  # isort: skip - the examples' shared sample helper
from confluent_kafka import Producer

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.stores.rocksdb import RocksDBTable

CUSTOMERS, ORDERS, ENRICHED = "customers", "orders", "enriched-orders"


class EnrichOrders(MessageProcessor):
    """Keeps profiles in the table; sends each order with its customer's profile."""

    def __init__(self, context: ProcessorContext, prefix: str) -> None:
        self.customers = context.store("customers")
        self.profiles_topic, self.output_topic = prefix + CUSTOMERS, prefix + ENRICHED

    def process(self, messages: list[Message], sender: Sender) -> None:
        ordered = sorted(messages, key=lambda m: m.timestamp or 0)  # stable: offsets kept
        profiles = self.customers.get_many({m.key for m in ordered})
        updated: dict[str, Any] = {}
        for m in ordered:
            if m.topic == self.profiles_topic:
                profiles[m.key] = updated[m.key] = m.value
            else:
                sender.send(self.output_topic, {**m.value, "customer": profiles.get(m.key)},
                            key=m.key)
        self.customers.put_many(updated)


def produce_sample(bootstrap: str, prefix: str, partitions: int, orders: int) -> None:
    """Create the topics; write 20 profiles, then `orders` orders 10 ms apart (event time),
    each tenth followed 5 ms later by a new profile of its customer (level up)."""
    create_topics(bootstrap, [prefix + t for t in (CUSTOMERS, ORDERS, ENRICHED)], partitions)
    rng = random.Random(5)
    # idempotent: a batch retried (the topics are new, their leaders maybe not elected yet)
    # is never written after a later one, so each partition stays in timestamp order
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True})
    level = dict.fromkeys((f"c{n}" for n in range(20)), 1)
    start = int(time.time() * 1000) - orders * 10 - 60_000
    for customer in level:
        producer.produce(prefix + CUSTOMERS, json.dumps({"level": 1}), key=customer,
                         timestamp=start)
    for n in range(orders):
        customer, at = rng.choice(sorted(level)), start + 10 + n * 10
        producer.produce(prefix + ORDERS, json.dumps({"order": n, "level": level[customer]}),
                         key=customer, timestamp=at)
        if n % 10 == 9:
            level[customer] += 1
            producer.produce(prefix + CUSTOMERS, json.dumps({"level": level[customer]}),
                             key=customer, timestamp=at + 5)
        producer.poll(0)
    producer.flush(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="stream-table-join")
    parser.add_argument("--prefix", default="", help="prefix of the three topic names")
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="produce this many sample orders")
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    if args.sample:
        produce_sample(args.bootstrap, args.prefix, args.partitions, args.sample)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap,
                    input_topics=[args.prefix + CUSTOMERS, args.prefix + ORDERS],
                    batch_size=500, state_dir=args.state_dir, key_serde="str",
                    value_serde="json",
                    max_latency=None)  # classic batches: profiles read with their orders
    with TopicProcessor(config, lambda c: EnrichOrders(c, args.prefix),
                        stores=[RocksDBTable("customers")]) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        processor.run_until_stopped(until_caught_up=args.until_caught_up)
    return 0


if __name__ == "__main__":
    sys.exit(main())
