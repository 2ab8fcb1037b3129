"""Exactly-once (``processing_guarantee="exactly_once"``) on ``InMemoryBroker``: crashes
at every step boundary, failures inside a turn's transaction, a second process fencing
the first, transient aborts run again, and the broker's transactions as a Kafka's. The
at-least-once counterparts are in test_memory_broker.py, whose helpers these reuse."""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from test_memory_broker import FAILURES as AT_LEAST_ONCE_FAILURES
from test_memory_broker import (
    GROUP,
    add_input,
    assert_every_input_has_output,
    assert_never_backwards,
    broker_with_input,
    coordinates,
    crash_in_turn_3,
    end_offsets,
)
from test_memory_broker import run as any_run
from test_memory_broker import start as any_start

from kasper_py import (
    CommitError,
    Config,
    ProduceError,
    StoreError,
    TopicProcessor,
)
from kasper_py.exceptions import FencedError, KasperError, SimulatedCrash
from kasper_py.loop import turns as loop_turns
from kasper_py.message import OutgoingMessage
from kasper_py.observability.observe import NoopObserver
from kasper_py.stores.base import StoreSpec
from kasper_py.testing import Faults, InMemoryBroker
from kasper_py.testing.faults import CRASH_STEPS

EOS = Config(name=GROUP, bootstrap_servers="in-memory", input_topics=["in"],
             key_serde="str", value_serde="str", batch_size=4,
             processing_guarantee="exactly_once")
OTHER = dataclasses.replace(EOS, name="other")


def start(broker: InMemoryBroker, spec: StoreSpec, turns: list[set[str]] | None = None,
          **options: Any) -> TopicProcessor:
    """One exactly-once process, not yet running (``test_memory_broker.start``)."""
    return any_start(broker, spec, turns, config=EOS, **options)


def run(broker: InMemoryBroker, spec: StoreSpec, turns: list[set[str]] | None = None,
        **options: Any) -> None:
    """One exactly-once process run until caught up, then closed."""
    any_run(broker, spec, turns, config=EOS, **options)


class Transactions(NoopObserver):
    """Keeps how each transaction ended, as the metrics count them."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def on_transaction(self, result: str, seconds: float) -> None:
        self.ended.append(result)


def assert_exactly_once(broker: InMemoryBroker) -> None:
    """Every input's output is in the log once, and all input is committed."""
    outputs = assert_every_input_has_output(broker)
    assert {c: n for c, n in outputs.items() if n > 1} == {}
    assert_never_backwards(broker)
    assert broker.committed(GROUP) == end_offsets(broker)


def exact_counts(broker: InMemoryBroker) -> collections.Counter[str]:
    return collections.Counter(m.key.decode() for m in broker.read("in"))


# -- crashes ----------------------------------------------------------------------------


@pytest.mark.parametrize("effectively_once", [False, True], ids=["plain", "effectively-once"])
@pytest.mark.parametrize("step", CRASH_STEPS)
def test_crash_at_each_step_then_restart_outputs_once(step: str, effectively_once: bool) -> None:
    """A process killed at any step boundary of turn 3 and restarted on the same broker:
    the crashed turn's outputs show only if its transaction committed, and in the end
    every input's output is in the log exactly once, with all input committed. A plain
    store, flushed before the commit, counts a crashed uncommitted turn twice; an
    effectively-once store (flushed after the commit) is exact."""
    broker = broker_with_input()
    spec = broker.store("counts", effectively_once=effectively_once)
    crashed_turn = crash_in_turn_3(broker, spec, step, run)
    committed = step == "after_commit" or (
        effectively_once and step in ("after_flush", "after_produce"))
    shown = crashed_turn & {m.value.decode() for m in broker.read("out")}
    assert shown == (crashed_turn if committed else set())

    run(broker, spec)

    assert_exactly_once(broker)
    key_of = {coordinates(m): m.key.decode() for m in broker.read("in")}
    replayed = not effectively_once and step in ("after_flush", "after_produce")
    extra = collections.Counter(key_of[c] for c in crashed_turn) if replayed else {}
    assert broker.table("counts") == exact_counts(broker) + collections.Counter(extra)


# -- failures inside the transaction ------------------------------------------------------


