"""The DSL's windowed stream-stream joins, case by case: the windows' edges (before,
after, grace), late records, a failed turn replayed, what ``describe`` shows, and the
errors a wrong call gets (the model comparison is test_dsl_window_join_properties)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kasper_py import ConfigError, ProcessingError, cli
from kasper_py.app import describe
from kasper_py.dsl import Builder
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import JoinWindows


def pair(value: Any, other: Any) -> list[Any]:
    return [value, other]


def driver_of(how: str, windows: JoinWindows, joiner: Any = pair) -> ProcessorDriver:
    b = Builder("wj", stores="memory")
    left, right = b.stream("l"), b.stream("r")
    {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[how](
        right, joiner, windows, store="buffer").to("out")
    return ProcessorDriver(b.build(), key_serde="json", value_serde="json")


def record(topic: str, key: str, value: Any, at: int) -> Any:
    return make_message(topic, value, key, timestamp=at)


def sent(driver: ProcessorDriver) -> list[tuple[Any, Any, int | None]]:
    return [(json.loads(m.key or b"null"), json.loads(m.value or b"null"), m.timestamp)
            for m in driver.sent if m.topic == "out"]


def test_asymmetric_windows_take_right_records_from_before_to_after() -> None:
    """JoinWindows(0, before=2 ms, after=5 ms): a left record at 100 joins right records
    from 98 to 105, each pair stamped with the later time; 97 and 106 do not join."""
    driver = driver_of("inner", JoinWindows(0, before=0.002, after=0.005, grace=0.01))
    driver.process([record("l", "k", "L", 100)])
    driver.process([record("r", "k", r, t) for r, t in
                    (("R97", 97), ("R98", 98), ("R105", 105), ("R106", 106))])
    assert sent(driver) == [("k", ["L", "R98"], 100), ("k", ["L", "R105"], 105)]


def test_outer_join_sends_each_unmatched_side_once_when_it_can_no_longer_join() -> None:
    """Within 10 ms, 5 ms of grace: unmatched records of both sides come out with
    ``None`` for the other side, their own time, once stream time passes their time
    + before + after + grace (126 for 100), never before; matched ones never do."""
    driver = driver_of("outer", JoinWindows(0.01, grace=0.005))
    driver.process([record("l", "a", "La", 100), record("r", "b", "Rb", 101),
                    record("l", "c", "Lc", 102), record("r", "c", "Rc", 104)])
    assert sent(driver) == [("c", ["Lc", "Rc"], 104)]
    driver.process([record("l", "z", "Lz", 125)])
    assert sent(driver)[1:] == []
    driver.process([record("l", "z", "Lz2", 127)])
    assert sent(driver)[1:] == [("a", ["La", None], 100), ("b", [None, "Rb"], 101)]
    driver.process([record("l", "z", "Lz3", 500)])
    assert sent(driver)[3:] == [("z", ["Lz", None], 125), ("z", ["Lz2", None], 127)]


def test_late_records_are_dropped_and_counted_in_the_left_join() -> None:
    """A record behind stream time by more than its window's end plus grace is late:
    it neither joins nor comes out unmatched, and the late-records count says so."""
    driver = driver_of("left", JoinWindows(0.01, grace=0.002))
    driver.process([record("l", "k", "L", 100), record("r", "x", "Rx", 200)])
    driver.process([record("r", "k", "R-late", 105), record("l", "k", "L-late", 180)])
    driver.process([record("r", "k", "R-on-time", 190), record("l", "k", "L-on-time", 189)])
    driver.process([record("r", "x", "end", 1000)])
    assert sent(driver) == [("k", ["L", None], 100),
                            ("k", ["L-on-time", "R-on-time"], 190)]


def test_a_failed_turn_is_replayed_with_nothing_doubled() -> None:
    """A joiner that raises fails the turn (a ``ProcessingError``), which commits
    nothing; the same records again join once, as if the failure never happened."""
    calls = {"fail": True}

    def joiner(value: Any, other: Any) -> Any:
        if calls.pop("fail", False):
            raise ValueError("boom")
        return [value, other]

    driver = driver_of("inner", JoinWindows(0.01), joiner)
    driver.process([record("l", "k", "L1", 100)])
    batch = [record("r", "k", "R1", 105), record("l", "k", "L2", 106)]
    with pytest.raises(ProcessingError, match="boom"):
        driver.process(batch)
    assert sent(driver) == []
    driver.process(batch)
    assert sent(driver) == [("k", ["L1", "R1"], 105), ("k", ["L2", "R1"], 106)]


def test_describe_shows_the_join_its_store_and_a_rekeyed_sides_repartition() -> None:
    """The join is one node of the stage both streams end in, reading its left parent
    and its right one, with its windowed store; a re-keyed side reaches it through a
    repartition, so its source moves to a stage of its own."""
    b = Builder("wj", stores="memory")
    right = b.stream("r").select_key(lambda _k, v: v)
    b.stream("l").outer_join(right, pair, JoinWindows(5), store="pairs", name="both").to("o")
    stages = describe(b.build())["processors"]
    assert [(p["name"], p["inputs"], p["stores"]) for p in stages] == [
        ("stage-0", ["topic:r"], []),
        ("stage-1", ["topic:l", "repartition:join-0 (wj-join-0-repartition)"],
         [{"name": "pairs", "kind": "MemoryTable"}])]
    assert [(o["name"], o["kind"], o["links"], o["to"]) for o in stages[1]["operators"]] == [
        ("KSTREAM-SOURCE-0000000002", "source", ["topic:l"], ["both"]),
        ("KSTREAM-SOURCE-0000000004", "source",
         ["repartition:join-0 (wj-join-0-repartition)"], ["both"]),
        ("both", "window_outer_join", ["store:pairs"], ["KSTREAM-SINK-0000000005"]),
        ("KSTREAM-SINK-0000000005", "to", ["topic:o"], [])]


def test_wrong_calls_are_config_errors_naming_what_is_missing() -> None:
    """A stream-stream join without windows, and a stream-table join with them or as
    an outer join, are ``ConfigError``s saying so."""
    b = Builder("wj", stores="memory")
    stream, other, table = b.stream("l"), b.stream("r"), b.table("t")
    with pytest.raises(ConfigError, match="needs its windows"):
        stream.join(other, pair)
    with pytest.raises(ConfigError, match="takes no windows"):
        stream.join(table, pair, JoinWindows(1))
    with pytest.raises(ConfigError, match="no outer form"):
        stream.outer_join(table, pair, JoinWindows(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="join window before"):
        JoinWindows(1, before=-1)


def test_kasper_app_describe_prints_the_join_and_its_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`kasper app describe` of tests.dsl_shapes.window_join: one stage reading both
    topics, the windowed store, and the join named ``order-paid`` fed by both sources."""
    (tmp_path / "wj_module.py").write_text(
        "from tests import dsl_shapes\n"
        "app = dsl_shapes.window_join('orders', 'payments', 'out', 'memory')\n")
    monkeypatch.setenv("KASPER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert cli.main(["app", "describe", "wj_module:app", "--app-dir", str(tmp_path)]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert lines[lines.index("1. processor stage-0"):] == [
        "1. processor stage-0",
        "inputs:  topic:orders, topic:payments",
        "outputs: topic:out",
        "stores:  paid (MemoryTable)",
        "operators:",
        "KSTREAM-SOURCE-0000000000 source [topic:orders] --> order-paid",
        "KSTREAM-SOURCE-0000000001 source [topic:payments] --> order-paid",
        "order-paid window_outer_join [store:paid] --> KSTREAM-SINK-0000000002",
        "KSTREAM-SINK-0000000002 to [topic:out]"]
