"""What the bench scripts share: topic set-up and clean-up, filling an input topic,
commit latency figures, and the command-line options every bench takes. Not part of
the library."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.observability.observe import NoopObserver, TurnStats

CHUNK = 10_000
"""Records per produce_batch call, and per partition turn when filling."""


def create_topics(bootstrap: str, names: list[str], partitions: int, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(n, partitions, 1, config=config) for n in names]
    for future in admin.create_topics(new).values():
        future.result(60)


def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names).values():
        future.result(60)


def payloads(messages: int, size: int, *, keyed: bool = False) -> list[dict[str, Any]]:
    """``messages`` produce_batch records with one random value of ``size`` bytes; keyed
    records carry keys ``key-0`` .. ``key-9999`` in turn."""
    value = os.urandom(size // 2 + 1).hex().encode()[:size]
    chunk = [{"key": b"key-%d" % i, "value": value} if keyed else {"value": value}
             for i in range(CHUNK)]
    return chunk * (messages // CHUNK) + chunk[:messages % CHUNK]


def fill(bootstrap: str, topic: str, partitions: int, records: Sequence[dict[str, Any]]) -> None:
    """Write ``records`` (produce_batch entries) in chunks dealt round-robin over the
    partitions, and wait for every ack. Records with a ``timestamp`` are produced one by
    one (produce_batch cannot set timestamps)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.num.messages": CHUNK, "queue.buffering.max.messages": 1_000_000})
    for start in range(0, len(records), CHUNK):
        chunk = list(records[start:start + CHUNK])
        partition = (start // CHUNK) % partitions
        batches = [[record] for record in chunk] if "timestamp" in chunk[0] else [chunk]
        for batch in batches:
            while True:
                try:
                    if len(batch) == 1 and "timestamp" in batch[0]:
                        producer.produce(topic, partition=partition, **batch[0])
                    else:
                        producer.produce_batch(topic, batch, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
    producer.flush(120)


class Passthrough(MessageProcessor):
    """Sends every message on to ``output``, same key, value and partition."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        send, output = sender.send, self.output
        for m in messages:
            send(output, m.value, m.key, m.partition)


class WordCount(MessageProcessor):
    """Adds each batch's words to the table ``counts`` (one ``get_many``, one
    ``put_many``) and sends each changed total on, keyed by its word, once a batch; the
    outputs it sent are in ``sent``."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.counts = context.store("counts")
        self.output = output
        self.sent = 0

    def process(self, messages: list[Message], sender: Sender) -> None:
        batch = Counter(word for m in messages for word in m.value.split())
        totals = self.counts.get_many(batch)
        for word, count in batch.items():
            totals[word] = totals.get(word, 0) + count
        self.counts.put_many(totals)
        send, output = sender.send, self.output
        for word, total in totals.items():
            send(output, str(total), word)
        self.sent += len(totals)


class StopWhenDone(NoopObserver):
    """Stops the loop after the turn that commits the last message; counts batches and
    keeps each turn's commit seconds."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.partition_batches = total, 0, 0
        self.commits: list[float] = []
        self.processor: TopicProcessor | None = None

    def on_turn(self, stats: TurnStats) -> None:
        self.done += len(stats.batch)
        self.partition_batches += len({p for _, p in stats.batch.ranges})
        self.commits.append(stats.durations["commit"])
        if self.done >= self.total and self.processor is not None:
            self.processor.close()


def commit_latency(seconds: Sequence[float]) -> dict[str, float | int | None]:
    """A loop's commit times (one a turn; with exactly-once, the transaction's) as the
    ``commits`` count and their median, p99 and max in milliseconds (None if none). Over
    fewer than 100 commits the p99 is interpolated between the largest two."""
    if not seconds:
        return {"commits": 0, "commit_ms_p50": None, "commit_ms_p99": None,
                "commit_ms_max": None}
    ms = [s * 1000 for s in seconds]
    p99 = statistics.quantiles(ms, n=100, method="inclusive")[98] if len(ms) > 1 else ms[0]
    return {"commits": len(ms), "commit_ms_p50": statistics.median(ms), "commit_ms_p99": p99,
            "commit_ms_max": max(ms)}


def arguments(description: str, *, messages: int, partitions: int, rounds: int = 2,
              batch_size: int | None = 10_000) -> argparse.ArgumentParser:
    """A parser with the options every bench takes; each script adds its own. A script
    that sweeps batch sizes passes ``batch_size=None`` and adds its own option."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", default=os.environ.get("KASPER_BOOTSTRAP_SERVERS",
                                                              "127.0.0.1:19092"))
    parser.add_argument("--messages", type=int, default=messages)
    parser.add_argument("--partitions", type=int, default=partitions)
    if batch_size is not None:
        parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--rounds", type=int, default=rounds)
    for internal in ("--source", "--output"):  # set by the script for its child processes
        parser.add_argument(internal, help=argparse.SUPPRESS)
    return parser


def run_in_child(script: str, kind: str, args: argparse.Namespace, source: str,
                 output: str, *, before: str | None = None) -> dict[str, Any]:
    """Run ``script --child kind`` on ``source`` with a state folder of its own (removed
    after), on the kasper_py in the folder ``before`` when given (an A/B against other
    code); the JSON object its last stdout line prints."""
    state_dir = tempfile.mkdtemp(prefix="kasper-bench-")
    cmd = [sys.executable, script, "--child", kind, "--bootstrap", args.bootstrap,
           "--source", source, "--output", output, "--messages", str(args.messages),
           "--batch-size", str(args.batch_size), "--state-dir", state_dir]
    try:
        result = subprocess.run(cmd, check=False, capture_output=True, text=True,
                                env=child_env(before))
        if result.returncode:
            raise RuntimeError(f"{kind} loop failed:\n{result.stderr[-3000:]}")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def child_env(before: str | None) -> dict[str, str]:
    """A child's environment: this one, with the kasper_py in the folder ``before``
    first on its path when given."""
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = os.pathsep.join([before, env.get("PYTHONPATH", "")])
    return env


def child_answered(args: argparse.Namespace,
                   loop_child: Callable[[argparse.Namespace], dict[str, Any]]) -> bool:
    """In a child (``--child`` set): quiet logs, run ``loop_child`` and print its JSON
    result for ``run_in_child``; True then, False in the parent."""
    if not args.child:
        return False
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(json.dumps(loop_child(args)))
    return True
