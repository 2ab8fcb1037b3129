"""Reprocessing throughput: kasper_py.reprocess on local[2] against the live loop,
over the same history.

Both run a passthrough processor (every input message produced to an output topic,
idempotent, acks=all) over the same input topic, each in its own process. The live
loop is a TopicProcessor reading from the start until it is caught up. Reprocessing
is timed twice: the Spark job alone (``job``), and end to end including the start of
the local SparkSession and the range planning (``total``). Prints msgs/s for each and
the ratios. A benchmark, not a test: it asserts nothing.

Reprocessing pays a fixed start-up (the JVM, Python workers, the first Kafka reads:
about 8 s here, 15 s with the session) that a history of a few million messages
amortizes; the default input is sized for that.

    python bench/bench_reprocess.py --messages 3000000 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import uuid
from functools import partial
from typing import Any

import structlog
from benchkit import arguments, create_topics, delete_topics, fill, payloads

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.reprocess import reprocess as run_reprocess
from kasper_py.reprocess import spark_session


class Passthrough(MessageProcessor):
    """Sends every value on to the output topic, on the input's partition."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        send, output = sender.send, self.output
        for m in messages:
            send(output, m.value, m.key, m.partition)


def config(args: argparse.Namespace, kind: str) -> Config:
    return Config(name=f"bench-{kind}-{uuid.uuid4().hex[:8]}", bootstrap_servers=args.bootstrap,
                  input_topics=[args.source], batch_size=args.batch_size, batch_wait=1.0)


def live(args: argparse.Namespace) -> dict[str, Any]:
    """The live loop from the earliest offset until caught up."""
    processor = TopicProcessor(config(args, "live"), lambda c: Passthrough(c, args.output))
    started = time.perf_counter()
    processor.run_loop(until_caught_up=True)
    seconds = time.perf_counter() - started
    processor.close()
    return {"seconds": seconds}


def reprocess(args: argparse.Namespace) -> dict[str, Any]:
    """The same history through kasper_py.reprocess, on a fresh local[2] session."""
    started = time.perf_counter()
    spark = spark_session("local[2]", conf={"spark.ui.enabled": "false",
                                            "spark.ui.showConsoleProgress": "false"})
    result = run_reprocess(config(args, "reprocess"), partial(Passthrough, output=args.output),
                 spark=spark)
    total = time.perf_counter() - started
    spark.stop()
    assert result.messages == args.messages, (result.messages, args.messages)
    return {"seconds": result.seconds, "total_seconds": total}


def child(args: argparse.Namespace) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = live(args) if args.child == "live" else reprocess(args)
    print(json.dumps(result))


def run_child(kind: str, args: argparse.Namespace, source: str) -> dict[str, Any]:
    output = f"bench-out-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [output], args.partitions)
    cmd = [sys.executable, __file__, "--child", kind, "--bootstrap", args.bootstrap,
           "--source", source, "--output", output, "--messages", str(args.messages),
           "--batch-size", str(args.batch_size)]
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    finally:
        delete_topics(args.bootstrap, [output])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(results: dict[str, list[dict[str, Any]]], messages: int) -> None:
    live_rate = max(messages / r["seconds"] for r in results["live"])
    job_rate = max(messages / r["seconds"] for r in results["reprocess"])
    total_rate = max(messages / r["total_seconds"] for r in results["reprocess"])
    print(f"best live loop:                 {live_rate:>10,.0f} msgs/s")
    print(f"best reprocess, Spark job:      {job_rate:>10,.0f} msgs/s")
    print(f"best reprocess, with start-up:  {total_rate:>10,.0f} msgs/s")
    print(f"ratio reprocess/live: {job_rate / live_rate:.2f} (job), "
          f"{total_rate / live_rate:.2f} (with start-up); target >= 1")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=3_000_000, partitions=4)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--child", choices=["live", "reprocess"])
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    source = f"bench-in-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [source], args.partitions)
    fill(args.bootstrap, source, args.partitions,
         payloads(args.messages, args.size, keyed=True))
    print(f"input: {args.messages} messages of {args.size} bytes on {args.partitions} "
          f"partitions, batch_size {args.batch_size}, Spark local[2]")
    results: dict[str, list[dict[str, Any]]] = {"live": [], "reprocess": []}
    for _ in range(args.rounds):  # alternate, so both see the same machine conditions
        for kind in ("live", "reprocess"):
            r = run_child(kind, args, source)
            results[kind].append(r)
            extra = f", {args.messages / r['total_seconds']:,.0f} with start-up" \
                if "total_seconds" in r else ""
            print(f"  {kind:9} {args.messages / r['seconds']:>10,.0f} msgs/s{extra}", flush=True)
    report(results, args.messages)
    delete_topics(args.bootstrap, [source])


if __name__ == "__main__":
    main()
