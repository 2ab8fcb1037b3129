"""The loop's assignments (``kasper_py.loop.assignment``) on ``InMemoryBroker``: a static
partition set is refused while another loop runs it, announced before its tables are
restored and assigned where processing stands; a group member opens what the group
assigns, once, closes what it revokes, and is caught up only when the group is. No
server, no sleeping."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from kasper_py import Config, Message, MessageProcessor, Sender, TopicError
from kasper_py.exceptions import AlreadyRunningError
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.offsets import CommitNote
from kasper_py.kafka.ports import KafkaClients, Rebalance
from kasper_py.loop.assignment import (
    Assignment,
    GroupAssignment,
    StaticAssignment,
    assignment_for,
)
from kasper_py.loop.committer import OffsetCommitter, committer_for
from kasper_py.loop.partitions import Partitions
from kasper_py.loop.peers import PEER_WAIT_MARGIN
from kasper_py.loop.prefetch import Prefetcher
from kasper_py.loop.promotion import Promotions
from kasper_py.observability.observe import NoopObserver
from kasper_py.processor import ProcessorContext
from kasper_py.testing import InMemoryBroker
from kasper_py.turn import TurnEngine

GROUP = "assigned"
CONFIG = Config(name=GROUP, bootstrap_servers="in-memory", input_topics=["in"],
                batch_size=4)
GROUPED = dataclasses.replace(CONFIG, assignment="group")


class Started(NoopObserver):
    """Keeps what each ``on_start`` said was assigned."""

    def __init__(self) -> None:
        self.starts: list[list[tuple[str, int]]] = []

    def on_start(self, assigned: list[tuple[str, int]]) -> None:
        self.starts.append(list(assigned))


class Built:
    """A processor factory noting, per processor built, its partition and the latest
    commit note at that moment; and which processors were closed."""

    def __init__(self, broker: InMemoryBroker) -> None:
        self.broker = broker
        self.built: list[tuple[int, CommitNote | None]] = []
        self.closed: list[int] = []

    def __call__(self, context: ProcessorContext) -> MessageProcessor:
        commits = self.broker.commits(GROUP)
        self.built.append((context.partition,
                           CommitNote.decode(commits[-1].metadata) if commits else None))
        return Noting(context, self.closed)


class Noting(MessageProcessor):
    def __init__(self, context: ProcessorContext, closed: list[int]) -> None:
        super().__init__(context)
        self.closed = closed

    def process(self, messages: list[Message], sender: Sender) -> None:
        pass

    def close(self) -> None:
        self.closed.append(self.context.partition)


@dataclasses.dataclass
class Parts:
    assignment: Assignment
    clients: KafkaClients
    engine: TurnEngine
    committer: OffsetCommitter
    observer: Started
    built: Built


def parts(broker: InMemoryBroker, config: Config = CONFIG, *, consumer: Any = None,
          force: bool = False, promotions: Promotions | None = None) -> Parts:
    """The assignment of ``config`` with the parts it works with, as the loop builds
    them; ``consumer`` replaces the broker's (a group coordinator's stand-in);
    ``promotions`` the admin endpoint's requests."""
    clients = broker.clients(config)
    if consumer is not None:
        clients = dataclasses.replace(clients, consumer=consumer(clients.consumer))
    observer, built = Started(), Built(broker)
    prefetcher = Prefetcher(config, clients)
    committer = committer_for(config, clients, observer, holding=prefetcher.holding,
                              force=force)
    engine = TurnEngine(config, clients.producer, commit=committer.commit,
                        transactions=committer.transactions, wall_clock=clients.wall_clock)
    partitions = Partitions(config, clients, engine, factory=built, stores=(),
                            store_observer=observer.store_observer)
    assignment = assignment_for(config, clients, partitions=partitions, committer=committer,
                                prefetcher=prefetcher, observer=observer,
                                promotions=promotions)
    return Parts(assignment, clients, engine, committer, observer, built)


