"""Passthrough throughput: TopicProcessor against a raw confluent-kafka loop.

Both loops consume a batch, produce every message to an output topic, wait for every
ack, then commit synchronously (the same at-least-once contract), on the same broker,
in the same run, each in its own process so peak RSS is its own. Prints msgs/s for
both, the ratio, and peak RSS. A benchmark, not a test: it asserts nothing.

    python bench/bench_passthrough.py --messages 1000000 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import uuid
from typing import Any

from benchkit import arguments, create_topics, delete_topics, fill, payloads
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition


def raw_loop(bootstrap: str, source: str, output: str, total: int, batch_size: int) -> None:
    """The baseline: confluent-kafka by hand, one produce() per message."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "queue.buffering.max.messages": 1_000_000})
    partitions = consumer.list_topics(source, timeout=30).topics[source].partitions
    consumer.assign([TopicPartition(source, p, OFFSET_BEGINNING) for p in partitions])
    done = 0
    while done < total:
        batch = consumer.consume(batch_size, 1.0)
        offsets: dict[tuple[str, int], int] = {}
        for msg in batch:
            while True:
                try:
                    producer.produce(output, msg.value(), msg.key(), msg.partition())
                    break
                except BufferError:
                    producer.poll(0.05)
            offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
        producer.flush(60)
        if offsets:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                            asynchronous=False)
        done += len(batch)
    consumer.close()


def kasper_loop(bootstrap: str, source: str, output: str, total: int, batch_size: int) -> None:
    """The same work through TopicProcessor."""
    import logging

    import structlog

    from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
    from kasper_py.observe import NoopObserver, TurnStats

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    class Passthrough(MessageProcessor):
        def process(self, messages: list[Message], sender: Sender) -> None:
            send = sender.send
            for m in messages:
                send(output, m.value, m.key, m.partition)

    class StopWhenDone(NoopObserver):
        """Stops the loop after the turn that commits the last message, as the raw loop does."""

        done = 0

        def on_turn(self, stats: TurnStats) -> None:
            self.done += len(stats.batch)
            if self.done >= total:
                processor.close()

    config = Config(name=f"bench-{uuid.uuid4()}", bootstrap_servers=bootstrap,
                    input_topics=[source], batch_size=batch_size, batch_wait=1.0)
    processor = TopicProcessor(config, lambda _c: Passthrough(), observer=StopWhenDone())
    processor.run_loop()


def child(args: argparse.Namespace) -> None:
    loop = raw_loop if args.child == "raw" else kasper_loop
    started = time.perf_counter()
    loop(args.bootstrap, args.source, args.output, args.messages, args.batch_size)
    elapsed = time.perf_counter() - started
    print(json.dumps({"loop": args.child, "seconds": elapsed,
                      "msgs_per_s": args.messages / elapsed, "peak_rss_mib": peak_rss_mib()}))


def peak_rss_mib() -> float:
    """This process's own peak RSS. Linux keeps ``ru_maxrss`` across exec, so a child
    forked from the bench (which holds the input payloads) would report the parent's
    size; VmHWM belongs to the exec'd image alone."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(kind: str, args: argparse.Namespace, source: str) -> dict[str, Any]:
    output = f"bench-out-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [output], args.partitions)
    cmd = [sys.executable, __file__, "--child", kind, "--bootstrap", args.bootstrap,
           "--source", source, "--output", output, "--messages", str(args.messages),
           "--batch-size", str(args.batch_size)]
    result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    delete_topics(args.bootstrap, [output])
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=1_000_000, partitions=4)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--child", choices=["raw", "kasper"])
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    source = f"bench-in-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [source], args.partitions)
    fill(args.bootstrap, source, args.partitions, payloads(args.messages, args.size))
    print(f"input: {args.messages} messages of {args.size} bytes on {args.partitions} "
          f"partitions, batch_size {args.batch_size}")
    results: dict[str, list[dict[str, Any]]] = {"raw": [], "kasper": []}
    for _ in range(args.rounds):  # alternate, so both see the same machine conditions
        for kind in ("raw", "kasper"):
            results[kind].append(run_child(kind, args, source))
            r = results[kind][-1]
            print(f"  {kind:6} {r['msgs_per_s']:>10,.0f} msgs/s  "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB")
    best = {k: max(v, key=lambda r: r["msgs_per_s"]) for k, v in results.items()}
    ratio = best["kasper"]["msgs_per_s"] / best["raw"]["msgs_per_s"]
    print(f"best raw confluent-kafka: {best['raw']['msgs_per_s']:,.0f} msgs/s, "
          f"peak RSS {best['raw']['peak_rss_mib']:.0f} MiB")
    print(f"best kasper_py:           {best['kasper']['msgs_per_s']:,.0f} msgs/s, "
          f"peak RSS {best['kasper']['peak_rss_mib']:.0f} MiB")
    print(f"ratio kasper/raw: {ratio:.2f} (target >= 0.8)")
    delete_topics(args.bootstrap, [source])


if __name__ == "__main__":
    main()
