"""Reprocessing without a broker or Spark: range planning, the CLI's position syntax,
the handoff checks, and importing the package without pyspark."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kasper_py import Config, ReprocessError
from kasper_py.kafka.offsets import CommitNote, running_window
from kasper_py.kafka.positions import to_millis
from kasper_py.reprocess import (
    HandoffRefusedError,
    RangeError,
    ReprocessRange,
    parse_position,
)
from kasper_py.reprocess._handoff import check_group_idle, commit_handoff
from kasper_py.reprocess._kafka import KafkaFacts
from kasper_py.spark.range import plan_range
from kasper_py.spark.session import read_input

WATERMARKS = {("a", 0): (0, 100), ("a", 1): (10, 50), ("b", 0): (5, 5), ("b", 1): (0, 30)}


def no_times(millis: int) -> dict[tuple[str, int], int]:
    raise AssertionError(f"no time lookup expected, got {millis}")


def test_earliest_to_latest_covers_the_watermarks() -> None:
    """The default range is every partition from its low to its high watermark."""
    plan = plan_range(WATERMARKS, "earliest", "latest", no_times)
    assert plan.starts == {k: low for k, (low, _) in WATERMARKS.items()}
    assert plan.ends == {k: high for k, (_, high) in WATERMARKS.items()}
    assert plan.messages == 100 + 40 + 0 + 30
    assert plan.partitions == [0, 1]


def test_explicit_offsets_default_the_partitions_left_out() -> None:
    """A mapping sets the partitions it names; the others start at earliest / end at latest."""
    plan = plan_range(WATERMARKS, {("a", 0): 40}, {("a", 1): 20, ("b", 1): 30}, no_times)
    assert plan.starts == {("a", 0): 40, ("a", 1): 10, ("b", 0): 5, ("b", 1): 0}
    assert plan.ends == {("a", 0): 100, ("a", 1): 20, ("b", 0): 5, ("b", 1): 30}


def test_times_resolve_through_offsets_at() -> None:
    """A datetime is looked up once as epoch milliseconds; naive means UTC."""
    asked: list[int] = []

    def offsets_at(millis: int) -> dict[tuple[str, int], int]:
        asked.append(millis)
        return {k: (low + high) // 2 for k, (low, high) in WATERMARKS.items()}

    plan = plan_range(WATERMARKS, datetime(2024, 1, 1), "latest", offsets_at)
    assert asked == [to_millis(datetime(2024, 1, 1, tzinfo=UTC))] == [1704067200000]
    assert plan.starts[("a", 0)] == 50 and plan.ends[("a", 0)] == 100


def test_every_bad_partition_is_named() -> None:
    """End before start and offsets outside the watermarks are all listed in one error."""
    with pytest.raises(RangeError) as info:
        plan_range(WATERMARKS, {("a", 0): 60, ("a", 1): 5}, {("a", 0): 50, ("b", 1): 31},
                   no_times)
    text = str(info.value)
    assert "start offset 5 of a[1] is outside its watermarks 10 (earliest) to 50 (latest)" in text
    assert "end offset 31 of b[1] is outside its watermarks 0 (earliest) to 30 (latest)" in text
    assert "end before start for a[0]: end offset 50 < start offset 60" in text


@pytest.mark.parametrize(("start", "message"), [
    ({("c", 0): 1}, "start offsets name c[0], which is not an input partition"),
    ({("a", 9): 1}, "start offsets name a[9], which is not an input partition"),
    ({"a": 1}, "start offsets must be keyed by (topic, partition), got 'a'"),
    ({("a", 0): "1"}, "start offset of a[0] must be an int, got '1'"),
    ("first", "start must be 'earliest', 'latest', a datetime or a mapping"),
    (17, "start must be 'earliest', 'latest', a datetime or a mapping"),
])
def test_malformed_positions_are_refused(start: Any, message: str) -> None:
    """Unknown partitions, wrong key or offset types and unknown words are RangeErrors."""
    with pytest.raises(RangeError, match=re.escape(message)):
        plan_range(WATERMARKS, start, "latest", no_times)


def test_range_renders_spark_options() -> None:
    """startingOffsets/endingOffsets/assign are the JSON Spark's Kafka source reads."""
    plan = ReprocessRange({("t", 0): 3, ("t", 1): 0, ("u", 0): 7},
                          {("t", 0): 9, ("t", 1): 4, ("u", 0): 7})
    assert json.loads(plan.spark_offsets("start")) == {"t": {"0": 3, "1": 0}, "u": {"0": 7}}
    assert json.loads(plan.spark_offsets("end")) == {"t": {"0": 9, "1": 4}, "u": {"0": 7}}
    assert json.loads(plan.spark_assign()) == {"t": [0, 1], "u": [0]}
    assert plan.describe() == "t[0] 3..9, t[1] 0..4, u[0] 7..7"
    assert plan.messages == 10


