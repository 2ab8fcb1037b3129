"""An application of three processors: raw page views, keyed by session, become
per-user counts per minute, each sent with the user's profile.

    page-views ──parse──▶ <name>-by-user-repartition ──count──▶ channel "closed"
    (JSON, by session)     (the app's own topic, by user)  (1-minute windows)
                                                                       │
    user-profiles (compacted, by user) ──────────────────────▶ enrich ──▶ views-per-minute

- `parse` reads raw events `{"user", "page", "ts"}` from `page-views` (keyed by session,
  so one user's views are spread over partitions), drops events without a user or a
  time, and re-keys the rest by user through the repartition `by-user`, stamped with
  their view time (`ts`, ms).
- `count` reads `by-user`: every view of a user is now on one partition, and counted in
  a 1-minute tumbling window with 5 minutes of grace (a `WindowedTable` in RocksDB). A
  minute's final count goes to the channel `closed` when the window closes.
- `enrich` reads the channel and `user-profiles`, a compacted topic keyed by user with
  the same partition count (co-partitioned with `by-user`: both are partitioned by
  murmur2 of the user), and keeps the profiles in the RocksDB table `profiles`. Each
  closed minute is sent to `views-per-minute` as {"user", "name", "plan", "start",
  "end", "views"} with the profile the table holds then (name and plan `null` for a
  user with none). In a turn `enrich` applies the profile updates of its partition
  before the minutes closed in that turn.

Input that is not JSON is skipped and counted by the library (`on_decode_error="skip"`).

Why so much grace: a repartition topic holds what the upstream partitions sent in the
order they were processed, not in event time. Each upstream partition's batch is sent
whole, so a downstream partition sees one upstream partition's views up to the end of
its batch, then another's from their start: the grace must cover how far one upstream
partition can run ahead of another (with a backlog, a batch's span of event time).

The sample (`--sample N`) writes profiles for three of four users, then N views spread
over four minutes, and a few broken events; it runs the app until caught up, then
writes one view per user ten minutes on (as time passing would), so that every sampled
minute closes, and runs the app again.

Delivery: at-least-once (a crash may send a minute's count again); with --exactly-once
the repartition records, window state, profiles and input offsets commit in one
transaction. The channel carries nothing across a commit: what it hands over is
processed in the turn that sent it.

    python examples/pageviews_app.py --sample 1000 --until-caught-up
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
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
from kasper_py.app import App
from kasper_py.kafka.admin import ensure_output_topics
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.windows import Tumbling, WindowedTable, count

VIEWS, PROFILES, OUTPUT = "page-views", "user-profiles", "views-per-minute"
USERS = ["ana", "bo", "gus", "jo"]
"""The sample's users: murmur2 puts two on each of two partitions."""
PROFILED = {"ana": {"name": "Ana", "plan": "pro"}, "bo": {"name": "Bo", "plan": "free"},
            "gus": {"name": "Gus", "plan": "free"}}
"""The sample's profiles: ``jo`` has none."""
MINUTE = 60_000
SPAN = 4 * MINUTE
"""The sample's views span four minutes: less than the grace, so however far one
upstream partition runs ahead of another, no sampled view is late."""
BROKEN = 3
"""Events the sample writes without a user, and as many that are not JSON."""


class Parse(MessageProcessor):
    """Raw events to page views keyed by user, through the repartition ``by-user``."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context
        self.dropped = 0
        """Events without a user or a time."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            event = m.value
            if (not isinstance(event, dict) or not isinstance(event.get("user"), str)
                    or type(event.get("ts")) is not int):
                self.dropped += 1
                continue
            sender.repartition("by-user", {"page": event.get("page")}, key=event["user"],
                               timestamp=event["ts"])