def broker_with(partitions: int = 2, records: int = 3, topics: tuple[str, ...] = ("in",)
                ) -> InMemoryBroker:
    broker = InMemoryBroker()
    for topic in topics:
        broker.create_topic(topic, partitions)
        for p in range(partitions):
            for n in range(records):
                broker.produce(topic, f"{topic}{p}-{n}", partition=p)
    return broker


def elsewhere(state: Any) -> str:
    return CommitNote(state, time.time(), "other-host", 4242, "all").encode()


# -- static --------------------------------------------------------------------------------


def test_the_kind_is_chosen_from_the_config() -> None:
    broker = broker_with()
    assert type(parts(broker).assignment) is StaticAssignment
    grouped = parts(broker, GROUPED, consumer=Coordinator).assignment
    assert type(grouped) is GroupAssignment
    assert (StaticAssignment.reads_ahead, GroupAssignment.reads_ahead) == (True, False)


def test_a_static_set_starts_where_its_processing_stands() -> None:
    """Every owned partition is opened and assigned at its committed offset (or where
    auto_offset_reset points), and the committer knows those offsets."""
    broker = broker_with()
    broker.clients(CONFIG).consumer.commit({("in", 0): 2}, elsewhere("stopped"))
    started = parts(broker)

    started.assignment.start(2)

    assert started.clients.consumer.assigned == [("in", 0), ("in", 1)]
    assert started.clients.consumer.positions() == {("in", 0): 2, ("in", 1): 0}
    assert sorted(started.engine.partitions) == [0, 1]
    assert started.committer.offsets.all() == {("in", 0): 2}
    assert started.observer.starts == [[("in", 0), ("in", 1)]]


def test_only_the_configured_partitions_are_taken() -> None:
    broker = broker_with(partitions=3)
    started = parts(broker, dataclasses.replace(CONFIG, input_partitions=[2]))
    started.assignment.start(3)
    assert started.clients.consumer.assigned == [("in", 2)]
    assert list(started.engine.partitions) == [2]


def test_the_running_note_is_announced_before_the_tables_are_restored() -> None:
    """Operators' tools see the partitions taken at once, not after a long restore:
    when the first processor is built, this loop's running note is already committed."""
    broker = broker_with()
    broker.clients(CONFIG).consumer.commit({("in", 0): 1, ("in", 1): 1}, elsewhere("stopped"))
    started = parts(broker)

    started.assignment.start(2)

    note = started.built.built[0][1]
    assert note is not None and note.state == "running" and note.is_mine()


def test_a_static_set_another_loop_runs_is_refused_untouched() -> None:
    """Refused: nothing assigned, opened, announced or built."""
    broker = broker_with()
    broker.clients(CONFIG).consumer.commit({("in", 0): 1}, elsewhere("running"))
    commits = broker.commits(GROUP)
    refused = parts(broker)

    with pytest.raises(AlreadyRunningError, match="another loop is running partitions"):
        refused.assignment.start(2)

    assert refused.clients.consumer.assigned == [] and refused.engine.partitions == {}
    assert refused.built.built == [] and broker.commits(GROUP) == commits
    parts(broker, force=True).assignment.start(2)  # forced: it starts


def test_the_start_is_logged_once_naming_the_partitions() -> None:
    broker = broker_with()
    with capture_logs() as logs:
        parts(broker).assignment.start(2)
        parts(broker, dataclasses.replace(CONFIG, processing_guarantee="exactly_once",
                                          name="eos")).assignment.start(2)
    started = [e for e in logs if e["event"] == "kasper.started"]
    assert len(started) == 2
    assert started[0]["partitions"] == [0, 1] and started[0]["topics"] == ["in"]
    assert "transactional_id" not in started[0]
    assert started[1]["transactional_id"] == "eos@all"