def test_cli_positions() -> None:
    """--start/--end accept earliest, latest, ISO times, epoch ms and topic:p=offset lists."""
    assert parse_position("earliest") == "earliest"
    assert parse_position("latest") == "latest"
    assert parse_position("2024-01-01T00:00:00") == datetime(2024, 1, 1, tzinfo=UTC)
    assert parse_position("1704067200000") == datetime(2024, 1, 1, tzinfo=UTC)
    assert parse_position("events:0=10, events.v2:3=7") == {("events", 0): 10,
                                                             ("events.v2", 3): 7}
    for bad in ("yesterday", "events=10", "events:x=1", "events:0=-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_position(bad)


class FakeFacts:
    """Stands in for KafkaFacts: a group state, committed offsets, and recorded commits."""

    def __init__(self, state: str = "EMPTY", members: tuple[str, ...] = (),
                 committed: dict[tuple[str, int], int | None] | None = None,
                 commit_error: ReprocessError | None = None,
                 notes: list[CommitNote | None] | None = None) -> None:
        self.state, self.members = state, list(members)
        self.offsets = committed or {}
        self.notes = notes or []
        self.commit_error = commit_error
        self.commits: list[dict[tuple[str, int], int]] = []

    def group_state(self) -> tuple[str, list[str]]:
        return self.state, self.members

    def committed(self, keys: Any) -> dict[tuple[str, int], int | None]:
        return {key: self.offsets.get(key) for key in keys}

    def commit_notes(self, keys: Any) -> list[CommitNote | None]:
        return self.notes

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append(dict(offsets))


CONFIG = Config(name="counts", bootstrap_servers="in-memory:0", input_topics=["t"])


def test_group_with_members_refuses_handoff() -> None:
    """A member, or a rebalancing group, is refused with its state and members named."""
    check_group_idle(CONFIG, FakeFacts("EMPTY"), [("t", 0)])  # type: ignore[arg-type]
    check_group_idle(CONFIG, FakeFacts("DEAD"), [("t", 0)])  # type: ignore[arg-type]
    with pytest.raises(HandoffRefusedError, match=r"'counts' is active \(stable, members: "
                                                  r"host-1, host-2\)"):
        check_group_idle(CONFIG, FakeFacts("STABLE", ("host-1", "host-2")),  # type: ignore[arg-type]
                         [("t", 0)])
    with pytest.raises(HandoffRefusedError, match="preparing_rebalance"):
        check_group_idle(CONFIG, FakeFacts("PREPARING_REBALANCE"), [])  # type: ignore[arg-type]


def test_a_running_loop_note_refuses_handoff_and_a_stopped_one_does_not() -> None:
    """A static-assignment loop is no member; its last commit note says whether it runs.
    Running and recent: refused, naming host and pid. Stopped, or running but older than
    the window (killed): allowed."""
    now = time.time()
    running = CommitNote("running", now - 3, "host-a", 42)
    with pytest.raises(HandoffRefusedError, match=r"is running on host-a \(pid 42\), "
                                                  r"committed 3 s ago"):
        check_group_idle(CONFIG, FakeFacts(notes=[None, running]), [])  # type: ignore[arg-type]
    stopped = CommitNote("stopped", now - 1, "host-a", 42)
    stale = CommitNote("running", now - running_window(CONFIG) - 1, "host-a", 41)
    check_group_idle(CONFIG, FakeFacts(notes=[stopped, stale]), [])  # type: ignore[arg-type]


def test_offsets_moved_during_the_job_refuse_handoff() -> None:
    """A loop with a static assignment is no member, but its commits give it away."""
    before: dict[tuple[str, int], int | None] = {("t", 0): 10, ("t", 1): None}
    facts = FakeFacts(committed={("t", 0): 14, ("t", 1): None})
    with pytest.raises(HandoffRefusedError, match=r"t\[0\] 10 -> 14"):
        commit_handoff(CONFIG, facts, {("t", 0): 50, ("t", 1): 60}, before)  # type: ignore[arg-type]
    assert facts.commits == []
    unchanged = FakeFacts(committed={("t", 0): 10})
    commit_handoff(CONFIG, unchanged, {("t", 0): 50, ("t", 1): 60}, before)  # type: ignore[arg-type]
    assert unchanged.commits == [{("t", 0): 50, ("t", 1): 60}]


def test_forced_handoff_skips_the_checks_but_not_the_broker() -> None:
    """before=None (forced) commits at once; the broker's 'group not empty' still refuses."""
    facts = FakeFacts("STABLE", ("host-1",))
    commit_handoff(CONFIG, facts, {("t", 0): 5}, None)  # type: ignore[arg-type]
    assert facts.commits == [{("t", 0): 5}]
    refused = FakeFacts(commit_error=ReprocessError("non empty", code=KafkaError.NON_EMPTY_GROUP))
    with pytest.raises(HandoffRefusedError, match="the broker says group 'counts' is active"):
        commit_handoff(CONFIG, refused, {("t", 0): 5}, None)  # type: ignore[arg-type]


def test_importing_the_package_does_not_import_pyspark() -> None:
    """The CLI can list `kasper reprocess` without loading pyspark, pandas or pyarrow."""
    code = ("import sys, kasper_py.reprocess; "
            "print([m for m in ('pyspark', 'pandas', 'pyarrow') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True)
    assert done.stdout.strip() == "[]"


class TimesAnswer:
    """Stands in for the consumer's offsets_for_times: fixed answers per partition."""

    def __init__(self, answers: dict[int, tuple[int, int | None]]) -> None:
        self.answers = answers

    def offsets_for_times(self, request: list[Any], timeout: float) -> list[Any]:
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition,
                                offset=self.answers[tp.partition][0],
                                error=None if self.answers[tp.partition][1] is None
                                else KafkaError(self.answers[tp.partition][1]))
                for tp in request]

    def close(self) -> None:
        pass


