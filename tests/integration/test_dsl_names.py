"""A DSL app run as users deploy a renamed copy: ``kasper run module:app --name
<other>`` against the real broker, for every shape with a repartition or a stage of
several inputs (tests/dsl_shapes.py). Each must give every output its input implies
and commit its sources and its internal topics, which are named after ``--name``."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_dsl_examples import app_module, internal_topics, kasper_run, run_env  # isort: skip  # noqa: F401 - a fixture

from kasper_py.dsl.packed import PACKED, unpack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

PARTITIONS = 2
USERS = [(f"u{i}", {"name": f"N{i}"}) for i in range(10)]
CLICKS = [(f"c{i}", {"user": f"u{i % 10}", "page": f"p{i % 7}"}) for i in range(300)]
ORDERS = [(f"o{i}", {"user": f"u{i % 10}", "amount": i}) for i in range(60)]
VIEWS = [(f"p{i % 7}", {"user": f"v{i}"}) for i in range(50)]


class Renamed:
    """One test's topics and a ``kasper run`` of ``tests.dsl_shapes.<shape>(...)`` as
    ``Config.name`` ``name`` (the Builder's is ``shapes``)."""

    def __init__(self, bootstrap: str, new_topic: Callable[..., str],
                 unique_name: Callable[[str], str], kafka: Any, folder: Path) -> None:
        self.kafka, self.folder = kafka, folder
        self.topic = lambda prefix: new_topic(prefix, partitions=PARTITIONS)
        self.out, self.name = unique_name("shapes-out"), unique_name("shapes-prod")
        self.env = run_env(bootstrap, folder / "state", key_serde="json",
                           value_serde="json", max_latency="none")

    def produce(self, topic: str, records: list[tuple[str, Any]]) -> None:
        self.kafka.produce(topic, [(json.dumps(k).encode(), json.dumps(v).encode())
                                   for k, v in records])

    def run(self, call: str) -> None:
        """``kasper run dsl_app:app --name <name> --until-caught-up``; exits 0."""
        app_dir = app_module(self.folder, "tests.dsl_shapes", call)
        kasper_run(app_dir, self.env, "--name", self.name, "--create-topics",
                   "--output-topics", self.out)

    def join_after_users(self, shape: str, prefix: str, records: list[tuple[str, Any]]
                         ) -> tuple[str, str]:
        """Run ``shape(<prefix topic>, <users topic>, out)`` twice: once over the users
        alone (the table loaded and kept), then over ``records``; returns both topics."""
        topic, users = self.topic(prefix), self.topic("users")
        call = f"{shape}({topic!r}, {users!r}, {self.out!r})"
        self.produce(users, USERS)
        self.run(call)
        self.produce(topic, records)
        self.run(call)
        return topic, users

    def sent(self) -> list[tuple[str, Any]]:
        """What reached the output topic, decoded (a delete's value ``None``)."""
        return [(json.loads(m.key()), m.value() and json.loads(m.value()))
                for m in self.kafka.read_all(self.out)]

    def committed(self, topic: str) -> int:
        """The next offsets ``--name``'s group committed on ``topic``, summed."""
        return sum(o or 0 for o in self.kafka.committed(self.name, topic, PARTITIONS).values())

    def internal(self, name: str) -> str:
        return f"{self.name}-{name}-repartition"

    def written(self, topic: str) -> int:
        """How many Kafka records ``topic`` holds."""
        return len(self.kafka.read_all(topic))

    def carried(self, topic: str) -> int:
        """How many records ``topic`` carries, each packed one's counted (the default
        with the json key serde: docs/streams-dsl.md)."""
        return sum(len(unpack(m.headers()[0][1])) if m.headers() and m.headers()[0][0] == PACKED
                   else 1 for m in self.kafka.read_all(topic))

    def crossed_whole(self, topic: str, records: int) -> None:
        """``topic`` carries ``records`` records and the group committed every Kafka
        record it holds."""
        assert self.carried(topic) == records
        assert self.committed(topic) == self.written(topic)


@pytest.fixture
def renamed(bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
            kafka: Any, tmp_path: Path) -> Renamed:
    return Renamed(bootstrap, new_topic, unique_name, kafka, tmp_path)


def test_one_input_counts_every_click(renamed: Renamed) -> None:
    """Clicks counted per user through ``<name>-per-user-by-key-repartition``
    (combined: at most one record per user and batch crosses it, and every one of
    them is committed)."""
    clicks = renamed.topic("clicks")
    renamed.produce(clicks, CLICKS)
    renamed.run(f"one_input({clicks!r}, {renamed.out!r})")
    sent = renamed.sent()
    assert len(sent) <= len(CLICKS)
    assert {user: max(n for u, n in sent if u == user) for user, _ in sent} == dict(
        Counter(v["user"] for _, v in CLICKS))
    assert renamed.committed(clicks) == len(CLICKS)
    repartition = renamed.internal("per-user-by-key")
    assert 0 < renamed.committed(repartition) == renamed.written(repartition) <= len(CLICKS)


def test_stream_table_join_joins_every_click(renamed: Renamed) -> None:
    """The issue's reproduction: clicks re-keyed by user and joined to the users table
    (loaded by a first run) give one joined output per click, none lost."""
    _, users = renamed.join_after_users("stream_table", "clicks", CLICKS)
    assert Counter(json.dumps(s, sort_keys=True) for s in renamed.sent()) == Counter(
        json.dumps((v["user"], {"page": v["page"], "name": "N" + v["user"][1:]}),
                   sort_keys=True) for _, v in CLICKS)
    renamed.crossed_whole(renamed.internal("join-0"), len(CLICKS))
    assert renamed.committed(users) == len(USERS)


def test_table_table_join_gives_every_users_count(renamed: Renamed) -> None:
    """A count per user (a repartition's table) joined with the users table: each user's
    last joined value holds their name and their whole count."""
    renamed.join_after_users("table_table", "clicks", CLICKS)
    last = dict(renamed.sent())
    counts = Counter(v["user"] for _, v in CLICKS)
    assert last == {user: {"name": "N" + user[1:], "clicks": n} for user, n in counts.items()}
    repartition = renamed.internal("per-user-by-key")
    assert 0 < renamed.committed(repartition) == renamed.written(repartition) <= len(CLICKS)


def test_table_outer_join_keeps_users_without_clicks(renamed: Renamed) -> None:
    """A count per user outer-joined with a users table that has three users no one
    clicked and misses one who clicked: each key's last value has what either side
    holds, ``None`` for the other."""
    clicks, users = renamed.topic("clicks"), renamed.topic("users")
    clicked = [(key, click) for key, click in CLICKS if click["user"] != "u9"]
    extra = [(f"x{i}", {"name": f"X{i}"}) for i in range(3)]
    renamed.produce(users, [u for u in USERS if u[0] != "u0"] + extra)
    renamed.produce(clicks, clicked)
    renamed.run(f"table_outer({clicks!r}, {users!r}, {renamed.out!r})")
    counts = Counter(v["user"] for _, v in clicked)
    names = {key: user["name"] for key, user in [*USERS[1:], *extra]}
    assert dict(renamed.sent()) == {key: {"name": names.get(key), "clicks": counts.get(key)}
                                    for key in counts.keys() | names.keys()}
    assert renamed.committed(users) == len(USERS) - 1 + len(extra)
    assert renamed.committed(clicks) == len(clicked)


def test_foreign_key_join_names_every_order(renamed: Renamed) -> None:
    """Orders joined with their user's name through ``<name>-orders-named-subscription``
    and ``-response``: every order's last value carries the name."""
    orders, _ = renamed.join_after_users("foreign_key", "orders", ORDERS)
    assert dict(renamed.sent()) == {
        key: {"amount": v["amount"], "name": "N" + v["user"][1:]} for key, v in ORDERS}
    renamed.crossed_whole(renamed.internal("orders-named-subscription"), len(ORDERS))
    renamed.crossed_whole(renamed.internal("orders-named-response"), len(ORDERS))
    assert renamed.committed(orders) == len(ORDERS)


def test_merge_of_a_repartition_and_a_topic_loses_nothing(renamed: Renamed) -> None:
    """Clicks through ``<name>-by-page-repartition`` merged with views: one output per
    click and per view."""
    clicks, views = renamed.topic("clicks"), renamed.topic("views")
    renamed.produce(clicks, CLICKS)
    renamed.produce(views, VIEWS)
    renamed.run(f"merge({clicks!r}, {views!r}, {renamed.out!r})")
    assert Counter(renamed.sent()) == Counter(
        [(v["page"], v["user"]) for _, v in CLICKS] + [(k, v["user"]) for k, v in VIEWS])
    renamed.crossed_whole(renamed.internal("by-page"), len(CLICKS))
    assert renamed.committed(views) == len(VIEWS)