class Count(MessageProcessor):
    """Views per user and minute; each minute's final count to the channel ``closed``."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context
        self.views = WindowedTable(context, "views", Tumbling(60, grace=300), count(),
                                   emit="final")

    def process(self, messages: list[Message], sender: Sender) -> None:
        event_time = self.context.event_time  # the view time parse stamped
        for window in self.views.update((m.key, event_time(m), None) for m in messages):
            sender.channel("closed", {"start": window.start, "end": window.end,
                                      "views": window.value}, key=window.key)


class Enrich(MessageProcessor):
    """Keeps profiles in the table ``profiles``; sends each closed minute with one."""

    def __init__(self, context: ProcessorContext, profiles_topic: str, output: str) -> None:
        self.profiles = context.store("profiles")
        self.profiles_topic, self.output = profiles_topic, output
        self.sent: list[dict[str, Any]] = []
        """Every enriched count this processor sent."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        # a turn hands enrich its topic's messages first, then the channel's
        updates = {m.key: m.value for m in messages if m.topic == self.profiles_topic}
        self.profiles.put_many({k: v for k, v in updates.items() if v is not None})
        self.profiles.delete_many([k for k, v in updates.items() if v is None])
        closed = [m for m in messages if m.topic == "closed"]
        known = self.profiles.get_many({m.key for m in closed})
        for m in closed:
            profile = known.get(m.key) or {}
            count = {"user": m.key, "name": profile.get("name"), "plan": profile.get("plan"),
                     **m.value}
            sender.send(self.output, count, key=m.key)
            self.sent.append(count)


@dataclass
class Built:
    """The processors the app built in this process, one per partition each (for the
    report)."""

    parsers: list[Parse] = field(default_factory=list)
    enrichers: list[Enrich] = field(default_factory=list)


def build_app(name: str, prefix: str = "") -> tuple[App, Built]:
    """The app (named ``name``), reading ``<prefix>page-views`` and
    ``<prefix>user-profiles``; and where its parse and enrich processors are kept."""
    views_topic, profiles_topic, output = prefix + VIEWS, prefix + PROFILES, prefix + OUTPUT
    built = Built()

    def parse(context: ProcessorContext) -> Parse:
        built.parsers.append(Parse(context))
        return built.parsers[-1]

    def enrich(context: ProcessorContext) -> Enrich:
        built.enrichers.append(Enrich(context, profiles_topic, output))
        return built.enrichers[-1]

    app = App(name)
    by_user, closed = app.repartition("by-user"), app.channel("closed")
    app.processor("parse", parse, inputs=[views_topic], outputs=[by_user])
    # Windows encode their own entries: their table keeps bytes as they are.
    app.processor("count", Count, inputs=[by_user], outputs=[closed],
                  stores=[RocksDBTable("views", key_serde="bytes", value_serde="bytes")])
    app.processor("enrich", enrich, inputs=[profiles_topic, closed], outputs=[output],
                  stores=[RocksDBTable("profiles")])
    return app, built


def sample_start() -> int:
    """Where the sample's views start (ms, a whole minute): 15 minutes ago, recent enough
    for the broker's retention, and its closing views are not in the future."""
    start = int(time.time() * 1000) - 15 * MINUTE
    return start - start % MINUTE