FAILURES: dict[str, tuple[Callable[[Faults], None], type[KasperError], str]] = {
    "produce": AT_LEAST_ONCE_FAILURES["produce"],
    "delivery": AT_LEAST_ONCE_FAILURES["delivery"],
    # the restarted loop's first commit is its start note's; the second is a turn's
    "commit": (lambda f: f.fail_commit(nth=2), CommitError,
               "exactly-once: committing the transaction failed: injected by InMemoryBroker"),
}


@pytest.mark.parametrize("effectively_once", [True, False])
@pytest.mark.parametrize("failure", FAILURES)
def test_a_failure_inside_the_transaction_shows_nothing(failure: str,
                                                        effectively_once: bool) -> None:
    """The turn's second output refused or its delivery failed (the first was handed
    over, or acked into the transaction), or the transaction's commit failing: the loop
    stops with that error, nothing of the batch is in the output log and the committed
    offsets do not move (without an effectively-once table, they were added to the
    transaction before the acks were in); a restart outputs every input once."""
    arm, error, text = FAILURES[failure]
    broker = broker_with_input(10)
    spec = broker.store("counts", effectively_once=effectively_once)
    run(broker, spec)
    before = broker.read("out"), broker.committed(GROUP)
    add_input(broker, 10)
    arm(broker.faults)
    with pytest.raises(error) as info:
        run(broker, spec)
    assert re.search(text, str(info.value)), str(info.value)
    assert re.search(r"\[batch not committed: in\[\d\] offsets \d+\.\.\d+", str(info.value))
    assert not info.value.retriable
    assert (broker.read("out"), broker.committed(GROUP)) == before
    assert broker.faults.armed() == []

    run(broker, spec)

    assert_exactly_once(broker)
    if effectively_once:  # else a plain external table: written again on the replay
        assert broker.table("counts") == exact_counts(broker)


def test_a_store_behind_the_committed_offsets_is_caught_up_on_restart() -> None:
    """With an effectively-once store the transaction commits before the store's flush,
    so a failed flush leaves the store behind the committed offsets: the restart
    starts from the store's offsets (assign lowers to them), the counts are exact and
    only that turn's outputs show twice."""
    broker = broker_with_input(10)
    spec = broker.store("counts", effectively_once=True)
    run(broker, spec)
    add_input(broker, 10)
    broker.faults.fail_store_write("counts")
    turns: list[set[str]] = []
    transactions = Transactions()
    with pytest.raises(StoreError):
        run(broker, spec, turns, observer=transactions)
    assert "aborted" not in transactions.ended  # the failed turn's transaction committed
    failed_turn = turns[-1]
    assert failed_turn <= {m.value.decode() for m in broker.read("out")}

    run(broker, spec)

    outputs = assert_every_input_has_output(broker)
    duplicated = {c for c, n in outputs.items() if n > 1}
    assert duplicated and duplicated <= failed_turn
    assert broker.table("counts") == exact_counts(broker)
    assert broker.committed(GROUP) == end_offsets(broker)


# -- fencing ------------------------------------------------------------------------------


def test_a_second_process_fences_the_first() -> None:
    """Process A runs; process B with the same config starts on the same broker (taking
    the transactional id over) and processes new input. A's next turn raises
    FencedError naming the partitions, A commits nothing more, and every input's
    output is in the log once."""
    broker = broker_with_input(10)
    spec = broker.store("counts", effectively_once=True)
    first = start(broker, spec)
    first.run_loop(until_caught_up=True)
    add_input(broker, 10)
    run(broker, spec)
    commits = broker.commits(GROUP)

    with pytest.raises(FencedError) as info:
        first.run_loop(until_caught_up=True)

    message = str(info.value)
    assert "was fenced: another loop took over partitions all of in" in message
    assert "transactional id 'counter@all'" in message
    assert "batch not committed: in[" in message
    assert broker.commits(GROUP) == commits
    assert_exactly_once(broker)
    assert broker.table("counts") == exact_counts(broker)


