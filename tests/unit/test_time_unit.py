"""Time with the testing driver: stream time, timers of both kinds, scheduled tasks,
output timestamps and the timestamp extractor, each moved by the driver's own clock
(``advance_wall_clock``, ``advance_stream_time``), so nothing here sleeps."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from kasper_py import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NONE,
    Config,
    ConfigError,
    Message,
    MessageProcessor,
    ProcessingError,
    ProcessorContext,
    Sender,
    Task,
)
from kasper_py.testing import ProcessorDriver, make_message

START = datetime(2024, 1, 1, 0, 2, 30, tzinfo=UTC).timestamp()
"""The drivers' wall clock starts here: 2024-01-01 00:02:30 UTC."""


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class Ticker(MessageProcessor):
    """Forwards each value to "out"; its timer sends the firing time to "ticks"."""

    def __init__(self, context: ProcessorContext, interval: float = 10.0,
                 kind: Any = "stream_time") -> None:
        self.context = context
        self.fired: list[int] = []
        self.fail = False
        self.timer = context.schedule(interval, self.tick, kind)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send("out", message.value)

    def tick(self, timestamp: int, sender: Sender) -> None:
        if self.fail:
            raise RuntimeError("tick failed")
        self.fired.append(timestamp)
        sender.send("ticks", str(timestamp).encode())


def ticker_driver(interval: float = 10.0, kind: str = "stream_time", **kwargs: Any
                  ) -> ProcessorDriver:
    return ProcessorDriver(lambda c: Ticker(c, interval, kind), wall_clock_start=START,
                           **kwargs)


def record(timestamp: int | None, value: bytes = b"v", partition: int = 0) -> Message:
    return make_message("input", value, partition=partition, timestamp=timestamp)


def ticks(sent: list[Any]) -> list[tuple[bytes, int | None]]:
    """(value, output timestamp) of every "ticks" message."""
    return [(m.value, m.timestamp) for m in sent if m.topic == "ticks"]


# -- stream-time timers ---------------------------------------------------------------


def test_stream_time_timer_fires_only_when_records_advance_stream_time() -> None:
    """A 10 s stream-time timer fires at the first record (its first due time is 0),
    then only when a record moves stream time to the next multiple of 10 s: not on
    older records, not on the wall clock. Its output carries the stream time."""
    driver = ticker_driver()
    ticker = driver.processor()
    assert isinstance(ticker, Ticker)
    assert ticks(driver.process([record(5_000)])) == [(b"5000", 5_000)]
    assert ticks(driver.process([record(9_999)])) == []
    assert ticks(driver.process([record(3_000), record(1_000)])) == []  # out of order
    assert driver.stream_time() == 9_999
    assert driver.advance_wall_clock(3_600) == []
    assert ticks(driver.process([record(10_000)])) == [(b"10000", 10_000)]
    assert ticker.fired == [5_000, 10_000]
    assert ticker.timer.due == 20_000


def test_a_stream_time_jump_over_several_intervals_fires_once_and_realigns() -> None:
    """Kafka Streams' rule: stream time jumping from 10 s to 45.5 s fires once, at
    45.5 s, and the next due time is 50 s (the multiples in between are skipped)."""
    driver = ticker_driver()
    driver.process([record(10_000)])
    assert ticks(driver.process([record(45_500)])) == [(b"45500", 45_500)]
    assert ticks(driver.process([record(49_999)])) == []
    assert ticks(driver.process([record(50_000)])) == [(b"50000", 50_000)]


def test_stream_time_is_per_partition_and_takes_the_newest_of_a_batch() -> None:
    """Each partition has its own stream time, the newest event time of its records,
    whatever their order in the batch; messages without a timestamp leave it as is."""
    driver = ticker_driver()
    driver.process([record(7_000, partition=0), record(20_000, partition=0),
                    record(12_000, partition=0), record(3_000, partition=1),
                    record(None, partition=1)])
    assert (driver.stream_time(0), driver.stream_time(1)) == (20_000, 3_000)
    driver.process([record(None, partition=2)])
    assert driver.stream_time(2) is None


