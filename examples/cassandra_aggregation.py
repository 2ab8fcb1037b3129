"""Cassandra aggregation: exact spend per customer, kept in Cassandra effectively-once.

`purchases` (key: customer id, value: JSON {"amount"}) is summed per customer into the
Cassandra table `kasper.spend` (keyspace and table are created when absent). The table
is effectively-once: each batch's writes and its input offsets are applied together in
one conditional batch (a lightweight transaction), and replayed input is skipped. For
every batch the processor sends each changed customer's {"count", "total"} to
`customer-totals`.

Delivery: the totals in Cassandra are exact, even across crashes. The messages on
`customer-totals` are at-least-once: after a crash the last batch's can be sent again,
with the same values.

    python examples/cassandra_aggregation.py --sample 5000 --until-caught-up
"""

from __future__ import annotations

import argparse
import json
import random
import sys
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
from kasper_py.stores.cassandra import CassandraTable

PURCHASES, TOTALS = "purchases", "customer-totals"


class SpendPerCustomer(MessageProcessor):
    """Adds each batch's purchases to the customers' totals: one read, one write."""

    def __init__(self, context: ProcessorContext, output_topic: str) -> None:
        self.spend = context.store("spend")
        self.output_topic = output_topic

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals = self.spend.get_many({m.key for m in messages})
        for message in messages:
            total = totals.get(message.key, {"count": 0, "total": 0})
            totals[message.key] = {"count": total["count"] + 1,
                                   "total": round(total["total"] + message.value["amount"], 2)}
        self.spend.put_many(totals)
        for customer, total in sorted(totals.items()):
            sender.send(self.output_topic, total, key=customer)


def produce_sample(bootstrap: str, topic: str, partitions: int, purchases: int) -> float:
    """Create `topic`, write `purchases` purchases by 20 customers; return their sum."""
    create_topics(bootstrap, [topic], partitions)
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True})
    spent = 0.0
    for n in range(purchases):
        amount = round(rng.uniform(1, 100), 2)
        spent += amount
        producer.produce(topic, json.dumps({"amount": amount}), key=f"c{rng.randrange(20)}")
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    return spent


def print_totals(stores: list[Any]) -> None:
    """Sum the sample's customers over every partition's table, read back from Cassandra."""
    customers = {f"c{n}" for n in range(20)}
    totals = [t for store in stores for t in store.get_many(customers).values()]
    print(f"in Cassandra: {sum(t['count'] for t in totals)} purchases, "
          f"{sum(t['total'] for t in totals):.2f} spent")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--cassandra", default="127.0.0.1:19042", help="host:port")
    parser.add_argument("--keyspace", default="kasper")
    parser.add_argument("--name", default="cassandra-aggregation")
    parser.add_argument("--input", default=PURCHASES)
    parser.add_argument("--output", default=TOTALS)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="produce this many purchases")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    if args.sample:
        spent = produce_sample(args.bootstrap, args.input, args.partitions, args.sample)
        print(f"sample: {args.sample} purchases, {spent:.2f} spent")
    host, port = args.cassandra.rsplit(":", 1)
    table = CassandraTable("spend", contact_points=[host], port=int(port),
                           keyspace=args.keyspace, effectively_once=True)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.input],
                    batch_size=args.batch_size, key_serde="str", value_serde="json",
                    output_topics=[OutputTopic(args.output)])
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    stores: list[Any] = []

    def factory(context: ProcessorContext) -> SpendPerCustomer:
        processor = SpendPerCustomer(context, args.output)
        stores.append(processor.spend)
        return processor

    with TopicProcessor(config, factory, stores=[table]) as processor:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the processor closes
        if processor.run_until_stopped(until_caught_up=args.until_caught_up) is None:
            print_totals(stores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
