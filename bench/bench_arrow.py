"""Sum and count per key over JSON events, vectorised (an ``ArrowMessageProcessor``:
``to_arrow`` + Arrow's group-by, totals out through ``send_table``) against the same
processor written per message, in the same run, from the batch as the loop hands it:
confluent-kafka records (``confluent_kafka.Message``, as the consumer returns them)
through the loop's own ``build_batch`` with the processor's value serde, then
``process(messages, sender)`` with a real ``Sender`` whose output topic is declared with
``value_serde = "json"`` (totals go out as JSON whatever the input's serde). No broker.

Each processor is run the way its user would configure it:

- per message, ``value_serde="json"``: the loop decodes each value into a dict (the
  json serde), ``process()`` adds them up;
- per message, ``value_serde="bytes"``: ``process()`` parses each value itself
  (``json.loads``);
- vectorised, ``value_serde="bytes"``: the batch's bytes go to Arrow's JSON reader in
  one call (``to_arrow``), the group-by runs in Arrow; its table is the values' columns
  alone (``message_columns = ()``: it reads no offset, key or timestamp);
- the same vectorised processor with every message column in its table (the default),
  to show what they cost.

Rows:

- ``process``: ``process()`` alone, on the batch as built (``json`` serde: parsing was
  the loop's, not timed here);
- ``decode+process``: ``build_batch`` from the records and ``process()``: what one turn
  costs before produce and commit, whatever the serde.

CPU time of this process (``time.process_time``: the machine is shared, and Arrow's
reader runs on this thread), rounds of the four alternated, each round's ratio printed,
the median of each vectorised side against each per-message side summarised. The target
(vectorised >= 5x) is printed, never asserted.

    python bench/bench_arrow.py --messages 100000 --batch-size 10000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from kasper_py import Message, MessageProcessor, Sender
from kasper_py.arrow import META_COLUMNS, ArrowMessageProcessor, send_table
from kasper_py.kafka.batching import build_batch
from kasper_py.serdes import serde_for

TARGET = 5.0
OUTPUT = "totals"
KEYS = serde_for("str")


class PerMessage(MessageProcessor):
    """Sum and count of ``amount`` per ``user``, one message at a time."""

    def __init__(self, parse: bool) -> None:
        self.parse = parse

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals: dict[str, list[int]] = {}
        for message in messages:
            event = json.loads(message.value) if self.parse else message.value
            total = totals.get(event["user"])
            if total is None:
                totals[event["user"]] = [event["amount"], 1]
            else:
                total[0] += event["amount"]
                total[1] += 1
        sender.send_many(OUTPUT, [(user, {"sum": total, "count": count}, None, None)
                                  for user, (total, count) in totals.items()])


class Vectorised(ArrowMessageProcessor):
    """The same, as one Arrow group-by over the batch's table of the values' columns."""

    message_columns = ()

    def process_table(self, table: Any, sender: Sender) -> None:
        totals = table.group_by("user", use_threads=False).aggregate(
            [("amount", "sum"), ("amount", "count")])
        names = {"amount_sum": "sum", "amount_count": "count"}
        send_table(sender, OUTPUT, totals.rename_columns(names), key="user")


class VectorisedWithMessageColumns(Vectorised):
    """The same, its table with every message column (``to_arrow``'s default)."""

    message_columns = META_COLUMNS


SIDES: dict[str, tuple[Callable[[], MessageProcessor], str]] = {
    "per message (json serde)": (lambda: PerMessage(parse=False), "json"),
    "per message (bytes, json.loads)": (lambda: PerMessage(parse=True), "bytes"),
    "vectorised (bytes, Arrow)": (Vectorised, "bytes"),
    "vectorised, message columns too": (VectorisedWithMessageColumns, "bytes"),
}
VECTORISED = ("vectorised (bytes, Arrow)", "vectorised, message columns too")


def records(count: int, keys: int) -> list[Any]:
    """``count`` events as the consumer returns them, one partition's."""
    return [confluent_kafka.Message(
        topic="events", partition=0, offset=n, key=None, timestamp=(1, 1000 + n),
        value=json.dumps({"user": f"u{n % keys}", "amount": n % 97}).encode())
        for n in range(count)]


def output_sender(serde: Any) -> Sender:
    """The ``Sender`` the turn gives a processor of value serde ``serde`` whose output
    topic is declared with ``value_serde = "json"`` (``OutputTopic.value_serde``)."""
    return Sender(KEYS, serde, value_serdes={OUTPUT: serde_for("json")})


def one_pass(side: str, batches: list[list[Any]], decode: bool) -> float:
    """CPU seconds to run every batch through ``side`` (``build_batch`` timed too when
    ``decode``)."""
    make, serde_name = SIDES[side]
    processor, serde = make(), serde_for(serde_name)
    seconds = 0.0
    for records_of_batch in batches:
        built = None if decode else build_batch(records_of_batch, serde, serde)
        sender = output_sender(serde)
        started = time.process_time()
        if built is None:
            built = build_batch(records_of_batch, serde, serde)
        processor.process(built.by_partition[0], sender)
        seconds += time.process_time() - started
    return seconds


def totals_of(side: str, batch: list[Any]) -> dict[Any, Any]:
    """What ``side`` sends for ``batch``: value per key (the sides must agree)."""
    make, serde_name = SIDES[side]
    serde = serde_for(serde_name)
    sender = output_sender(serde)
    make().process(build_batch(batch, serde, serde).by_partition[0], sender)
    return {record.key: record.value for record in sender.messages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    events = records(args.messages, args.keys)
    batches = [events[start:start + args.batch_size]
               for start in range(0, len(events), args.batch_size)]
    expected = totals_of(VECTORISED[0], batches[0])
    for side in SIDES:
        assert totals_of(side, batches[0]) == expected, side
    for row, decode in (("process", False), ("decode+process", True)):
        pairs = [(fast, slow) for fast in VECTORISED for slow in SIDES if slow not in VECTORISED]
        ratios: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
        for round_number in range(1, args.rounds + 1):
            seconds = {side: one_pass(side, batches, decode) for side in SIDES}
            for (fast, slow), values in ratios.items():
                values.append(seconds[slow] / seconds[fast])
            print(f"{row} round {round_number}: " + ", ".join(
                f"{side} {args.messages / spent:,.0f} msg/s" for side, spent in seconds.items()))
        for (fast, slow), values in ratios.items():
            median = statistics.median(values)
            print(f"{row}: {fast} / {slow}: median {median:.1f}x over {args.rounds} rounds "
                  f"({', '.join(f'{r:.1f}' for r in values)}; target >= {TARGET:.0f}x: "
                  f"{'met' if median >= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
