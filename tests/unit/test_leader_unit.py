"""Leader-only tasks without a broker: the time keeper runs them only while its
``leader`` says so (a run due elsewhere is skipped, not caught up), the task's repr and
flag, which election a loop gets, the elector's consumer settings, and what its
rebalance callbacks log and report. The election itself, across processes on Kafka,
is tests/integration/test_leader_tasks.py's."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kasper_py import Config, Message, MessageProcessor, Sender, Task
from kasper_py.app import App, describe
from kasper_py.loop.leader import (
    SESSION_TIMEOUT_MS,
    AlwaysLeader,
    LeaderElector,
    election_for,
)
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.observability.observe import NoopObserver
from kasper_py.testing import ProcessorDriver
from kasper_py.time.keeper import TimeKeeper

CONFIG = Config(name="ldr", bootstrap_servers="127.0.0.1:1", input_topics=["in"])


class Quiet(MessageProcessor):
    def process(self, messages: list[Message], sender: Sender) -> None:
        pass


class Recorder(NoopObserver):
    """Keeps what the elector reports of the lead."""

    def __init__(self) -> None:
        self.leads: list[bool] = []

    def on_leader(self, leading: bool) -> None:
        self.leads.append(leading)


def nightly(now: int, sender: Sender) -> None:
    pass


def test_a_leader_task_runs_only_while_leading_and_a_run_due_elsewhere_is_skipped() -> None:
    """Two tasks every 10 s, one ``on_leader``: both run while the process leads; while
    it does not, only the other runs; once it leads again, the leader task's runs due
    meanwhile are not caught up (nothing is due 5 s later), it runs next on its grid."""
    clock = [1_000.0]
    runs: list[tuple[str, int]] = []
    tasks = [Task(lambda now, _s: runs.append(("leader", now)), every=10, on_leader=True),
             Task(lambda now, _s: runs.append(("every", now)), every=10)]
    leading = [True]
    keeper = TimeKeeper(CONFIG, lambda: clock[0], tasks, leading=lambda: leading[0])

    def at(seconds: float) -> list[tuple[str, int]]:
        clock[0] = 1_000.0 + seconds
        runs.clear()
        if keeper.due():
            keeper.fire_wall_clock(Sender())
        return sorted(runs)

    assert at(10) == [("every", 1_010_000), ("leader", 1_010_000)]
    leading[0] = False
    assert at(20) == [("every", 1_020_000)]
    assert at(30) == [("every", 1_030_000)]
    leading[0] = True
    assert at(35) == []
    assert at(40) == [("every", 1_040_000), ("leader", 1_040_000)]


def test_alone_a_process_leads_so_the_driver_runs_leader_tasks() -> None:
    """The testing driver elects nothing: its leader-only task runs every interval."""
    runs: list[int] = []
    driver = ProcessorDriver(Quiet, wall_clock_start=1_000.0,
                             tasks=[Task(lambda now, _s: runs.append(now), every=90,
                                         on_leader=True)])
    for _ in range(3):
        driver.advance_wall_clock(90)
    assert runs == [1_090_000, 1_180_000, 1_270_000]


def test_a_tasks_repr_and_flag_say_on_leader() -> None:
    """``on_leader`` shows in the repr, is a bool, and ``kasper app describe`` lists it."""
    assert repr(Task(nightly, every=60, on_leader=True)) == (
        "Task('nightly', every=60, on_leader=True)")
    assert repr(Task(nightly, cron="0 3 * * *")) == "Task('nightly', cron='0 3 * * *')"
    assert Task(nightly, every=1, on_leader=1).on_leader is True  # type: ignore[arg-type]
    app = App("ldr")
    app.processor("quiet", Quiet, inputs=["in"])
    app.task(nightly, every=60, on_leader=True, name="report")
    assert describe(app)["tasks"] == [{"name": "report", "on_leader": True}]


def test_a_leader_task_still_validates_its_schedule() -> None:
    """``on_leader`` changes where a task runs, not what a valid task is."""
    with pytest.raises(Exception, match=r"give exactly one of every="):
        Task(nightly, on_leader=True)


@pytest.mark.parametrize(("tasks", "kafka", "elects"), [
    ([Task(nightly, every=1, on_leader=True)], True, True),
    ([Task(nightly, every=1)], True, False),
    ([Task(nightly, every=1, on_leader=True)], False, False),
    ([], True, False),
])
def test_only_leader_tasks_on_kafka_start_an_election(
        tasks: list[Task], kafka: bool, elects: bool) -> None:
    """An elector only for a leader-only task on real clients; otherwise the process
    leads alone (the in-memory broker's processes never elect)."""
    election = election_for(CONFIG, tasks, NoopObserver(), kafka=kafka)
    assert isinstance(election, LeaderElector if elects else AlwaysLeader)
    if not elects:
        assert election.leading() is True


def test_the_electors_consumer_has_its_own_group_and_a_short_sticky_session() -> None:
    """The loop's client settings (here an override) under the election's own group,
    the classic protocol with cooperative-sticky and a 6 s session; never a static
    member, whatever the loop's consumer overrides say."""
    config = Config(name="ldr", bootstrap_servers="127.0.0.1:1", input_topics=["in"],
                    assignment="group", group_id="ldr-group",
                    client_overrides={"socket.keepalive.enable": True},
                    consumer_overrides={"group.instance.id": "fixed"})
    conf = LeaderElector(config, NoopObserver()).consumer_conf()
    assert {k: conf[k] for k in ("group.id", "group.protocol",
                                 "partition.assignment.strategy", "session.timeout.ms",
                                 "enable.auto.commit", "socket.keepalive.enable")} == {
        "group.id": "ldr-group.leader", "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": SESSION_TIMEOUT_MS, "enable.auto.commit": False,
        "socket.keepalive.enable": True}
    assert "group.instance.id" not in conf and "group.remote.assignor" not in conf


def test_holding_partition_0_is_the_lead_and_losing_it_ends_it() -> None:
    """The rebalance callbacks: partition 0 assigned elects (logged once, reported
    once), an empty assignment changes nothing, revoked or lost ends the lead."""
    observer = Recorder()
    elector = LeaderElector(CONFIG, observer)
    zero: Any = [TopicPartition(elector.topic, 0)]
    with capture_logs() as logs:
        elector._assigned(None, [])  # the rebalance callbacks
        assert not elector.leading()
        elector._assigned(None, zero)
        elector._assigned(None, zero)
        assert elector.leading()
        elector._revoked(None, zero)
        assert not elector.leading()
        elector._assigned(None, zero)
        elector._lost(None, zero)
    assert observer.leads == [True, False, True, False]
    assert [(e["event"], e.get("why")) for e in logs] == [
        ("kasper.leader_elected", None), ("kasper.leader_lost", "revoked"),
        ("kasper.leader_elected", None), ("kasper.leader_lost", "lost")]
    assert {e["group"] for e in logs} == {"ldr.leader"}


def test_the_leader_gauge_follows_the_lead() -> None:
    """``kasper_leader{processor}``: 1 while leading, 0 once the lead is lost."""
    observer = PrometheusObserver(CONFIG, registry=CollectorRegistry())
    try:
        assert observer.registry.get_sample_value("kasper_leader", {"processor": "ldr"}) is None
        observer.on_leader(True)
        assert observer.registry.get_sample_value("kasper_leader", {"processor": "ldr"}) == 1
        observer.on_leader(False)
        assert observer.registry.get_sample_value("kasper_leader", {"processor": "ldr"}) == 0
    finally:
        observer.close()