@pytest.mark.parametrize("step", ["before_process", "after_produce"])
def test_a_process_taken_over_inside_a_turn_commits_nothing(step: str) -> None:
    """B takes the transactional id over and runs to the end while A is inside turn 2,
    its transaction open (before processing, or with its outputs acked into it): A's
    produce or commit raises FencedError, its open transaction never shows, and B's
    outputs are the only ones."""
    broker = broker_with_input(20)
    spec = broker.store("counts")
    reached: list[str] = []
    commits: list[object] = []

    def take_over(at: str) -> None:
        reached.append(at)
        if at == step and reached.count(step) == 2:
            run(broker, spec)
            commits.extend(broker.commits(GROUP))

    with pytest.raises(FencedError, match="another loop took over partitions all of in"):
        start(broker, spec, on_step=take_over).run_loop(until_caught_up=True)

    assert commits and broker.commits(GROUP) == commits
    assert_exactly_once(broker)


# -- transient aborts ---------------------------------------------------------------------


@pytest.mark.parametrize("effectively_once", [True, False])
def test_a_retriable_commit_failure_runs_the_turn_again(monkeypatch: pytest.MonkeyPatch,
                                                        effectively_once: bool) -> None:
    """Transaction commits that fail with a transient error are aborted and the turn
    runs again on rebuilt processors (the factory is called again for every partition):
    every input's output is in the log once, the offsets committed are the last
    input's, and the counts are exact (with a plain table, whose offsets were staged
    in each aborted transaction: the offsets and outputs still once)."""
    monkeypatch.setattr(loop_turns, "_RETRY_PAUSE", 0.0)
    broker = broker_with_input(10)
    spec = broker.store("counts", effectively_once=effectively_once)
    broker.faults.fail_commit(times=2, retriable=True)
    builds: list[int] = []
    transactions = Transactions()

    run(broker, spec, builds=builds, observer=transactions)

    assert transactions.ended.count("aborted") == 2  # the two failed commits, no more
    assert broker.faults.armed() == []
    assert sorted(builds) == [0, 0, 0, 1, 1, 1]
    assert_exactly_once(broker)
    ends = collections.Counter(m.partition for m in broker.read("in"))
    assert broker.committed(GROUP) == {("in", p): end for p, end in ends.items()}
    if effectively_once:  # a plain table is written again by each retry
        assert broker.table("counts") == exact_counts(broker)


def test_a_turn_aborted_six_times_stops_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transient abort is run again five times at most; the sixth stops the loop with
    the commit's error, nothing of the batch shown or committed."""
    monkeypatch.setattr(loop_turns, "_RETRY_PAUSE", 0.0)
    broker = broker_with_input(10)
    spec = broker.store("counts", effectively_once=True)
    broker.faults.fail_commit(times=6, retriable=True)
    builds: list[int] = []

    with pytest.raises(CommitError, match="committing the transaction failed") as info:
        run(broker, spec, builds=builds)

    assert info.value.retriable
    assert len(builds) == 2 * 6
    assert broker.read("out") == []
    assert broker.committed(GROUP) == {}
    assert broker.table("counts") == {}


# -- the broker's transactions as a Kafka's -------------------------------------------------


def test_transactions_commit_outputs_with_offsets_or_nothing() -> None:
    """Records produced in a transaction are appended, with the offsets and their note,
    only when it commits; an aborted one's never are; producing outside a transaction
    or with an at-least-once config is refused, worded like the real producer."""
    broker = broker_with_input(0)
    clients = broker.clients(EOS)
    producer, group = clients.producer, clients.consumer.group_metadata()
    producer.init_transactions()
    producer.begin()
    producer.produce([OutgoingMessage("out", b"aborted", b"k0").record()])
    producer.add_offsets({("in", 1): 7}, "aborted", group)
    producer.wait_for_acks()
    producer.abort()
    producer.abort()  # nothing open: does nothing
    producer.begin()
    producer.produce([OutgoingMessage("out", b"committed", b"k0").record()])
    producer.add_offsets({("in", 0): 3}, "note", group)  # while the acks arrive
    producer.wait_for_acks()
    assert broker.read("out") == [] and broker.commits(GROUP) == []
    producer.commit({}, None, group)

    assert [m.value for m in broker.read("out")] == [b"committed"]
    assert broker.commits(GROUP) == [("in", 0, 3, "note")]
    assert clients.consumer.notes([("in", 0), ("in", 1)]) == {("in", 0): "note", ("in", 1): None}
    with pytest.raises(ProduceError, match="cannot produce to 'out': Local: Erroneous state"):
        producer.produce([OutgoingMessage("out", b"outside").record()])
    plain = broker.clients(dataclasses.replace(EOS, processing_guarantee="at_least_once"))
    with pytest.raises(CommitError, match="Functionality not configured"):
        plain.producer.init_transactions()