def test_advance_stream_time_fires_due_timers_and_never_goes_back() -> None:
    """The driver moves a partition's stream time with no input, as a record would;
    moving it back is refused, naming where it stands."""
    driver = ticker_driver()
    assert ticks(driver.advance_stream_time(25_000)) == [(b"25000", 25_000)]
    assert ticks(driver.advance_stream_time(29_000)) == []
    assert ticks(driver.advance_stream_time(30_000)) == [(b"30000", 30_000)]
    with pytest.raises(ValueError, match=r"stream time of partition 0 is 30000; it never goes"):
        driver.advance_stream_time(1_000)
    assert driver.committed == {}  # no input, nothing to commit


def test_observe_stream_time_seeds_it_without_firing_and_never_lowers_it() -> None:
    """What a windowed table restoring its stream time does at open: the stream time is
    known at once, no timer fires on it, a lower value leaves it, and records older than
    it neither advance it nor fire; the first later record fires."""
    def seeded(context: ProcessorContext) -> Ticker:
        context.observe_stream_time(40_000)
        context.observe_stream_time(30_000)
        return Ticker(context)

    driver = ProcessorDriver(seeded)
    ticker = driver.processor()
    assert isinstance(ticker, Ticker)
    assert (driver.stream_time(), ticker.context.stream_time()) == (40_000, 40_000)
    assert ticks(driver.process([record(39_000)])) == []
    assert ticks(driver.process([record(41_000)])) == [(b"41000", 41_000)]
    with pytest.raises(ValueError, match=r"stream time must be an int of milliseconds >= 0, "
                                         r"got -1"):
        ticker.context.observe_stream_time(-1)


def test_schedule_refuses_bad_arguments() -> None:
    """A non-positive interval, a callback that is not callable or an unknown kind."""
    context = ProcessorContext(0, Config(name="t", bootstrap_servers="x", input_topics=["i"]))
    with pytest.raises(ValueError, match=r"schedule\(\) interval must be a positive number"):
        context.schedule(0, lambda ts, sender: None)
    with pytest.raises(TypeError, match=r"schedule\(\) callback must be callable"):
        context.schedule(1, "tick")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kind must be 'stream_time' or 'wall_clock', got "
                                         r"'event_time'"):
        context.schedule(1, lambda ts, sender: None, "event_time")  # type: ignore[arg-type]


def test_a_cancelled_timer_never_fires_again() -> None:
    """cancel() from inside the callback: it fired once, never again."""
    def once(context: ProcessorContext) -> Ticker:
        ticker = Ticker(context, 1.0)
        ticker.timer.cancel()
        ticker.timer = context.schedule(1.0, lambda ts, s: (ticker.tick(ts, s),
                                                             ticker.timer.cancel()))
        return ticker

    driver = ProcessorDriver(once)
    driver.process([record(1_000)])
    driver.process([record(5_000)])
    assert ticks(driver.sent) == [(b"1000", 1_000)]


# -- wall-clock timers ----------------------------------------------------------------


def test_wall_clock_timer_fires_on_the_wall_clock_not_on_records() -> None:
    """A 60 s wall-clock timer is first due 60 s after it was scheduled; records (of
    any event time) do not fire it; a jump over several intervals fires it once and
    keeps its alignment."""
    driver = ticker_driver(60.0, "wall_clock")
    start = int(START * 1000)
    assert ticks(driver.process([record(10**13)])) == []
    assert driver.advance_wall_clock(59.999) == []
    assert ticks(driver.advance_wall_clock(0.001)) == [
        (str(start + 60_000).encode(), start + 60_000)]
    assert [t for _, t in ticks(driver.advance_wall_clock(210))] == [start + 270_000]
    assert driver.advance_wall_clock(29.9) == []
    assert [t for _, t in ticks(driver.advance_wall_clock(0.1))] == [start + 300_000]


# -- tasks ----------------------------------------------------------------------------


