"""The turn's steps, named and numbered once (``kasper_py.steps.STEPS``): the engine calls
its boundaries in order and times its steps under the metrics' labels, and the docs'
table and list of the turn say the same numbers and names."""

from __future__ import annotations

import re
from pathlib import Path

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.kafka.batching import decode_batch
from kasper_py.observability.collectors import Collectors
from kasper_py.serdes import serde_for
from kasper_py.stores.base import StoreRuntime
from kasper_py.turn import BOUNDARIES, STEPS, TIMED, TurnEngine
from tests.turn_ports import ListPort

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIG = Config(name="steps", bootstrap_servers="in-memory", input_topics=["in"])


def test_the_steps_are_numbered_one_to_six_in_order() -> None:
    assert [(step.number, step.name) for step in STEPS] == [
        (1, "process"), (2, "flush"), (3, "produce"), (4, "wait"), (5, "commit"),
        (6, "report")]


def test_the_metric_labels_and_the_boundaries_are_those_dashboards_and_tests_use() -> None:
    """``TIMED`` is the ``step`` label of ``kasper_step_duration_seconds`` (grafana/
    draws it by label), ``BOUNDARIES`` the in-memory broker's ``crash_at`` steps (its
    tests run every one)."""
    assert TIMED == ("process", "flush", "produce", "read_ahead", "commit")
    assert BOUNDARIES == ("before_process", "after_process", "after_flush", "after_produce",
                          "after_commit")


def test_the_metrics_create_a_step_label_for_each_timed_step() -> None:
    collectors = Collectors("steps", None)
    labelled = {sample.labels["step"] for metric in collectors.registry.collect()
                if metric.name == "kasper_step_duration_seconds"
                for sample in metric.samples if "step" in sample.labels}
    assert labelled == set(TIMED)


class Forward(MessageProcessor):
    def __init__(self, context: ProcessorContext) -> None:
        pass

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send("out", message.value)


def test_a_turn_stops_at_every_boundary_in_order_and_times_every_step() -> None:
    boundaries: list[str] = []
    engine = TurnEngine(CONFIG, ListPort(), on_step=boundaries.append, wall_clock=None)
    engine.open_partition(0, Forward, [], StoreRuntime(CONFIG, 0, None))  # type: ignore[arg-type]
    batch = decode_batch([Message("in", 0, 0, None, b"v", 1)], serde_for("bytes"),
                         serde_for("bytes"))

    result = engine.run(batch, meanwhile=lambda: None)

    assert tuple(boundaries) == BOUNDARIES
    assert tuple(result.durations) == ("process", "flush", "produce", "read_ahead", "commit")
    assert set(result.durations) == set(TIMED)


def test_the_architecture_table_numbers_and_names_the_steps_as_the_code_does() -> None:
    text = (DOCS / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d) (\w+) \|", text, flags=re.MULTILINE)
    assert [(int(n), name) for n, name in rows] == [(s.number, s.name) for s in STEPS]


def test_the_guarantees_list_numbers_and_names_the_steps_as_the_code_does() -> None:
    text = (DOCS / "guarantees.md").read_text()
    section = text.split("## The turn", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^(\d)\. \*\*(\w+)\*\*", section, flags=re.MULTILINE)
    assert [(int(n), name) for n, name in items] == [(s.number, s.name) for s in STEPS]
