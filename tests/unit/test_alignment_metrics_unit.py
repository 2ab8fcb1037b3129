"""The alignment of co-partitioned inputs, as Prometheus shows it (``kasper_alignment_*``):
the seconds a partition number waits for an input, by reason, the enforced processing
that ends a ``max_task_idle`` wait, the records held for the next batch and the
topic-partitions whose fetch is held back. Read as a scrape would, at every idle poll
and turn of the real loop on the in-memory broker, and from the alignment's report on
a scripted consume; one input topic exports none of them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.kafka.alignment import TimestampAlignment
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.observability.observe import TurnStats
from kasper_py.testing import InMemoryBroker
from tests.unit.test_alignment_unit import Script, UsersLate, clicks, collector, raw


class Scraped(PrometheusObserver):
    """A loop's Prometheus observer that reads its ``kasper_alignment_*`` samples, as a
    scrape would show them, at each idle poll (a batch with nothing released) and turn."""

    def __init__(self, config: Config) -> None:
        super().__init__(config, registry=CollectorRegistry())
        self.seen: list[tuple[str, dict[str, float]]] = []

    def on_idle(self) -> None:
        super().on_idle()
        self.seen.append(("idle", self.alignment()))

    def on_turn(self, stats: TurnStats) -> None:
        super().on_turn(stats)
        self.seen.append(("turn", self.alignment()))

    def alignment(self) -> dict[str, float]:
        """``{'name{label=value,...}': value}`` of the alignment's samples, the
        processor label left out."""
        samples = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.startswith("kasper_alignment_"):
                    labels = ",".join(f"{k}={v}" for k, v in sample.labels.items()
                                      if k != "processor")
                    samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples


class Forward(MessageProcessor):
    """Each message's value to ``out``, in the batch's order."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send("out", message.value, partition=message.partition)


def aligned_config(**fields: Any) -> Config:
    return Config(name="joined", bootstrap_servers="in-memory",
                  input_topics=["users", "clicks"], value_serde="str", max_latency=None,
                  batch_wait=1.0, **fields)


def broker_with_clicks(users: int) -> InMemoryBroker:
    """users and clicks of one partition: 5 clicks stamped 100 .. 500 and ``users``
    users records stamped 0, 500, ..."""
    broker = InMemoryBroker()
    for topic in ("users", "clicks", "out"):
        broker.create_topic(topic, 1)
    for j in range(users):
        broker.produce("users", f"u{j}", key="k", partition=0, timestamp=500 * j)
    for j in range(5):
        broker.produce("clicks", f"c{j}", key="k", partition=0, timestamp=100 + 100 * j)
    return broker


def test_an_idle_wait_counts_its_seconds_then_one_enforced_processing() -> None:
    """users[0] is empty (caught up), max_task_idle 2.5 s, batch_wait 1 s: the clicks
    are held three batches, each scrape showing them held and the wait's seconds so far
    (reason max_task_idle); the fourth batch, 3 s after the wait was found, goes without
    users: one enforced processing, the wait's 3 s (what the log line says), nothing
    held, and every click committed."""
    broker = broker_with_clicks(users=0)
    config = aligned_config(max_task_idle=2.5)
    observer = Scraped(config)
    with capture_logs() as logs:
        TopicProcessor(config, Forward, clients=broker.clients(config),
                       observer=observer).run_loop(until_caught_up=True)
    observer.close()

    held = "kasper_alignment_held_records{topic=clicks,partition=0}"
    wait = "kasper_alignment_wait_seconds_total{topic=users,partition=0,reason=max_task_idle}"
    enforced = "kasper_alignment_enforced_total{topic=%s,partition=0}"
    back = "kasper_alignment_held_back_partitions{}"
    never = {enforced % "clicks": 0, back: 0}
    assert observer.seen == [
        ("idle", {**never, held: 5, wait: 0.0, enforced % "users": 0}),
        ("idle", {**never, held: 5, wait: 1.0, enforced % "users": 0}),
        ("idle", {**never, held: 5, wait: 2.0, enforced % "users": 0}),
        ("turn", {**never, held: 0, wait: 3.0, enforced % "users": 1}),
    ]
    [ended] = [e for e in logs if e["event"] == "kasper.alignment_enforced"]
    assert ended["waited"] == observer.seen[-1][1][wait]
    assert [m.value.decode() for m in broker.read("out", 0)] == [f"c{j}" for j in range(5)]
    assert broker.committed("joined") == {("clicks", 0): 5}


