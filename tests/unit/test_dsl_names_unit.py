"""A DSL app run under a ``Config.name`` other than its Builder's (``kasper run --name``)
names its internal topics after the name it runs under, on the sending and the reading
side alike, so every shape gives the same outputs as under the Builder's own name; a
record of a topic that no stage reads fails the turn uncommitted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kasper_py import Config
from kasper_py.app import App
from kasper_py.exceptions import TopicError
from kasper_py.message import Message
from kasper_py.testing import ProcessorDriver, make_message
from tests import dsl_shapes

USERS = [make_message("users", {"name": f"N{i}"}, f"u{i}", timestamp=1) for i in range(4)]
CLICKS = [make_message("clicks", {"user": f"u{i % 4}", "page": f"p{i % 3}"}, f"c{i}",
                       timestamp=10 + i) for i in range(12)]
ORDERS = [make_message("orders", {"user": f"u{i % 4}", "amount": i}, f"o{i}",
                       timestamp=30 + i) for i in range(6)]
VIEWS = [make_message("views", {"user": f"v{i}"}, f"p{i % 3}", timestamp=50 + i)
         for i in range(5)]

MEMORY = "memory"
SHAPES: dict[str, tuple[Callable[[], App], list[list[Message]]]] = {
    "one input": (lambda: dsl_shapes.one_input("clicks", "out", MEMORY), [CLICKS]),
    "stream-table join": (lambda: dsl_shapes.stream_table("clicks", "users", "out", MEMORY),
                          [USERS, CLICKS]),
    "table-table join": (lambda: dsl_shapes.table_table("clicks", "users", "out", MEMORY),
                         [USERS, CLICKS]),
    "table outer join": (lambda: dsl_shapes.table_outer("clicks", "users", "out", MEMORY),
                         [USERS, CLICKS]),
    "foreign-key join": (lambda: dsl_shapes.foreign_key("orders", "users", "out", MEMORY),
                         [USERS, ORDERS]),
    "merge": (lambda: dsl_shapes.merge("clicks", "views", "out", MEMORY), [CLICKS, VIEWS]),
}


def run(app: App, name: str, batches: list[list[Message]]) -> tuple[ProcessorDriver,
                                                                      list[Any]]:
    """``app`` driven under ``Config.name`` ``name``: the driver and what reached
    ``out``, decoded, in order."""
    config = Config(name=name, bootstrap_servers="in-memory:0", input_topics=app.sources,
                    key_serde="json", value_serde="json")
    driver = ProcessorDriver(app, config=config)
    for batch in batches:
        driver.process(batch)
    return driver, [(json.loads(m.key), json.loads(m.value)) for m in driver.sent
                    if m.topic == "out"]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_gives_the_same_outputs_under_another_name(shape: str) -> None:
    """Each shape's outputs under ``shapes-prod`` equal those under the Builder's own
    name, and are not empty; the internal topics read and written are the renamed ones."""
    build, batches = SHAPES[shape]
    _, own = run(build(), dsl_shapes.BUILDER, batches)
    driver, renamed = run(build(), "shapes-prod", batches)
    assert own
    assert renamed == own
    internal = {m.topic for m in driver.sent if m.topic.endswith("-repartition")}
    assert internal
    assert all(topic.startswith("shapes-prod-") for topic in internal)
    assert all(driver.committed.get((topic, 0)) for topic in internal)


def test_the_stream_table_join_joins_each_click_with_its_user() -> None:
    """Under another name, each click is joined with its user's name, in order."""
    _, sent = run(dsl_shapes.stream_table("clicks", "users", "out", MEMORY), "clicks-prod",
                  [USERS, CLICKS])
    assert sent == [(f"u{i % 4}", {"page": f"p{i % 3}", "name": f"N{i % 4}"})
                    for i in range(12)]


def test_a_record_of_a_topic_no_stage_reads_fails_the_turn_uncommitted() -> None:
    """A message of a topic the app does not read is a ``TopicError`` naming it, and
    nothing of the turn is committed: never a silent drop."""
    app = dsl_shapes.stream_table("clicks", "users", "out", MEMORY)
    driver, _ = run(app, "shapes-prod", [USERS])
    before = dict(driver.committed)
    stray = make_message("shapes-join-0-repartition", {"page": "p1"}, "u1", timestamp=5)
    with pytest.raises(TopicError, match="'shapes-join-0-repartition', which no processor "
                                         "of the app reads"):
        driver.process([*CLICKS[:2], stray])
    assert driver.committed == before
    assert not [m for m in driver.sent if m.topic == "out"]
