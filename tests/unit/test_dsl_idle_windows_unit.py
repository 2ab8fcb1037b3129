"""The DSL's windowed aggregations close on quiet input with ``Config.idle_advance``:
a final window comes once the partition's stream time moves on with the wall clock,
later records older than its close are late under grace, and without idle_advance the
window waits for records. Driven by ``ProcessorDriver``'s wall clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kasper_py import Config
from kasper_py.dsl import Builder
from kasper_py.dsl._aggregate import close_step
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import Hopping, Session, Sliding, Tumbling, WindowKind

START = 1_700_000_000.0


def _driver(windows: WindowKind, idle: float | None = 5.0) -> ProcessorDriver:
    b = Builder("idlewin", stores="memory")
    (b.stream("in").group_by_key().windowed_by(windows).count("c", emit="final")
        .to_stream().to("out"))
    config = Config(name="idlewin", bootstrap_servers="unused:9092", input_topics=["in"],
                    key_serde="json", value_serde="json", idle_advance=idle)
    return ProcessorDriver(b.build(), config=config, wall_clock_start=START)


def _out(driver: ProcessorDriver) -> list[tuple[Any, Any, int | None]]:
    return [(json.loads(m.key), json.loads(m.value), m.timestamp) for m in driver.sent
            if m.topic == "out"]


def _send(driver: ProcessorDriver, *times: int) -> None:
    driver.process([make_message("in", "x", "a", timestamp=t) for t in times])


def test_a_quiet_partitions_final_window_is_emitted_then_later_records_are_late() -> None:
    """Tumbling 10 s, grace 2 s: records at 1 s and 2 s, then quiet. Stream time moves
    on after 5 s of wall clock (to 7 s); the window [0, 10 s) closes at 12 s of stream
    time, 10 s after the last record: not at 9 s, at 10 s. A record at 9 s then is
    late (dropped: the closed window is not emitted again); one at 13 s opens the next
    window, which closes on quiet input too."""
    driver = _driver(Tumbling(10, grace=2))
    _send(driver, 1000, 2000)
    driver.advance_wall_clock(9)
    assert (_out(driver), driver.stream_time()) == ([], 11_000)
    driver.advance_wall_clock(1)
    assert _out(driver) == [(["a", 0, 10_000], 2, 9999)]
    _send(driver, 9000, 13_000)
    driver.advance_wall_clock(60)
    assert _out(driver) == [(["a", 0, 10_000], 2, 9999), (["a", 10_000, 20_000], 1, 19_999)]


def test_a_record_within_grace_still_counts_in_its_window() -> None:
    """Grace 5 s: 11 s of stream time (idle advanced) is past the window's end but not
    its close; a record at 8 s still counts, and the window closes with 3."""
    driver = _driver(Tumbling(10, grace=5))
    _send(driver, 1000, 2000)
    driver.advance_wall_clock(9)
    assert (_out(driver), driver.stream_time()) == ([], 11_000)
    _send(driver, 8000)
    driver.advance_wall_clock(30)
    assert _out(driver) == [(["a", 0, 10_000], 3, 9999)]


def test_without_idle_advance_the_window_waits_for_records() -> None:
    """The default: an hour of quiet emits nothing."""
    driver = _driver(Tumbling(10), idle=None)
    _send(driver, 1000)
    driver.advance_wall_clock(3600)
    assert _out(driver) == []


@pytest.mark.parametrize(("windows", "step"), [
    (Tumbling(10), 10_000), (Tumbling(10, grace=2), 2000), (Hopping(10, 5), 5000),
    (Tumbling(0.01), 1000), (Session(5), 1000), (Sliding(5), 1000)])
def test_the_tick_is_the_step_windows_close_on_at_least_a_second(
        windows: WindowKind, step: int) -> None:
    """Ticks fall on every close of a tumbling or hopping kind; never below 1 s."""
    assert close_step(windows) == step
