"""A turn's fixed cost under light input, without a broker's noise: a passthrough
TopicProcessor on the in-memory broker (kasper_py.testing) with the defaults, fed a few
records a turn dealt over the partitions; Python calls a turn (cProfile: all, and the
library's own with the builtins it calls), CPU microseconds a turn, and with
``--callgrind`` instructions a turn (valgrind, a short run subtracted). ``--before DIR``
runs each row alternately on the kasper_py in DIR too (a git archive of an older commit).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import structlog

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.testing import InMemoryBroker

VALUE = b"x" * 100


class Passthrough(MessageProcessor):
    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send("out", m.value, key=m.key)


class Feed(NoopObserver):
    """After each turn, the next turn's records (unkeyed: dealt round-robin over the
    partitions), until ``turns`` turns ran."""

    def __init__(self, broker: InMemoryBroker, turns: int, records: int) -> None:
        self.broker, self.left, self.records = broker, turns, records
        self.turns = self.consumed = 0
        self.feed()

    def feed(self) -> None:
        for _ in range(self.records):
            self.broker.produce("in", VALUE)

    def on_turn(self, stats: TurnStats) -> None:
        self.turns += 1
        self.consumed += len(stats.batch)
        if self.turns < self.left:
            self.feed()


def loop(args: argparse.Namespace) -> tuple[TopicProcessor, Feed]:
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=args.partitions)
    broker.create_topic("out", partitions=args.partitions)
    config = Config(name="bench-turn", bootstrap_servers="in-memory", input_topics=["in"])
    feed = Feed(broker, args.turns, args.records)
    return TopicProcessor(config, lambda _c: Passthrough(), clients=broker.clients(config),
                          observer=feed), feed


def library_calls(stats: pstats.Stats) -> tuple[int, Counter[str]]:
    """Calls of the library's functions (not the in-memory broker's) and structlog's,
    and of the builtins they call; by function."""
    def ours(path: str) -> bool:
        return (("kasper_py/" in path and "kasper_py/testing" not in path)
                or "structlog" in path)
    total, named = 0, Counter[str]()
    for (path, _, name), (_, calls, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if ours(path):
            total += calls
            named[f"{path.rsplit('kasper_py/', 1)[-1]}:{name}"] += calls
        elif path == "~":
            for (caller, _, _), counts in callers.items():
                if ours(caller):
                    total += counts[1]
                    named[f"builtin {name}"] += counts[1]
    return total, named


def child(args: argparse.Namespace) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    processor, feed = loop(args)
    if args.child == "calls":
        profile = cProfile.Profile()
        profile.runcall(processor.run_loop, until_caught_up=True)
        stats = pstats.Stats(profile)
        library, named = library_calls(stats)
        return {"turns": feed.turns, "records": feed.consumed,
                "calls": stats.total_calls / feed.turns,  # type: ignore[attr-defined]
                "library_calls": library / feed.turns,
                "top": [(name, round(n / feed.turns, 2))
                        for name, n in named.most_common(args.top)]}
    started = time.process_time()
    processor.run_loop(until_caught_up=True)
    seconds = time.process_time() - started
    processor.close()
    return {"turns": feed.turns, "records": feed.consumed, "cpu_us": seconds / feed.turns * 1e6}


def run_child(args: argparse.Namespace, kind: str, before: str | None, turns: int,
              prefix: list[str] | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = os.pathsep.join([before, env.get("PYTHONPATH", "")])
    cmd = [*(prefix or []), sys.executable, __file__, "--child", kind, "--turns", str(turns),
           "--records", str(args.records), "--partitions", str(args.partitions),
           "--top", str(args.top)]
    result = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def instructions(args: argparse.Namespace, before: str | None) -> float:
    """Instructions a turn: callgrind's total for ``--turns`` turns less for a tenth
    of them, over the difference in turns."""
    totals = []
    for turns in (args.turns, args.turns // 10):
        with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
            run_child(args, "cpu", before, turns,
                      ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}"])
            text = open(out.name).read()  # noqa: SIM115
        found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.MULTILINE)
        assert found is not None, "no total in callgrind's output"
        totals.append(int(found.group(1)))
    return (totals[0] - totals[1]) / (args.turns - args.turns // 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--records", type=int, default=5, help="records a turn")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", metavar="DIR",
                        help="alternate every row with the kasper_py in DIR")
    parser.add_argument("--callgrind", action="store_true",
                        help="also count instructions a turn (valgrind; slow)")
    parser.add_argument("--top", type=int, default=0,
                        help="print the library's N most called functions a turn")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; passthrough, "
          f"{args.records} records a turn over {args.partitions} partitions, "
          f"{args.turns} turns a run, in-memory broker, defaults", flush=True)
    trees = {"now": None, "before": args.before} if args.before else {"now": None}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        order = list(trees.items())[::-1 if round_ % 2 else 1]
        for name, tree in order:
            row = {**run_child(args, "calls", tree, args.turns),
                   **run_child(args, "cpu", tree, args.turns)}
            if args.callgrind:
                row["instructions"] = instructions(args, tree)
            rows[name].append(row)
            print(f"  round {round_ + 1} {name:6} {row['records'] / row['turns']:.1f} records "
                  f"a turn: {row['calls']:.0f} calls a turn ({row['library_calls']:.0f} the "
                  f"library's), {row['cpu_us']:.0f} us CPU"
                  + (f", {row['instructions']:,.0f} instructions" if args.callgrind else ""),
                  flush=True)
            for function, calls in row["top"] if round_ == 0 else ():
                print(f"      {calls:7.2f} {function}")
    if args.before:
        for key in ("calls", "library_calls", "cpu_us", *(["instructions"] * args.callgrind)):
            now = min(r[key] for r in rows["now"])
            was = min(r[key] for r in rows["before"])
            print(f"{key} a turn, best round: now {now:,.0f}, before {was:,.0f} "
                  f"({now / was:.2f}x)")
    print(f"load average after the run {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
