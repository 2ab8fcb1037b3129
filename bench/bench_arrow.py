"""Sum and count per key over JSON events, vectorised (``ArrowMessageProcessor``:
``to_arrow`` + Arrow's group-by) against the same aggregation per message, in the same
run, on the processing step alone (no broker: batches of ``Message`` in memory).

Two pairs, since where the JSON is parsed decides the result:

- ``json-bytes``: values left undecoded (``value_serde="bytes"``); the per-message
  processor parses each value with ``json.loads``, the vectorised one hands the batch's
  bytes to Arrow's JSON reader;
- ``decoded``: values decoded by the ``json`` serde before ``process()`` (not timed);
  the per-message processor adds up dicts, the vectorised one builds the table from
  them.

Events are ``{"user": "u<n % keys>", "amount": <int>}``. The target (vectorised >= 5x
on the processing step) is printed, never asserted.

    python bench/bench_arrow.py --messages 100000 --batch-size 10000
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from kasper_py import Message
from kasper_py.arrow import to_arrow

TARGET = 5.0


def per_message(batch: list[Message], parse: bool) -> dict[str, list[int]]:
    """Sum and count of ``amount`` per ``user``, one message at a time."""
    totals: dict[str, list[int]] = {}
    for message in batch:
        event = json.loads(message.value) if parse else message.value
        total = totals.get(event["user"])
        if total is None:
            totals[event["user"]] = [event["amount"], 1]
        else:
            total[0] += event["amount"]
            total[1] += 1
    return totals


def vectorised(batch: list[Message], parse: bool) -> dict[str, list[int]]:
    """The same, as one Arrow group-by over the batch's table."""
    table = to_arrow(batch).group_by("user").aggregate([("amount", "sum"), ("amount", "count")])
    return {user: [total, count] for user, total, count in zip(
        *(table.column(name).to_pylist() for name in ("user", "amount_sum", "amount_count")),
        strict=True)}


def seconds(step: Callable[[list[Message], bool], Any], batches: list[list[Message]],
            parse: bool, rounds: int) -> float:
    """Each batch's best time over ``rounds`` passes of ``step``, summed (a shared
    machine's pauses land on single batches, not on a whole pass)."""
    total = 0.0
    for batch in batches:
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            step(batch, parse)
            best = min(best, time.perf_counter() - started)
        total += best
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    raw = [json.dumps({"user": f"u{n % args.keys}", "amount": n % 97}).encode()
           for n in range(args.messages)]
    for kind, values in (("json-bytes", raw), ("decoded", [json.loads(v) for v in raw])):
        messages = [Message("events", 0, n, None, value, 1000 + n)
                    for n, value in enumerate(values)]
        batches = [messages[start:start + args.batch_size]
                   for start in range(0, len(messages), args.batch_size)]
        parse = kind == "json-bytes"
        assert per_message(batches[0], parse) == vectorised(batches[0], parse)
        slow = seconds(per_message, batches, parse, args.rounds)
        fast = seconds(vectorised, batches, parse, args.rounds)
        print(f"{kind}: per message {args.messages / slow:,.0f} msg/s, vectorised "
              f"{args.messages / fast:,.0f} msg/s: {slow / fast:.1f}x "
              f"(target >= {TARGET:.0f}x: {'met' if slow / fast >= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