def test_measuring_before_the_start_assigns_the_own_partitions() -> None:
    """``has_consumed_all`` before the loop runs: the static set is assigned (at the
    committed offsets, nothing announced) so there is something to measure."""
    broker = broker_with()
    idle = parts(broker)
    assert idle.assignment.ensure_assigned()
    assert idle.clients.consumer.assigned == [("in", 0), ("in", 1)]
    assert broker.commits(GROUP) == []


def test_a_static_set_is_caught_up_when_its_partitions_are_consumed() -> None:
    assignment = parts(broker_with()).assignment
    assert assignment.caught_up(lambda: True)
    assert not assignment.caught_up(lambda: False)


# -- group ----------------------------------------------------------------------------------


class Coordinator:
    """The broker's consumer as a group member whose coordinator is the test: ``grant``
    and ``take`` run the rebalance callbacks as the client does inside ``consume``."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.on_assign: Rebalance | None = None
        self.on_revoke: Rebalance | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return list(self._consumer.assigned)

    def subscribe(self, on_assign: Rebalance, on_revoke: Rebalance) -> None:
        self.on_assign, self.on_revoke = on_assign, on_revoke

    def grant(self, keys: list[tuple[str, int]]) -> None:
        """Add ``keys`` (partitions of some topics only, maybe), started where
        ``on_assign`` says, else at their committed offsets."""
        assert self.on_assign is not None
        held = sorted({*self.assigned, *keys})
        self._consumer.assigned = held  # as the client says before the callback
        starts = self.on_assign(keys) or {}
        self._consumer.assign(sorted({p for _, p in keys}), starts)
        self._consumer.assigned = held

    def take(self, keys: list[tuple[str, int]]) -> None:
        """Take ``keys`` away; their pause is forgotten, as the real consumer forgets it."""
        assert self.on_revoke is not None
        self.on_revoke(keys)
        self._consumer.paused -= set(keys)
        self._consumer.assigned = [tp for tp in self.assigned if tp not in keys]


def member(broker: InMemoryBroker, config: Config = GROUPED, count: int = 2
           ) -> tuple[Parts, Coordinator]:
    joined = parts(broker, config, consumer=Coordinator)
    joined.assignment.start(count)
    coordinator = joined.clients.consumer
    assert isinstance(coordinator, Coordinator)
    return joined, coordinator


def test_a_member_joins_with_nothing_to_open_or_measure() -> None:
    broker = broker_with()
    with capture_logs() as logs:
        joined, coordinator = member(broker)
    assert coordinator.on_assign is not None and joined.engine.partitions == {}
    assert joined.observer.starts == [[]]
    assert not joined.assignment.ensure_assigned()
    [started] = [e for e in logs if e["event"] == "kasper.started"]
    assert started["assignment"] == "group" and started["topics"] == ["in"]


def test_partitions_the_group_assigns_are_opened_once() -> None:
    """A partition granted again (a rebalance that keeps it) is left as it is."""
    broker = broker_with()
    broker.clients(GROUPED).consumer.commit({("in", 1): 2})
    joined, coordinator = member(broker)

    coordinator.grant([("in", 1)])
    coordinator.grant([("in", 0), ("in", 1)])

    assert [p for p, _ in joined.built.built] == [1, 0]
    assert joined.committer.offsets.all() == {("in", 1): 2}
    assert joined.assignment.ensure_assigned()
    assert joined.observer.starts[-1] == [("in", 0), ("in", 1)]


TWO_TOPICS = dataclasses.replace(GROUPED, input_topics=["a", "b"])


def read(coordinator: Coordinator) -> list[str]:
    """The values one consume finds (at most 100)."""
    return sorted(r.value().decode() for r in coordinator.consume(100, 0.0))


@pytest.mark.parametrize("first, second", [("a", "b"), ("b", "a")])
def test_a_partition_waits_paused_for_its_peers_in_either_order(first: str, second: str
                                                                 ) -> None:
    """KIP-848 hands a joining member each partition as its previous owner releases it:
    partition 0 of one topic may come a rebalance before its peer of the other, either
    one first. The partition waits unopened, its topic paused (no record of it is read),
    then opens once, with its peer, and both are read from their committed offsets."""
    broker = broker_with(topics=("a", "b"))
    broker.clients(TWO_TOPICS).consumer.commit({("a", 0): 1})
    joined, coordinator = member(broker, TWO_TOPICS)

    with capture_logs() as logs:
        coordinator.grant([(first, 0)])
    assert joined.engine.partitions == {} and joined.built.built == []
    assert read(coordinator) == []
    [waiting] = [e for e in logs if e["event"] == "kasper.waiting_for_peers"]
    assert waiting["held"] == [f"{first}[0]"] and waiting["missing"] == [f"{second}[0]"]

    coordinator.grant([(second, 0)])
    assert [p for p, _ in joined.built.built] == [0] and list(joined.engine.partitions) == [0]
    assert read(coordinator) == ["a0-1", "a0-2", "b0-0", "b0-1", "b0-2"]
    assert joined.committer.offsets.all() == {("a", 0): 1}
    joined.assignment.after_consume(Batch())  # nothing waits: no error, ever
    coordinator.consume(100, 1e6)
    joined.assignment.after_consume(Batch())


def test_peers_that_never_come_fail_after_the_bound_naming_what_is_missing() -> None:
    """The bound is the longest the group lets the member holding the peers keep them
    (max.poll.interval.ms, else the 45 s session timeout) plus a margin; past it the
    loop stops with a TopicError saying what was assigned, what is missing and the
    assignor in force. Range is in force: it is not advised."""
    config = dataclasses.replace(TWO_TOPICS, consumer_overrides={"max.poll.interval.ms": 50_000})
    joined, coordinator = member(broker_with(topics=("a", "b")), config)
    coordinator.grant([("b", 0), ("b", 1), ("a", 1)])
    assert list(joined.engine.partitions) == [1]

    coordinator.consume(100, 50 + PEER_WAIT_MARGIN - 1)  # finding less: the clock moves on
    joined.assignment.after_consume(Batch())
    coordinator.consume(100, 2.0)
    with pytest.raises(TopicError) as refused:
        joined.assignment.after_consume(Batch())
    text = str(refused.value)
    assert "assigned [('b', 0)] to this member without their co-partitioned peers " \
           "[('a', 0)], which had not come after 65 s" in text
    assert "group.protocol=consumer, group.remote.assignor=range" in text
    assert "The range assignor is in force" in text and "Use the range" not in text


@pytest.mark.parametrize("overrides, advice", [
    ({"group.remote.assignor": "uniform"}, "group.remote.assignor=range"),
    ({"group.protocol": "classic", "partition.assignment.strategy": "roundrobin"},
     "partition.assignment.strategy=range"),
    ({}, None),
    ({"group.protocol": "classic"}, None),  # eager range, group mode's classic default
])
def test_the_range_assignor_is_advised_only_when_another_is_in_force(
        overrides: dict[str, str], advice: str | None) -> None:
    config = dataclasses.replace(TWO_TOPICS, consumer_overrides=overrides)
    joined, coordinator = member(broker_with(topics=("a", "b")), config)
    coordinator.grant([("a", 0)])
    coordinator.consume(100, 1e4)
    with pytest.raises(TopicError) as refused:
        joined.assignment.after_consume(Batch())
    text = str(refused.value)
    if advice is None:
        assert "Use the range" not in text and "range assignor is in force" in text
    else:
        assert f"Use the range assignor ({advice}" in text
        assert f"{advice.split('=')[0]}={dict(overrides).popitem()[1]}" in text


def test_a_waiting_partition_revoked_is_forgotten() -> None:
    """Revoked while it waits: it waits no more (no error later), its pause is lifted,
    and nothing was opened or closed."""
    joined, coordinator = member(broker_with(topics=("a", "b")), TWO_TOPICS)
    coordinator.grant([("a", 0)])
    coordinator.take([("a", 0)])
    coordinator.consume(100, 1e4)
    joined.assignment.after_consume(Batch())
    assert coordinator.paused == set() and joined.built.built == [] == joined.built.closed


def test_a_partition_left_without_a_peer_closes_and_waits_for_it_again() -> None:
    """The group takes b[0] away and leaves a[0]: partition 0 closes (its processor
    cannot run on one side), a[0] is paused; b[0] back, partition 0 opens again and
    a[0] is read again from its committed offset, not from where reading stopped."""
    broker = broker_with(topics=("a", "b"))
    joined, coordinator = member(broker, TWO_TOPICS)
    coordinator.grant([("a", 0), ("b", 0)])
    assert len(read(coordinator)) == 6
    broker.clients(TWO_TOPICS).consumer.commit({("a", 0): 1, ("b", 0): 3})  # a turn's

    coordinator.take([("b", 0)])
    assert joined.built.closed == [0] and joined.engine.partitions == {}
    assert coordinator.paused == {("a", 0)} and read(coordinator) == []

    coordinator.grant([("b", 0)])
    assert [p for p, _ in joined.built.built] == [0, 0]
    assert read(coordinator) == ["a0-1", "a0-2"]


def test_revoked_partitions_close_and_the_others_stay() -> None:
    """The revoked partition's processor closes and its offsets are forgotten; the
    partition kept is untouched."""
    broker = broker_with()
    broker.clients(GROUPED).consumer.commit({("in", 0): 1, ("in", 1): 1})
    joined, coordinator = member(broker)
    coordinator.grant([("in", 0), ("in", 1)])

    with capture_logs() as logs:
        coordinator.take([("in", 1)])

    assert joined.built.closed == [1] and list(joined.engine.partitions) == [0]
    assert joined.committer.offsets.all() == {("in", 0): 1}
    assert [e["partitions"] for e in logs if e["event"] == "kasper.partitions_revoked"] == [[1]]


def test_a_turn_near_the_poll_budget_is_reported() -> None:
    """A member must consume again within max.poll.interval.ms: a turn over half of it
    is logged with a hint; a static set has no budget."""
    config = dataclasses.replace(GROUPED, consumer_overrides={"max.poll.interval.ms": 10_000})
    joined, _ = member(broker_with(), config)
    with capture_logs() as logs:
        joined.assignment.after_turn({"process": 4.0, "commit": 0.9})
        joined.assignment.after_turn({"process": 5.0, "commit": 0.1})
        parts(broker_with()).assignment.after_turn({"process": 1e6})
    [warning] = [e for e in logs if e["event"] == "kasper.turn_near_poll_budget"]
    assert warning["turn_seconds"] == 5.1 and warning["budget_seconds"] == 10.0


def test_a_member_is_caught_up_only_when_the_group_holds_no_lag() -> None:
    """Its own partitions consumed is not enough: partition 1, held by no one and not
    committed to its end, keeps it waiting; once the group's offsets reach every end,
    it is caught up."""
    broker = broker_with(records=3)
    joined, coordinator = member(broker)
    coordinator.grant([("in", 0)])
    joined.committer.commit({("in", 0): 3})
    assert not joined.assignment.caught_up(lambda: False)  # its own: not yet

    with capture_logs() as logs:
        assert not joined.assignment.caught_up(lambda: True)
    [waiting] = [e for e in logs if e["event"] == "kasper.waiting_for_group"]
    assert waiting["partitions"] == ["in[1]"] and waiting["lag"] == 3

    broker.clients(GROUPED).consumer.commit({("in", 1): 3})
    assert not joined.assignment.caught_up(lambda: True)  # read again a second later
    coordinator.consume(100, 1.0)  # finding too little moves the broker's clock on 1 s
    assert joined.assignment.caught_up(lambda: True)
