"""``Config.idle_advance``: a partition with no new record for that long (wall clock)
advances its stream time by the wall-clock time since its last record, so stream-time
timers fire, and a ``WindowedTable`` advanced from one emits its final windows on quiet
input; later records older than the window's close are late. Driven by
``ProcessorDriver``'s wall clock, against a model with random steps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import Config, ConfigError, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import Tumbling, WindowedTable, count

START = 1_700_000_000.0


class FinalCounts(MessageProcessor):
    """Counts per key and 10 s window, emit="final"; a stream-time timer every second
    advances the table, so windows close on quiet input too."""

    def __init__(self, context: ProcessorContext) -> None:
        self.table = WindowedTable(context, "w", Tumbling(10), count(), emit="final")
        context.schedule(1, self.tick)

    def tick(self, stream_time: int, sender: Sender) -> None:
        self._send(self.table.advance(stream_time), sender)

    def process(self, messages: list[Message], sender: Sender) -> None:
        self._send(self.table.update((m.key, m.timestamp, m.value) for m in messages), sender)

    @staticmethod
    def _send(results: list, sender: Sender) -> None:  # type: ignore[type-arg]
        for result in results:
            sender.send("out", f"{result.key}:{result.start}:{result.value}")


def _driver(idle: float | None = 5.0) -> ProcessorDriver:
    config = Config(name="idle", bootstrap_servers="unused:9092", input_topics=["in"],
                    key_serde="str", value_serde="str", idle_advance=idle)
    return ProcessorDriver(FinalCounts, config=config,
                           stores=[MemoryTable("w", key_serde="bytes")],
                           wall_clock_start=START)


def _out(driver: ProcessorDriver) -> list[str]:
    return [value for _, value in driver.outputs("out")]


def test_a_quiet_partitions_final_window_is_emitted() -> None:
    """Records at 1 s and 2 s of event time; 4 s of quiet: nothing; at 5 s stream time
    becomes 7 s; at 8 s it reaches 10 s and the window [0, 10 s) is emitted, once. A
    record at 9 s arriving then is late: no window emits it."""
    driver = _driver()
    driver.process([make_message("in", "v", "a", timestamp=t) for t in (1000, 2000)])
    driver.advance_wall_clock(4)
    assert (_out(driver), driver.stream_time()) == ([], 2000)
    driver.advance_wall_clock(1)
    assert (_out(driver), driver.stream_time()) == ([], 7000)
    driver.advance_wall_clock(3)
    assert (_out(driver), driver.stream_time()) == (["a:0:2"], 10_000)
    driver.process([make_message("in", "v", "a", timestamp=9000)])
    driver.advance_wall_clock(30)
    assert _out(driver) == ["a:0:2"]
    assert driver.processor().table.late_records == 1  # type: ignore[attr-defined]


def test_without_idle_advance_stream_time_waits_for_records() -> None:
    """The default: however long the quiet, the window stays open."""
    driver = _driver(idle=None)
    driver.process([make_message("in", "v", "a", timestamp=1000)])
    driver.advance_wall_clock(3600)
    assert (_out(driver), driver.stream_time()) == ([], 1000)


@pytest.mark.parametrize("idle", [0, -1, True, float("inf")])
def test_idle_advance_must_be_positive_and_finite(idle: float) -> None:
    """0, negative, a bool or infinity is a ConfigError naming the field."""
    with pytest.raises(ConfigError, match="idle_advance"):
        Config(name="x", bootstrap_servers="x:1", input_topics=["in"], idle_advance=idle)


STEPS = st.lists(st.one_of(
    st.tuples(st.just("record"), st.integers(0, 30_000)),
    st.tuples(st.just("wait"), st.integers(0, 64).map(lambda n: n * 125))), max_size=30)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_stream_time_follows_the_rule(steps: list[tuple[str, int]]) -> None:
    """After each step (a record, or wall-clock time passing; waits in eighths of a
    second, exact in binary), the partition's stream time is the model's: the newest
    event time, or once idle 5 s or more at a turn, the stream time at the last record
    plus the wall-clock time since. A turn with no input after each wait shows stream
    time as of now (a turn runs by itself only when a timer falls due)."""
    driver = _driver()
    now, last, stream_time = 0, None, None

    def idle_time() -> int | None:
        if last is None or now - last[0] < 5000:
            return None
        return last[1] + now - last[0]

    for kind, amount in steps:
        if kind == "record":
            driver.process([make_message("in", "v", "k", timestamp=amount)])
            moved = idle_time()  # the turn first advances an idle partition
            stream_time = max(x for x in (stream_time, moved, amount) if x is not None)
            last = (now, stream_time)
        else:
            driver.advance_wall_clock(amount / 1000)
            driver.process([])
            now += amount
            moved = idle_time()
            if moved is not None:
                stream_time = max(stream_time or 0, moved)
        assert driver.stream_time() == stream_time