def facts_answering(answers: dict[int, tuple[int, int | None]]) -> KafkaFacts:
    facts = KafkaFacts(Config(name="times", bootstrap_servers="127.0.0.1:1",
                              input_topics=["t"]))
    facts._consumer.close()
    facts._consumer = TimesAnswer(answers)
    return facts


def test_time_lookup_errors_fail_and_offsets_stay_inside_the_snapshot() -> None:
    """A partition the time lookup failed for is an error naming it, not "nothing that
    recent" (which would hand off its high watermark: a gap). No record that recent
    means the high watermark; a record written after the watermarks were read is
    clamped to them."""
    marks = {("t", 0): (0, 100), ("t", 1): (0, 50), ("t", 2): (0, 70)}
    ok = facts_answering({0: (40, None), 1: (-1, None), 2: (75, None)})
    assert ok.offsets_at(1000, marks) == {("t", 0): 40, ("t", 1): 50, ("t", 2): 70}
    failing = facts_answering({0: (40, None), 1: (-1, KafkaError.LEADER_NOT_AVAILABLE),
                               2: (10, None)})
    with pytest.raises(ReprocessError, match=r"offsets at 1000 ms failed for t\[1\]"):
        failing.offsets_at(1000, marks)


@pytest.mark.parametrize(("options", "text"), [
    ({"minPartitions": "8"}, "would split a Kafka partition"),
    ({"failOnDataLoss": "false"}, "would skip records deleted by retention"),
    ({"kafka.isolation.level": "read_uncommitted"}, "must read the same"),
])
def test_reader_options_that_break_a_guarantee_are_refused(options: dict[str, str],
                                                           text: str) -> None:
    """Refused before Spark reads anything, each naming what it would break."""
    pytest.importorskip("pyspark")
    plan = ReprocessRange({("t", 0): 0}, {("t", 0): 10})
    with pytest.raises(ReprocessError, match=text):
        read_input(None, CONFIG, plan, options)