class Quiet(MessageProcessor):
    """Processes nothing of interest: the tasks are the subject."""

    def __init__(self, context: ProcessorContext) -> None:
        pass

    def process(self, messages: list[Message], sender: Sender) -> None:
        pass


def report(runs: list[int]) -> Callable[[int, Sender], None]:
    def run(timestamp: int, sender: Sender) -> None:
        runs.append(timestamp)
        sender.send("reports", b"report")
    return run


def test_a_cron_task_runs_on_schedule_on_the_drivers_clock() -> None:
    """ "*/5 * * * *" from 00:02:30, the clock moved 30 s at a time for 20 minutes:
    it runs at 00:05, 00:10, 00:15 and 00:20, once each, and its output carries the
    time it ran at."""
    runs: list[int] = []
    driver = ProcessorDriver(Quiet, tasks=[Task(report(runs), cron="*/5 * * * *")],
                             wall_clock_start=START)
    sent = []
    for _ in range(40):
        sent += driver.advance_wall_clock(30)
    expected = [ms(datetime(2024, 1, 1, 0, minute, tzinfo=UTC)) for minute in (5, 10, 15, 20)]
    assert runs == expected
    assert [(m.topic, m.timestamp) for m in sent] == [("reports", t) for t in expected]


def test_a_cron_task_follows_its_time_zone() -> None:
    """ "0 9 * * *" in New York (UTC-5 in January) runs at 14:00 UTC."""
    runs: list[int] = []
    midnight = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    driver = ProcessorDriver(Quiet, wall_clock_start=midnight, tasks=[
        Task(report(runs), cron="0 9 * * *", timezone=ZoneInfo("America/New_York"))])
    for _ in range(24):
        driver.advance_wall_clock(3600)
    assert runs == [ms(datetime(2024, 1, 1, 14, 0, tzinfo=UTC))]


def test_an_interval_task_runs_every_interval_and_skips_missed_runs() -> None:
    """every=90: first at start + 90 s; a 200 s jump runs it once (at +290 s), and the
    next run is at +360 s, on the original 90 s grid."""
    runs: list[int] = []
    driver = ProcessorDriver(Quiet, tasks=[Task(report(runs), every=90)],
                             wall_clock_start=START)
    start = int(START * 1000)
    driver.advance_wall_clock(89)
    assert runs == []
    driver.advance_wall_clock(1)
    driver.advance_wall_clock(200)
    driver.advance_wall_clock(69)
    assert runs == [start + 90_000, start + 290_000]
    driver.advance_wall_clock(1)
    assert runs == [start + 90_000, start + 290_000, start + 360_000]


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"cron": "61 * * * *"}, r"cron '61 \* \* \* \*' is not a valid cron expression"),
    ({"cron": "every five minutes"}, r"cron 'every five minutes' is not a valid cron"),
    ({"cron": "* * * * *", "every": 5}, r"give exactly one of every= \(seconds\) and cron="),
    ({}, r"give exactly one of every="),
    ({"every": 0}, r"every must be a positive number of seconds, got 0"),
    ({"every": "5"}, r"every must be a positive number of seconds, got '5'"),
])
def test_a_bad_task_schedule_is_a_config_error(kwargs: dict[str, Any], text: str) -> None:
    """A bad cron expression or interval fails when the task is declared, naming it."""
    def nightly(timestamp: int, sender: Sender) -> None:
        pass

    with pytest.raises(ConfigError, match=r"config field 'tasks': task '.*nightly': " + text):
        Task(nightly, **kwargs)


def test_tasks_must_be_task_objects() -> None:
    """A plain function passed as a task is refused at construction."""
    with pytest.raises(TypeError, match=r"tasks must be Task objects"):
        ProcessorDriver(Quiet, tasks=[report([])])  # type: ignore[list-item]