def sample_views(count: int, start: int) -> list[tuple[str, dict[str, Any]]]:
    """(session, event) of ``count`` views spread evenly over the ``SPAN`` ms from
    ``start``, each user on three sessions."""
    rng = random.Random(27)
    views = []
    for n in range(count):
        user = rng.choice(USERS)
        views.append((f"{user}-s{rng.randrange(3)}", {
            "user": user, "page": f"/page/{rng.randrange(20)}", "ts": start + n * SPAN // count}))
    return views


def closing_views(start: int) -> list[tuple[str, dict[str, Any]]]:
    """One view per user ten minutes after ``start``: past every sampled minute's end and
    grace, so each closes."""
    return [(f"{user}-s0", {"user": user, "page": "/closing", "ts": start + 10 * MINUTE})
            for user in USERS]


def expected_counts(views: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """What the app sends for the sampled ``views``, sorted by user and minute: each
    user's views per minute, with the user's sample profile."""
    minutes = Counter((e["user"], e["ts"] - e["ts"] % MINUTE) for _, e in views)
    return [{"user": user, "name": PROFILED.get(user, {}).get("name"),
             "plan": PROFILED.get(user, {}).get("plan"), "start": at, "end": at + MINUTE,
             "views": n} for (user, at), n in sorted(minutes.items())]


class Sample:
    """Writes the sample: topics, profiles, views and broken events; later the closing
    views."""

    def __init__(self, bootstrap: str, prefix: str, partitions: int) -> None:
        self.prefix, self.start = prefix, sample_start()
        create_topics(bootstrap, [prefix + VIEWS, prefix + OUTPUT], partitions)
        create_topics(bootstrap, [prefix + PROFILES], partitions, {"cleanup.policy": "compact"})
        # murmur2, as the app's repartition: a user's profile and counts share a partition
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "partitioner": "murmur2_random", "enable.idempotence": True})

    def write(self, count: int) -> None:
        """The profiles, then ``count`` views and the broken events."""
        print("sample start:", self.start)
        for user, profile in PROFILED.items():
            self.producer.produce(self.prefix + PROFILES, json.dumps(profile), key=user)
        self.producer.flush(30)
        self._views(sample_views(count, self.start))
        for n in range(BROKEN):
            self.producer.produce(self.prefix + VIEWS,
                                  json.dumps({"page": "/anonymous", "ts": self.start + n}))
            self.producer.produce(self.prefix + VIEWS, b"{not json", key=f"broken-{n}")
        self.producer.flush(60)

    def close_minutes(self) -> None:
        """The closing views."""
        self._views(closing_views(self.start))
        self.producer.flush(60)

    def _views(self, views: list[tuple[str, dict[str, Any]]]) -> None:
        for session, event in views:
            self.producer.produce(self.prefix + VIEWS, json.dumps(event), key=session)
            self.producer.poll(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="pageviews-app")
    parser.add_argument("--prefix", default="", help="prefix of the three topic names")
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="produce this many sample views")
    parser.add_argument("--until-caught-up", action="store_true")
    parser.add_argument("--exactly-once", action="store_true")
    args = parser.parse_args(argv)
    app, built = build_app(args.name, args.prefix)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap,
                    input_topics=list(app.sources), batch_size=500, state_dir=args.state_dir,
                    key_serde="str", value_serde="json", on_decode_error="skip",
                    processing_guarantee="exactly_once" if args.exactly_once
                    else "at_least_once", output_topics=[OutputTopic(args.prefix + OUTPUT)])
    if args.sample:
        sample = Sample(args.bootstrap, args.prefix, args.partitions)
        sample.write(args.sample)
        if run(config, app, until_caught_up=True) is not None:
            return 0  # stopped by a signal
        sample.close_minutes()  # once the rest is counted (see the module's docstring)
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    if run(config, app, until_caught_up=args.until_caught_up) is None:
        report(built)
    return 0


def run(config: Config, app: App, *, until_caught_up: bool) -> str | None:
    """Run ``app``; SIGTERM or Ctrl-C commits the batch in hand, then closes. Returns the
    signal's name, or ``None`` when it caught up."""
    with TopicProcessor(config, app) as processor:
        return processor.run_until_stopped(until_caught_up=until_caught_up)


def report(built: Built) -> None:
    """Print the enriched counts sent in this run and the events parse dropped."""
    print("views per minute (user, minute start, views, plan):")
    for sent in sorted((s for e in built.enrichers for s in e.sent),
                       key=lambda s: (s["user"], s["start"])):
        print(f"  {sent['user']:4} {sent['start']} {sent['views']:3} {sent['plan']}")
    print("events without a user dropped:", sum(p.dropped for p in built.parsers))


if __name__ == "__main__":
    sys.exit(main())
