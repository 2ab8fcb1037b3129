"""Kafka Streams' PageViewUntypedDemo in the streams DSL: page views joined with the
user profiles table by user, re-keyed by region, counted per region in hopping windows.

The Java original (org.apache.kafka.streams.examples.pageview.PageViewUntypedDemo):

    KTable<String, String> userRegions = users.mapValues(r -> r.get("region").textValue());
    views.leftJoin(userRegions, (view, region) -> {user, page, region or "UNKNOWN"})
         .map((user, viewRegion) -> new KeyValue<>(viewRegion.get("region"), viewRegion))
         .groupByKey()
         .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofDays(7), Duration.ofSeconds(1))
                                .advanceBy(Duration.ofSeconds(1)))
         .count()
         .toStream()
         .map((key, value) -> new KeyValue<>({windowStart, region}, {count, region}))
         .to("streams-pageviewstats-untyped-output");

Kafka Streams' windows (7 days, a new one every second) put each view in 604,800
windows; the default here is 10-second windows advancing every 5 seconds (each view
counts in two), ``--size`` and ``--advance`` to choose. Views are keyed by user (str)
with JSON values ``{"user", "page"}``; profiles are keyed by user with ``{"region"}``.
Each view updates the count of every window it falls in (one output per window and
view, keyed by the JSON text ``{"windowStart", "region"}``, valued ``{"count",
"region"}``), stamped with the window's last millisecond.

A view is joined with the profile its user had when it was read: a profile written
later, or still unread in another partition's fetch, is not seen (see
docs/streams-dsl.md, "Where we differ").

Delivery: at-least-once, or exactly-once with `--exactly-once`.

    KASPER_KEY_SERDE=str KASPER_VALUE_SERDE=json kasper run streams_page_views:app \\
        --app-dir examples --bootstrap-servers 127.0.0.1:19092
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kasper_py import Config, OutputTopic, TopicProcessor
from kasper_py.app import App
from kasper_py.dsl import Builder, Windowed
from kasper_py.kafka.admin import ensure_output_topics
from kasper_py.windows import Hopping

VIEWS, PROFILES = "streams-pageview-input", "streams-userprofile-input"
OUTPUT = "streams-pageviewstats-untyped-output"


def view_by_region(view: dict[str, Any], region: str | None) -> dict[str, Any]:
    """The view with its user's region, ``"UNKNOWN"`` without a profile."""
    return {"user": view["user"], "page": view["page"], "region": region or "UNKNOWN"}


def region_count(window: Windowed, count: int) -> tuple[str, dict[str, Any]]:
    """A windowed count as Kafka Streams' demo sends it."""
    key = json.dumps({"windowStart": window.start, "region": window.key},
                     separators=(",", ":"))
    return key, {"count": count, "region": window.key}


def page_views(views: str = VIEWS, profiles: str = PROFILES, output: str = OUTPUT, *,
               name: str = "streams-pageview", size: float = 10, advance: float = 5,
               grace: float = 60) -> App:
    """The demo as an ``App`` (str keys, JSON values): the join in the first stage, the
    windowed count after the repartition ``views-by-region``."""
    builder = Builder(name)
    user_regions = builder.table(profiles, store="user-profiles").map_values(
        lambda profile: profile.get("region"))
    (builder.stream(views)
        .left_join(user_regions, view_by_region)
        .map(lambda _user, view: (view["region"], view))
        .group_by_key(name="views-by-region")
        .windowed_by(Hopping(size, advance=advance, grace=grace))
        .count("views-per-region")
        .to_stream()
        .map(region_count)
        .to(output))
    return builder.build()


app = page_views()
"""The app on Kafka Streams' topic names, for ``kasper run streams_page_views:app``."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="streams-pageview")
    parser.add_argument("--views", default=VIEWS)
    parser.add_argument("--profiles", default=PROFILES)
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--size", type=float, default=10, help="window size, seconds")
    parser.add_argument("--advance", type=float, default=5, help="window advance, seconds")
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--exactly-once", action="store_true")
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap,
                    input_topics=[args.views, args.profiles], key_serde="str",
                    value_serde="json", state_dir=args.state_dir, batch_wait=0.2,
                    processing_guarantee="exactly_once" if args.exactly_once
                    else "at_least_once", output_topics=[OutputTopic(args.output)])
    target = page_views(args.views, args.profiles, args.output, name=args.name,
                        size=args.size, advance=args.advance)
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    with TopicProcessor(config, target) as loop:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the loop closes
        loop.run_until_stopped(until_caught_up=args.until_caught_up)
    return 0


if __name__ == "__main__":
    sys.exit(main())