def test_a_failing_task_fails_the_turn_and_runs_again_on_the_retry() -> None:
    """The task raises: ProcessingError (no partition), nothing of the turn is sent, and
    the task is still due, so the next turn runs it."""
    runs: list[int] = []
    failing = [True]

    def flaky(timestamp: int, sender: Sender) -> None:
        sender.send("reports", b"partial")
        if failing[0]:
            raise RuntimeError("report failed")
        runs.append(timestamp)

    driver = ProcessorDriver(Quiet, tasks=[Task(flaky, every=60, name="flaky")],
                             wall_clock_start=START)
    with pytest.raises(ProcessingError, match=r"task 'flaky' raised RuntimeError: report failed"
                       ) as info:
        driver.advance_wall_clock(60)
    assert info.value.partition is None
    assert driver.sent == []
    failing[0] = False
    assert [m.value for m in driver.advance_wall_clock(0)] == [b"partial"]
    assert runs == [int(START * 1000) + 60_000]


# -- a failing timer ----------------------------------------------------------------


def test_a_failing_timer_fails_the_turn_uncommitted_and_fires_again() -> None:
    """The timer raises after the records moved stream time: ProcessingError naming
    the timer and partition; nothing sent, nothing committed, stream time back where it
    was. The same records processed again fire it again, and now it all commits."""
    driver = ticker_driver()
    driver.process([record(5_000)])
    ticker = driver.processor()
    assert isinstance(ticker, Ticker)
    ticker.fail = True
    batch = [make_message("input", b"v", timestamp=12_000, offset=1)]
    with pytest.raises(ProcessingError, match=r"stream_time timer \(every 10000 ms\) of "
                                              r"partition 0 raised RuntimeError: tick failed"):
        driver.process(batch)
    assert driver.committed == {("input", 0): 1}
    assert driver.stream_time() == 5_000
    assert ticks(driver.sent) == [(b"5000", 5_000)]
    ticker.fail = False
    driver.process(batch)
    assert ticks(driver.sent) == [(b"5000", 5_000), (b"12000", 12_000)]
    assert driver.committed == {("input", 0): 2}


# -- output timestamps ----------------------------------------------------------------


class Stamper(MessageProcessor):
    """Sends one message per input with the inherited timestamp, and one overriding it."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send("inherited", message.value)
        sender.send("overridden", b"x", timestamp=1_234)


def test_output_inherits_the_newest_event_time_of_the_batch_unless_overridden() -> None:
    """Every message process() sends carries the newest event time of its partition's
    batch (each partition its own); timestamp= overrides it."""
    driver = ProcessorDriver(Stamper)
    sent = driver.process([record(3_000), record(5_000), record(4_000),
                           record(9_000, partition=1)])
    assert [(m.topic, m.timestamp) for m in sent] == [
        ("inherited", 5_000), ("inherited", 5_000), ("inherited", 5_000),
        ("overridden", 1_234), ("inherited", 9_000), ("overridden", 1_234)]
    assert [m.timestamp for m in driver.process([record(None)])] == [None, 1_234]


def test_a_bad_output_timestamp_fails_the_turn() -> None:
    """timestamp= must be an int of milliseconds >= 0."""
    class Negative(Stamper):
        def process(self, messages: list[Message], sender: Sender) -> None:
            sender.send("out", b"x", timestamp=-5)

    with pytest.raises(ProcessingError, match=r"send\(\) timestamp must be a non-negative "
                                              r"int of milliseconds, got -5"):
        ProcessorDriver(Negative).process([record(1)])


def test_make_message_sets_the_timestamp_type() -> None:
    """Create time when a timestamp is given, none otherwise, unless said."""
    assert make_message("t", b"v", timestamp=5).timestamp_type == TIMESTAMP_CREATE_TIME
    assert make_message("t", b"v").timestamp_type == TIMESTAMP_NONE
    assert make_message("t", b"v", timestamp=5, timestamp_type=2).timestamp_type == 2


# -- the timestamp extractor ----------------------------------------------------------


def from_value(message: Message) -> int | None:
    """Event time from a JSON value's "ts" field (None: use the Kafka timestamp)."""
    ts = message.value.get("ts")
    return None if ts is None else int(ts)


