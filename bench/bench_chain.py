"""The streams DSL's stateless chain against a hand-written passthrough, in one process
with no broker: the CPU a record of ``process()`` and the Sender's buffer, what the
loop thread spends besides the consumer and ``produce()`` (``bench_dsl.py`` runs the
same rows on the broker, where a row's wall time moves by up to 2x on a shared machine).

Rows, on --messages messages of 10,000 keys (``bytes``, value ``b"1"``), in batches of
--batch-size, each batch's output buffered and drained:

``passthrough``  ``benchkit.Passthrough``: ``send`` of each message
``chain_hand``   ``bench_dsl.ChainHand``: ``keep`` and ``bytes`` called per message, then
                 ``send``
``dsl_chain``    ``stream(t).filter(keep).map_values(bytes).to(out)`` (its stage's
                 processor, inside the app's)
``dsl_branch``   ``stream(t).branch(keep, rest)``, each branch ``to`` a topic
``dsl_to``       ``stream(t).to(out)``: the DSL's own cost, no function of the user's

Each round runs every row in a child process, the collector paced as the loop paces it
(``kasper_py._support.gc.paced_for``), rows in an order turned by one each round, and
with ``--before DIR`` the same rows on the kasper_py in DIR right after (an
A/B in one run). Prints each round's CPU (``time.process_time``, the least of
--repeats passes) and the ratios of the least of each row's rounds; the target
(``dsl_chain`` within 0.95x of ``passthrough``) is printed, never asserted.

    git archive main kasper_py | tar -x -C /tmp/before
    python bench/bench_chain.py --rounds 5 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROWS = ("passthrough", "chain_hand", "dsl_chain", "dsl_branch", "dsl_to")


def processor(row: str) -> Any:
    """The row's processor (the DSL's through a ``ProcessorDriver``, which builds it)."""
    from bench_dsl import ChainHand, keep
    from benchkit import Passthrough

    from kasper_py.dsl import Builder
    from kasper_py.testing import ProcessorDriver, make_message

    if row == "passthrough":
        return Passthrough("out")
    if row == "chain_hand":
        return ChainHand("out")
    builder = Builder("chain")
    stream = builder.stream("in")
    if row == "dsl_chain":
        stream.filter(keep).map_values(bytes).to("out")
    elif row == "dsl_to":
        stream.to("out")
    else:
        kept, rest = stream.branch(keep, lambda _k, _v: True)
        kept.to("out")
        rest.to("rest")
    driver = ProcessorDriver(builder.build())
    driver.process([make_message("in", b"1", b"k", timestamp=1)])
    return driver.processor(0)


def child(rows: list[str], args: argparse.Namespace) -> dict[str, float]:
    """Each row's least CPU a record, in µs, over ``args.repeats`` passes."""
    from kasper_py import Message, Sender
    from kasper_py._support.gc import paced_for

    messages = [Message("in", 0, i, b"w%d" % (i % 10_000), b"1", 1_700_000_000_000 + i,
                        (), 1) for i in range(args.messages)]
    batches = [messages[i:i + args.batch_size]
               for i in range(0, len(messages), args.batch_size)]
    found = {}
    for row in rows:
        target, least = processor(row), float("inf")
        with paced_for(args.batch_size):  # the collector's pace in the loop
            for _ in range(args.repeats):
                started = time.process_time()
                for batch in batches:
                    sender = Sender()
                    sender.timestamp = batch[-1].timestamp
                    target.process(batch, sender)
                    sender.drain()
                least = min(least, time.process_time() - started)
        found[row] = least / len(messages) * 1e6
    return found


def run_child(tree: str, rows: list[str], args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(HERE)])}
    command = [sys.executable, __file__, "--child", ",".join(rows), "--messages",
               str(args.messages), "--batch-size", str(args.batch_size), "--repeats",
               str(args.repeats)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    answer: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return answer


def report(results: dict[str, list[float]]) -> None:
    print(f"\nleast of each row's rounds, µs CPU a record (load {os.getloadavg()[0]:.2f}):")
    for row, rounds in results.items():
        print(f"  {row:22s} {min(rounds):6.3f}   rounds {' '.join(f'{r:.3f}' for r in rounds)}")
    for suffix in ("", "@before"):
        base, chain = results.get("passthrough" + suffix), results.get("dsl_chain" + suffix)
        hand = results.get("chain_hand" + suffix)
        if base and chain:
            rounds = " ".join(f"{c / b:.2f}" for c, b in zip(chain, base, strict=True))
            print(f"  dsl_chain{suffix} / passthrough{suffix}: CPU {min(chain) / min(base):.2f}x "
                  f"(by round {rounds})")
        if hand and chain:
            print(f"  dsl_chain{suffix} / chain_hand{suffix}: CPU {min(chain) / min(hand):.2f}x")
        bare = results.get("dsl_to" + suffix)
        if base and bare:
            print(f"  dsl_to{suffix} / passthrough{suffix}: CPU {min(bare) / min(base):.2f}x "
                  "(the DSL's own cost: no function of the user's)")
    for row in ROWS:
        if row in results and row + "@before" in results:
            now, before = min(results[row]), min(results[row + "@before"])
            print(f"  {row} now / before: {now:.3f} / {before:.3f} µs ({now / before:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--before", help="a folder holding another kasper_py, run too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child.split(","), args)))
        return
    rows, results = args.rows.split(","), {}
    trees = [("", str(HERE.parent))] + ([("@before", args.before)] if args.before else [])
    for round_ in range(args.rounds):
        turned = rows[round_ % len(rows):] + rows[:round_ % len(rows)]
        for suffix, tree in trees:
            for row, cpu in run_child(tree, turned, args).items():
                results.setdefault(row + suffix, []).append(cpu)
                print(f"  round {round_ + 1} {row + suffix:22s} {cpu:6.3f} µs CPU a record",
                      flush=True)
    report(results)


if __name__ == "__main__":
    main()