def test_a_held_back_partition_shows_its_held_records_and_the_wait_for_the_broker() -> None:
    """Batches of 3; users[0]'s two records are on the broker but not fetched for the
    first four consumes. The clicks read meanwhile make a batch's worth held: clicks[0]
    is held back (one partition), its 3 records held, and the wait counts as
    records_on_broker, a batch_wait's second per empty batch. Once users arrive the
    held clicks go with the users record before them (the other, stamped past them,
    held for a batch), the fetch reads on, nothing is enforced and nothing stays held."""
    broker = broker_with_clicks(users=2)
    config = aligned_config(max_task_idle=0.0, batch_size=3)
    clients = broker.clients(config)
    clients.consumer = UsersLate(clients.consumer, late=4)
    observer = Scraped(config)
    TopicProcessor(config, Forward, clients=clients, observer=observer).run_loop(
        until_caught_up=True)
    observer.close()

    clicks_held = "kasper_alignment_held_records{topic=clicks,partition=0}"
    users_held = "kasper_alignment_held_records{topic=users,partition=0}"
    wait = ("kasper_alignment_wait_seconds_total{topic=users,partition=0,"
            "reason=records_on_broker}")
    enforced = "kasper_alignment_enforced_total{topic=%s,partition=0}"
    back = "kasper_alignment_held_back_partitions{}"
    never = {enforced % "clicks": 0, enforced % "users": 0}
    assert observer.seen == [
        *[("idle", {**never, clicks_held: 3, wait: float(n), back: 1}) for n in range(4)],
        # users fetched: the 3 clicks and users' first go, its second (stamped 500) waits
        ("turn", {**never, clicks_held: 0, users_held: 1, wait: 4.0, back: 0}),
        *[("turn", {**never, clicks_held: 0, users_held: 0, wait: 4.0, back: 0})] * 2,
    ]
    assert broker.committed("joined") == {("clicks", 0): 5, ("users", 0): 2}


def test_a_report_counts_each_reason_and_forgets_revoked_partitions() -> None:
    """On a scripted consume: a wait on an unknown lag, then on records known on the
    broker, counts each batch_wait under the reason the cut found; partition 1, whose
    users are caught up (max_task_idle 0), holds nothing and waits for nothing. Revoked
    partitions leave the held counts and the held-back set; counters stay."""
    script = Script([clicks(0, range(3)) + clicks(1, range(1))])
    script.lag[("users", 0)] = None
    gathering = collector(script, most=3)
    alignment = gathering._alignment
    assert isinstance(alignment, TimestampAlignment)
    for lag in (None, None, 4, 4):
        script.lag[("users", 0)] = lag
        gathering.gather()
        gathering.take()
    report = alignment.report()
    assert dict(report.waited) == {(("users", 0), "lag_unknown"): 2.0,
                                   (("users", 0), "records_on_broker"): 1.0}
    assert dict(report.held) == {("clicks", 0): 3, ("clicks", 1): 0}
    assert report.held_back == {("clicks", 0)} and dict(report.enforced) == {}
    script.calls.append([raw("users", 0, 0, 5000)])
    script.lag[("users", 0)] = 0
    gathering.gather()
    assert len(gathering.take()) == 3  # the clicks; users' newer record is held
    report = alignment.report()
    assert report.waited[("users", 0), "records_on_broker"] == 2.0
    assert dict(report.held) == {("clicks", 0): 0, ("clicks", 1): 0, ("users", 0): 1}
    gathering.drop({("users", 0), ("clicks", 0)})
    assert dict(alignment.report().held) == {("clicks", 1): 0}
    assert alignment.report().waited == report.waited


def test_one_input_topic_exports_no_alignment_metrics() -> None:
    """A loop reading one topic has no alignment, so its scrape has no
    kasper_alignment_* family at all (nor does one with max_task_idle none)."""
    broker = broker_with_clicks(users=1)
    for config in (Config(name="one", bootstrap_servers="in-memory", input_topics=["clicks"]),
                   aligned_config(max_task_idle=None)):
        observer = PrometheusObserver(config, registry=CollectorRegistry())
        TopicProcessor(config, Forward, clients=broker.clients(config),
                       observer=observer).run_loop(until_caught_up=True)
        observer.close()
        assert b"kasper_alignment_" not in generate_latest(observer.registry)