class EventTimes(MessageProcessor):
    """Sends each message's event time, as the context reads it."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send("times", {"event_time": self.context.event_time(message),
                                  "stream_time": self.context.stream_time()})


def extractor_driver(extractor: Any) -> ProcessorDriver:
    config = Config(name="t", bootstrap_servers="in-memory:0", input_topics=["input"],
                    value_serde="json", timestamp_extractor=extractor)
    return ProcessorDriver(EventTimes, config=config)


@pytest.fixture
def extractor_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module on sys.path holding an extractor, as a user's app would."""
    (tmp_path / "kasper_test_times.py").write_text(
        "def from_value(message):\n"
        "    return message.value.get('ts')\n"
        "not_a_function = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kasper_test_times"
    sys.modules.pop("kasper_test_times", None)


@pytest.mark.parametrize("how", ["callable", "name"])
def test_the_extractor_gives_event_time_stream_time_and_output_timestamps(
        how: str, extractor_module: str) -> None:
    """From a callable or a "module:function" name: event_time() is the extractor's
    value (or the Kafka timestamp where it returns None); stream time and the output
    timestamp follow the event times."""
    extractor = from_value if how == "callable" else f"{extractor_module}:from_value"
    driver = extractor_driver(extractor)
    sent = driver.process([record(100, {"ts": 7_000}), record(200, {}),  # type: ignore[arg-type]
                           record(300, {"ts": 5_000})])  # type: ignore[arg-type]
    assert [m.value for m in sent] == [
        b'{"event_time":7000,"stream_time":7000}',
        b'{"event_time":200,"stream_time":7000}',
        b'{"event_time":5000,"stream_time":7000}']
    assert {m.timestamp for m in sent} == {7_000}


@pytest.mark.parametrize(("extractor", "text"), [
    ("no_colon", r"must be a function of a Message, or its name as 'module:function', "
                 r"got 'no_colon'"),
    (42, r"must be a function of a Message, or its name as 'module:function', got 42"),
    ("", r".*got ''"),
])
def test_a_malformed_extractor_is_a_config_error(extractor: Any, text: str) -> None:
    """The Config refuses what cannot be an extractor, naming the field."""
    with pytest.raises(ConfigError, match=r"config field 'timestamp_extractor': " + text):
        extractor_driver(extractor)


@pytest.mark.parametrize(("name", "text"), [
    ("kasper_no_such_module:f", r"no module named 'kasper_no_such_module' \(it must be "
                                r"importable where the processor runs\)"),
    ("{module}:missing", r"'{module}' has no attribute 'missing'"),
    ("{module}:not_a_function", r"'{module}:not_a_function' is a int, not a function"),
])
def test_an_extractor_name_that_does_not_resolve_is_a_config_error(
        name: str, text: str, extractor_module: str) -> None:
    """Imported when the driver (or the loop) is built: a clear ConfigError."""
    with pytest.raises(ConfigError, match=r"config field 'timestamp_extractor': .*"
                       + text.format(module=extractor_module)):
        extractor_driver(name.format(module=extractor_module))


@pytest.mark.parametrize(("extractor", "text"), [
    (lambda m: "soon", r"timestamp_extractor returned 'soon' for input\[0\] offset 0: it "
                       r"must return milliseconds since the epoch \(an int >= 0\) or None"),
    (lambda m: -1, r"timestamp_extractor returned -1"),
    (lambda m: m.value["ts"], r"timestamp_extractor raised KeyError: 'ts' \(input\[0\] "
                              r"offsets 0..0\)"),
])
def test_an_extractor_failing_on_a_message_fails_the_turn(extractor: Any, text: str) -> None:
    """A bad value or an exception from the extractor: ProcessingError naming the
    message, and nothing committed."""
    driver = extractor_driver(extractor)
    with pytest.raises(ProcessingError, match=text):
        driver.process([record(1, {})])  # type: ignore[arg-type]
    assert driver.committed == {}
    assert driver.sent == []
