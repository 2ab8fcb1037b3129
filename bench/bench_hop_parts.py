"""The repartition hop's Python parts, apart, with no broker: CPU µs a record of each
step a re-keyed record takes on the loop thread, for comparing code without the noise
of a whole run (bench_app.py measures the whole hop through Kafka).

Records are repartition-shaped: a str key (``w0``..``w999``), the JSON value 1, a
timestamp, no headers, 10,000 to a batch over two partitions in runs of 500. Parts:

``send``     ``Sender.send_many`` of a batch's ``(key, value, timestamp, headers)``
             records (str key serde, json value serde), then ``drain``.
``produce``  ``OutputProducer.produce`` of the drained batch into a real client whose
             broker is unreachable (enqueued, never sent), then a purge.
``read``     ``build_batch`` of 10,000 consumed records (confluent-kafka ``Message``s
             built in the bench) into decoded messages.

and the same hop with the streams DSL's packed records (docs/streams-dsl.md):

``pack``     ``Sender.repartition_packed`` of the batch's records through a ``Packer``
             (two partitions: one packed record each), then ``drain``.
``produce_packed``  ``produce`` of those packed records, then a purge.
``unpack``   ``build_batch`` of the packed records as consumed, and the reading stage's
             ``Expander.records`` of them: the records, decoded.

and, with mostly-unique keys (each batch's 10,000 keys new to the run: 10,000 x
(reps + 1) distinct keys, ``--reps 99`` for a million), the parts keys change:

``send_unique``  ``send`` of such batches (the producer hashes keys in C).
``pack_unique``  ``pack`` of such batches: every key new to the ``Packer``'s partition
             cache, hashed by ``murmur2_partitions`` (vectorised).

The summary adds each way's parts and prints packed / plain, with common keys and with
unique ones (``produce``, ``read``, ``produce_packed`` and ``unpack`` do not look at
whether a key was seen before).

Each part runs in its own process (``time.process_time`` over --reps batches after one
warm-up, so the figure is CPU, not wall time); ``--before DIR`` runs each part on the
kasper_py in DIR right after this checkout's, alternating, every round, and prints
both and their ratio per round. A benchmark, not a test: nothing is asserted.

    python bench/bench_hop_parts.py --rounds 3
    git archive HEAD~1 kasper_py | tar -x -C /tmp/before
    python bench/bench_hop_parts.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchkit import child_env

PARTS = ("send", "produce", "read", "pack", "produce_packed", "unpack", "send_unique",
         "pack_unique")
PLAIN, PACKED = PARTS[:3], PARTS[3:6]
UNIQUE_PLAIN, UNIQUE_PACKED = ("send_unique", *PLAIN[1:]), ("pack_unique", *PACKED[1:])
BATCH = 10_000


class Routes:
    """The one repartition ``by-word``, of two partitions."""

    def repartition_topic(self, name: str) -> str:
        return name

    def repartition_partitions(self, name: str) -> int:
        return 2

    def to_channel(self, *args: object) -> None:
        raise NotImplementedError


def batch_step(part: str, reps: int) -> Callable[[], object]:
    """One batch of ``part``, ready to be called again and again (``reps`` + 1 times:
    a unique part has that many batches of keys)."""
    from confluent_kafka import Message as Consumed

    from kasper_py import JSON, STRING, Config, Sender
    from kasper_py.dsl._packing import Expander, Packer
    from kasper_py.kafka.batching import build_batch
    from kasper_py.kafka.producer import OutputProducer

    rng = random.Random(34)
    words = [f"w{rng.randrange(1000)}" for _ in range(BATCH)]
    sender, packer = Sender(STRING, JSON, Routes()), Packer()
    records = [(word, 1, 1_700_000_000_000 + n, ()) for n, word in enumerate(words)]
    if part in ("send_unique", "pack_unique"):
        return unique_step(part, reps, sender, packer)
    if part == "send":
        return lambda: (sender.send_many("by-word", records), sender.drain())
    if part == "pack":
        return lambda: (sender.repartition_packed("by-word", records, packer.pack),
                        sender.drain())
    if part in ("produce", "produce_packed"):
        producer = OutputProducer(Config(name="hop-parts", bootstrap_servers="127.0.0.1:1",
                                         input_topics=["in"]))
        if part == "produce":
            sender.send_many("by-word", records)
        else:
            sender.repartition_packed("by-word", records, packer.pack)
        drained = sender.drain()
        return lambda: (producer.produce(drained), producer.close(discard=True))
    if part == "unpack":
        sender.repartition_packed("by-word", records, packer.pack)
        packed = [Consumed(topic="by-word", partition=r[3], offset=0, key=r[2], value=r[1],
                           headers=r[7], timestamp=(1, r[6])) for r in sender.drain()]
        expander = Expander(frozenset({"by-word"}), STRING, JSON)

        def unpack() -> object:
            batch = build_batch(packed, STRING, JSON)
            return [expander.records(m) for m in batch.by_partition.values()]

        return unpack
    offsets = [0, 0]
    consumed = []
    for n, word in enumerate(words):
        partition = n // 500 % 2
        consumed.append(Consumed(topic="by-word", partition=partition,
                                 offset=offsets[partition], key=word.encode(), value=b"1",
                                 timestamp=(1, 1_700_000_000_000 + n)))
        offsets[partition] += 1
    return lambda: build_batch(consumed, STRING, JSON)


def unique_step(part: str, reps: int, sender: Any, packer: Any) -> Callable[[], object]:
    """``send`` or ``pack`` of a batch of keys none of the batches before had."""
    batches = iter([[(f"user-{n:08d}", 1, 1_700_000_000_000 + n, ())
                     for n in range(start, start + BATCH)]
                    for start in range(0, BATCH * (reps + 1), BATCH)])
    if part == "send_unique":
        return lambda: (sender.send_many("by-word", next(batches)), sender.drain())
    return lambda: (sender.repartition_packed("by-word", next(batches), packer.pack),
                    sender.drain())


def child(part: str, reps: int) -> None:
    """Print the CPU µs a record of ``part``, as one JSON line."""
    step = batch_step(part, reps)
    step()
    started = time.process_time()
    for _ in range(reps):
        step()
    print(json.dumps({"us": (time.process_time() - started) / reps / BATCH * 1e6}))


def run(part: str, reps: int, before: str | None) -> float:
    result = subprocess.run([sys.executable, __file__, "--child", part, "--reps", str(reps)],
                            check=True, capture_output=True, text=True, env=child_env(before))
    return float(json.loads(result.stdout.strip().splitlines()[-1])["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=30, help="batches per part and run")
    parser.add_argument("--before", help="a folder holding another kasper_py to A/B against")
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS,
                        help="the parts to measure (all by default)")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.reps)
        return
    medians: dict[str, float] = {}
    for part in args.parts:
        now, before = [], []
        for round_ in range(args.rounds):
            now.append(run(part, args.reps, None))
            line = f"{part:8} round {round_ + 1}: {now[-1]:.3f} µs a record"
            if args.before:
                before.append(run(part, args.reps, args.before))
                line += f", before {before[-1]:.3f} (now / before {now[-1] / before[-1]:.2f})"
            print(line, flush=True)
        summary = f"{part:8} median {statistics.median(now):.3f}"
        if before:
            summary += (f", before {statistics.median(before):.3f} (now / before "
                        f"{statistics.median(now) / statistics.median(before):.2f})")
        print(summary, flush=True)
        medians[part] = statistics.median(now)
    for keys, plain_parts, packed_parts in (("common keys", PLAIN, PACKED),
                                            ("unique keys", UNIQUE_PLAIN, UNIQUE_PACKED)):
        if not set(plain_parts + packed_parts) <= medians.keys():
            continue
        plain, packed = (sum(medians[p] for p in parts) for parts in (plain_parts,
                                                                     packed_parts))
        print(f"the hop's parts, {keys}: plain {plain:.3f}, packed {packed:.3f} µs a "
              f"record: packed / plain {packed / plain:.2f} (the consumer's own cost a "
              f"record is not in either)")


if __name__ == "__main__":
    main()
