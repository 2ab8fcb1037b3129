"""One-time tasks (``Task(once=True)``, ``Task(delay=...)``): once per start, in the
first turn or after the delay; never again in that process; a leader-only one waits
for this process to lead and runs where it leads, once; what is refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kasper_py import Config, ConfigError, Message, MessageProcessor, Sender, Task
from kasper_py.app import App
from kasper_py.testing import ProcessorDriver
from kasper_py.time.keeper import TimeKeeper

START = 1_700_000_000.0
CONFIG = Config(name="once", bootstrap_servers="127.0.0.1:1", input_topics=["in"])


class Quiet(MessageProcessor):
    def process(self, messages: list[Message], sender: Sender) -> None:
        pass


def recorder(runs: list[int]) -> Callable[[int, Sender], None]:
    def run(now: int, sender: Sender) -> None:
        runs.append(now)
        sender.send("started", b"hello")
    return run


def test_once_runs_in_the_first_turn_and_never_again() -> None:
    """``once=True``: in the first turn after the start, its output stamped then; an
    hour later it has not run again. A new driver (a restart) runs it again."""
    for _ in range(2):  # each start runs it once
        runs: list[int] = []
        driver = ProcessorDriver(Quiet, tasks=[Task(recorder(runs), once=True)],
                                 wall_clock_start=START)
        sent = driver.advance_wall_clock(0)
        assert runs == [int(START * 1000)]
        assert [(m.topic, m.timestamp) for m in sent] == [("started", int(START * 1000))]
        for _ in range(60):
            assert driver.advance_wall_clock(60) == []
        assert runs == [int(START * 1000)]


def test_a_delay_runs_once_that_long_after_the_start() -> None:
    runs: list[int] = []
    driver = ProcessorDriver(Quiet, tasks=[Task(recorder(runs), delay=30)],
                             wall_clock_start=START)
    assert driver.advance_wall_clock(29.9) == [] and runs == []
    assert len(driver.advance_wall_clock(0.1)) == 1
    driver.advance_wall_clock(3600)
    assert runs == [int(START * 1000) + 30_000]
    again: list[int] = []
    ProcessorDriver(Quiet, tasks=[Task(recorder(again), once=True, delay=5)],
                    wall_clock_start=START).advance_wall_clock(10)
    assert again == [int(START * 1000) + 10_000]  # ran in the turn at +10 s, once


def test_a_leader_only_one_time_task_waits_to_lead_then_runs_once() -> None:
    """Not leading when it falls due, it stays pending (looked at again every half
    second, not in a busy loop); once the process leads it runs, once, and no more
    when the lead goes and comes back."""
    clock = [START]
    runs: list[int] = []
    leading = [False]
    keeper = TimeKeeper(CONFIG, lambda: clock[0], [Task(recorder(runs), once=True,
                                                        on_leader=True)],
                        leading=lambda: leading[0])

    def at(seconds: float) -> None:
        clock[0] = START + seconds
        if keeper.due():
            keeper.fire_wall_clock(Sender())

    at(0)
    assert runs == [] and keeper.seconds_until_due() == pytest.approx(0.5)
    at(3)
    leading[0] = True
    at(4)
    assert runs == [int(START * 1000) + 4_000]
    leading[0] = False
    at(10)
    leading[0] = True
    at(20)
    assert runs == [int(START * 1000) + 4_000] and keeper.seconds_until_due() is None


def test_an_apps_one_time_task_and_its_repr() -> None:
    app = App("boot")
    task = app.task(lambda now, sender: None, once=True, on_leader=True, name="boot")
    assert task.once and repr(task) == "Task('boot', once, delay=0, on_leader=True)"
    assert repr(Task(lambda now, sender: None, delay=2.5, name="later")) == (
        "Task('later', once, delay=2.5)")


@pytest.mark.parametrize("kwargs, error", [
    ({"once": True, "every": 5}, r"give exactly one of every= \(seconds\) and cron= \(an "
                                 r"expression\), or once=True or delay= \(seconds\) alone"),
    ({"delay": 3, "cron": "* * * * *"}, "or once=True or delay="),
    ({"delay": -1}, r"delay must be seconds >= 0, got -1"),
    ({"delay": True}, r"delay must be seconds >= 0, got True"),
])
def test_a_one_time_task_is_refused_with_another_schedule_or_a_bad_delay(
        kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        Task(lambda now, sender: None, **kwargs)  # type: ignore[arg-type]