def test_a_newer_producer_fences_the_older_and_aborts_its_transaction() -> None:
    """init_transactions with the same transactional id fences the older producer: its
    open transaction never commits, and its later calls raise FencedError worded like
    OutputProducer's (abort still never raises); another id is not fenced."""
    broker = broker_with_input(0)
    older, newer, other = (broker.clients(c) for c in (EOS, EOS, OTHER))
    for clients in (older, other):
        clients.producer.init_transactions()
        clients.producer.begin()
        clients.producer.produce([OutgoingMessage("out", b"open", b"k0").record()])
        clients.producer.wait_for_acks()
    newer.producer.init_transactions()

    fenced = (r"exactly-once: transactional id 'counter@all' was taken over by a newer "
              r"process \(Local: This instance has been fenced by a newer instance\)")
    with pytest.raises(FencedError, match=fenced):
        older.producer.commit({("in", 0): 1}, None, older.consumer.group_metadata())
    older.producer.abort()
    for call in (older.producer.begin,
                 lambda: older.producer.produce([OutgoingMessage("out", b"late").record()])):
        with pytest.raises(FencedError, match=fenced):
            call()
    other.producer.commit({("in", 0): 1}, None, other.consumer.group_metadata())
    assert [m.value for m in broker.read("out")] == [b"open"]
    assert broker.committed(GROUP) == {}
    assert broker.committed("other") == {("in", 0): 1}


def test_a_crash_loses_the_open_transaction() -> None:
    """A process killed with its transaction open (outputs acked into it) leaves
    nothing: its successor's commit holds its own records only."""
    broker = broker_with_input(0)
    crashed = broker.clients(EOS)
    crashed.producer.init_transactions()
    crashed.producer.begin()
    crashed.producer.produce([OutgoingMessage("out", b"lost", b"k0").record()])
    crashed.producer.wait_for_acks()
    broker.faults.crash_at("after_produce")
    with pytest.raises(SimulatedCrash):
        crashed.on_step("after_produce")
    successor = broker.clients(EOS)
    successor.producer.init_transactions()
    successor.producer.begin()
    successor.producer.commit({("in", 1): 0}, None, successor.consumer.group_metadata())
    assert broker.read("out") == []
    assert broker.committed(GROUP) == {("in", 1): 0}


def test_consumer_starts_at_the_lowered_offsets() -> None:
    """assign lowers the committed offsets to ``below`` where lower (as InputConsumer
    does) and returns them."""
    broker = broker_with_input(10)
    consumer = broker.clients(EOS).consumer
    consumer.commit({("in", 0): 3, ("in", 1): 5})
    assert consumer.assign([0, 1], below={("in", 0): 1, ("in", 1): 6}) == {
        ("in", 0): 1, ("in", 1): 5}
    assert consumer.positions() == {("in", 0): 1, ("in", 1): 5}


def test_a_failed_first_store_write_after_the_commit_loses_no_state() -> None:
    """The store's very first write fails after its turn's transaction committed: the
    store had recorded where the loop started, so the restart processes that batch
    again and the counts are exact (its outputs show twice, each time whole)."""
    broker = broker_with_input(10)
    spec = broker.store("counts", effectively_once=True)
    armed: list[str] = []

    def arm_once(step: str) -> None:  # after the start, at the first turn
        if step == "before_process" and not armed:
            armed.append(step)
            broker.faults.fail_store_write("counts")

    with pytest.raises(StoreError) as failed:
        run(broker, spec, on_step=arm_once)
    assert "was committed; the store is behind it" in "".join(failed.value.__notes__)
    assert broker.committed(GROUP) != {}
    run(broker, spec)
    assert broker.table("counts") == exact_counts(broker)
    assert_every_input_has_output(broker)
    assert broker.committed(GROUP) == end_offsets(broker)
