"""The loop's committers (``kasper_py.loop.committer``) on ``InMemoryBroker``: what each
commits and when, the notes it writes, the one-runner check and fencing. No server,
no sleeping."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from kasper_py import CommitError, Config, OffsetError
from kasper_py.exceptions import AlreadyRunningError, FencedError
from kasper_py.kafka.offsets import CommitNote
from kasper_py.kafka.ports import KafkaClients
from kasper_py.loop import committer as committer_module
from kasper_py.loop.committer import (
    OffsetCommitter,
    TransactionCommitter,
    check_not_running,
    committer_for,
)
from kasper_py.observability.observe import NoopObserver
from kasper_py.testing import InMemoryBroker

GROUP = "committer"
CONFIG = Config(name=GROUP, bootstrap_servers="in-memory", input_topics=["in"],
                batch_size=4)
EOS = dataclasses.replace(CONFIG, processing_guarantee="exactly_once")
IN0 = ("in", 0)


class Transactions(NoopObserver):
    """Keeps how each transaction ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def on_transaction(self, result: str, seconds: float) -> None:
        self.ended.append(result)


def broker_with(records: int = 6) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("in")
    for n in range(records):
        broker.produce("in", f"v{n}")
    return broker


def assigned_clients(broker: InMemoryBroker, config: Config = CONFIG) -> KafkaClients:
    clients = broker.clients(config)
    clients.consumer.assign([0])
    return clients


def committer(clients: KafkaClients, config: Config = CONFIG, *, holding: bool = True,
              observer: NoopObserver | None = None, force: bool = False,
              endpoint: str | None = None) -> OffsetCommitter:
    return committer_for(config, clients, observer or NoopObserver(),
                         holding=lambda: holding, endpoint=lambda: endpoint, force=force)


def notes(broker: InMemoryBroker) -> list[CommitNote]:
    decoded = [CommitNote.decode(c.metadata) for c in broker.commits(GROUP)]
    return [note for note in decoded if note is not None]


def elsewhere(state: Any = "running", partitions: str | None = "all", *,
              at: float | None = None) -> CommitNote:
    """A note of a process on another host (never taken for a killed local one)."""
    return CommitNote(state, time.time() if at is None else at, "other-host", 4242,
                      partitions)


# -- at-least-once ------------------------------------------------------------------------


def test_the_mode_is_chosen_from_the_config() -> None:
    """At-least-once commits through the consumer; exactly-once through transactions."""
    broker = broker_with()
    plain = committer(assigned_clients(broker))
    eos = committer(assigned_clients(broker, EOS), EOS)
    assert type(plain) is OffsetCommitter and plain.transactions is None
    assert type(eos) is TransactionCommitter and eos.transactions is not None


def test_a_turn_commits_its_offsets_with_a_running_note() -> None:
    """The engine's commit lands in the group with this loop's running note, naming its
    partition set and query endpoint."""
    broker = broker_with()
    offsets = committer(assigned_clients(broker), endpoint="http://127.0.0.1:9")

    offsets.commit({IN0: 4})

    assert broker.committed(GROUP) == {IN0: 4}
    note = notes(broker)[-1]
    assert (note.state, note.partitions, note.endpoint) == ("running", "all",
                                                           "http://127.0.0.1:9")
    assert note.is_mine()
    assert offsets.offsets.committed(*IN0) == 4


def test_a_turn_of_timers_alone_commits_nothing() -> None:
    """No input, nothing to commit: the group sees no commit at all."""
    broker = broker_with()
    committer(assigned_clients(broker)).commit({})
    assert broker.commits(GROUP) == []


def test_an_offset_going_backwards_is_refused_and_not_committed() -> None:
    broker = broker_with()
    offsets = committer(assigned_clients(broker))
    offsets.commit({IN0: 4})
    with pytest.raises(OffsetError, match=r"refusing to commit in\[0\] offset 2: 4 was"):
        offsets.commit({IN0: 2})
    assert broker.committed(GROUP) == {IN0: 4}


def test_with_nothing_read_ahead_the_commit_moves_to_the_consumer_position() -> None:
    """Past transaction markers: with no record held for the next batch, the consumer's
    position is what is committed; with records read ahead, never past them."""
    broker = broker_with(6)
    clients = assigned_clients(broker)
    clients.consumer.consume(6, 0)  # the position is now 6
    committer(clients, holding=True).commit({IN0: 4})
    assert broker.committed(GROUP) == {IN0: 4}
    committer(clients, holding=False).commit({IN0: 5})
    assert broker.committed(GROUP) == {IN0: 6}


def test_a_heartbeat_recommits_only_once_heartbeat_seconds_passed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle, the offsets are re-committed with a fresh running note every
    HEARTBEAT_SECONDS, and not more often."""
    broker = broker_with()
    offsets = committer(assigned_clients(broker))
    offsets.commit({IN0: 3})
    offsets.heartbeat()
    assert len(broker.commits(GROUP)) == 1

    monkeypatch.setattr(committer_module, "HEARTBEAT_SECONDS", 0.0)
    offsets.heartbeat()

    assert [c.offset for c in broker.commits(GROUP)] == [3, 3]
    assert notes(broker)[-1].state == "running"


def test_a_failed_heartbeat_is_logged_not_raised() -> None:
    """A heartbeat that fails leaves the loop running (the next turn's commit reports a
    lasting failure); the offsets stay as committed."""
    broker = broker_with()
    offsets = committer(assigned_clients(broker), holding=False)
    offsets.commit({IN0: 3})
    broker.faults.fail_commit()
    offsets.commit_past_markers(refresh=True)
    assert broker.committed(GROUP) == {IN0: 3}
    assert broker.faults.armed() == []


def test_announcing_fails_loudly() -> None:
    """The start note must land: a failure raises instead of starting unannounced."""
    broker = broker_with()
    offsets = committer(assigned_clients(broker))
    broker.faults.fail_commit()
    with pytest.raises(CommitError):
        offsets.announce({IN0: 0})


def test_closing_writes_a_stopped_note_at_the_committed_offsets() -> None:
    """At close the offsets committed are re-committed with a stopped note, not moved
    to the consumer's position (ahead after a failed turn)."""
    broker = broker_with(6)
    clients = assigned_clients(broker)
    offsets = committer(clients, holding=False)
    offsets.commit({IN0: 2})
    clients.consumer.consume(6, 0)

    offsets.note_stopped()

    assert broker.committed(GROUP) == {IN0: 2}
    assert notes(broker)[-1].state == "stopped"


def test_a_loop_that_committed_nothing_writes_no_stopped_note() -> None:
    broker = broker_with()
    committer(assigned_clients(broker)).note_stopped()
    assert broker.commits(GROUP) == []


# -- the one-runner check -----------------------------------------------------------------


def refusal(note: CommitNote) -> str:
    return f"refused: {note.describe()}"


def test_a_recent_running_note_of_another_process_refuses_the_start() -> None:
    with pytest.raises(AlreadyRunningError, match=r"refused: running on other-host"):
        check_not_running(CONFIG, [elsewhere()], force=False, refusal=refusal)


@pytest.mark.parametrize("note", [
    elsewhere("stopped"),
    elsewhere(at=time.time() - 3600),
    CommitNote.now("running", "all"),
    None,
], ids=["stopped", "stale", "own", "no-note"])
def test_stopped_stale_own_or_no_notes_let_the_loop_start(note: CommitNote | None) -> None:
    check_not_running(CONFIG, [note], force=False, refusal=refusal)


def test_force_starts_despite_a_running_loop() -> None:
    check_not_running(CONFIG, [elsewhere()], force=True, refusal=refusal)


def test_a_stream_counts_its_own_notes_of_a_loop_as_another_runner() -> None:
    """A streaming query in the process of a live loop is still refused by that loop's
    note; a stream's own note is not in its way."""
    mine = CommitNote.now("running", "all")
    with pytest.raises(AlreadyRunningError):
        check_not_running(CONFIG, [mine], force=False, refusal=refusal, by_stream=True)
    own_stream = CommitNote.now("streaming", "stream:all")
    check_not_running(CONFIG, [own_stream], force=False, refusal=refusal, by_stream=True)


def test_the_loop_refuses_partitions_another_loop_commits_to() -> None:
    """The committer reads the group's notes of the partitions it is about to take."""
    broker = broker_with()
    other = broker.clients(CONFIG).consumer
    other.commit({IN0: 2}, elsewhere().encode())

    with pytest.raises(AlreadyRunningError, match=r"another loop is running partitions all "
                                                  r"of in \(group 'committer'\)"):
        committer(assigned_clients(broker)).check_not_running([IN0])
    committer(assigned_clients(broker), force=True).check_not_running([IN0])


def test_exactly_once_fences_a_loop_on_the_same_partition_set_instead() -> None:
    """Exactly-once takes over the same partition set (its transactional id fences the
    other loop); a running loop on another partition set is still refused."""
    broker = broker_with()
    other = broker.clients(CONFIG).consumer
    other.commit({IN0: 2}, elsewhere(partitions="all").encode())
    committer(assigned_clients(broker, EOS), EOS).check_not_running([IN0])

    other.commit({IN0: 2}, elsewhere(partitions="0").encode())
    with pytest.raises(AlreadyRunningError):
        committer(assigned_clients(broker, EOS), EOS).check_not_running([IN0])


# -- exactly-once -------------------------------------------------------------------------


def eos_committer(broker: InMemoryBroker, observer: NoopObserver | None = None
                  ) -> tuple[OffsetCommitter, KafkaClients]:
    clients = assigned_clients(broker, EOS)
    offsets = committer(clients, EOS, observer=observer)
    offsets.begin()  # takes the transactional id over
    return offsets, clients


def test_exactly_once_commits_the_turns_transaction_with_its_offsets() -> None:
    """The offsets go into the open transaction, which the commit commits: counted as
    a committed transaction, with the running note as the offsets' metadata."""
    broker = broker_with()
    seen = Transactions()
    offsets, clients = eos_committer(broker, seen)
    clients.producer.begin()

    offsets.commit({IN0: 3})

    assert broker.committed(GROUP) == {IN0: 3}
    assert notes(broker)[-1].state == "running"
    assert seen.ended == ["committed"]


def test_exactly_once_stages_a_turns_offsets_and_commits_them_with_it() -> None:
    """Staged while the acks arrive, the offsets are in the transaction but not
    committed; the commit of the same turn commits them with their running note."""
    broker = broker_with()
    seen = Transactions()
    offsets, clients = eos_committer(broker, seen)
    clients.producer.begin()
    turn = {IN0: 3}

    offsets.stage(turn)
    assert broker.committed(GROUP) == {} and offsets.offsets.all() == {}
    offsets.commit(turn)

    assert broker.committed(GROUP) == {IN0: 3}
    assert notes(broker)[-1].state == "running"
    assert offsets.offsets.all() == {IN0: 3} and seen.ended == ["committed"]


def test_offsets_staged_by_a_failed_turn_are_not_taken_for_the_next() -> None:
    """A turn staged its offsets and failed (its transaction aborted); the next turn,
    committed without staging, commits its own offsets, not the failed turn's."""
    broker = broker_with()
    seen = Transactions()
    offsets, clients = eos_committer(broker, seen)
    clients.producer.begin()
    offsets.stage({IN0: 5})
    clients.producer.abort()
    clients.producer.begin()

    offsets.commit({IN0: 2})

    assert broker.committed(GROUP) == {IN0: 2}
    assert offsets.offsets.all() == {IN0: 2}


def test_exactly_once_commits_a_turn_of_timers_alone() -> None:
    """A turn with no input still has a transaction (its timers' outputs) to commit."""
    broker = broker_with()
    seen = Transactions()
    offsets, clients = eos_committer(broker, seen)
    clients.producer.begin()
    offsets.commit({})
    assert seen.ended == ["committed"] and broker.commits(GROUP) == []


def test_a_note_outside_a_turn_gets_a_transaction_of_its_own() -> None:
    """Announce and heartbeat notes open and commit their own transaction; one that
    fails is aborted (and counted) and leaves nothing open."""
    broker = broker_with()
    seen = Transactions()
    offsets, _ = eos_committer(broker, seen)
    offsets.announce({IN0: 0})
    offsets.offsets.mark_committed({IN0: 0})  # assigned there, as the assignment marks
    broker.faults.fail_commit()
    offsets.commit_past_markers(refresh=True)
    assert seen.ended == ["committed", "aborted"]
    offsets.note_stopped()
    assert seen.ended[-1] == "committed" and notes(broker)[-1].state == "stopped"


def test_a_fenced_loop_names_the_loop_that_took_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process with the same transactional id fences this one; this loop's next
    commit raises FencedError naming the partitions and the newer loop's note."""
    monkeypatch.setattr(committer_module, "_FENCED_NOTE_WAIT", 0.0)
    broker = broker_with()
    offsets, _ = eos_committer(broker)
    newer = assigned_clients(broker, EOS)
    newer.producer.init_transactions()
    newer.producer.begin()
    note = elsewhere(at=time.time() + 1)  # after this loop began, past the note's rounding
    newer.producer.commit({IN0: 0}, note.encode(), newer.consumer.group_metadata())

    with pytest.raises(FencedError) as info:
        offsets.announce({IN0: 0})

    message = str(info.value)
    assert "was fenced: another loop took over partitions all of in" in message
    assert "transactional id 'committer@all'" in message
    assert "it is running on other-host (pid 4242)" in message


def test_a_fenced_loop_still_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing after being fenced writes no stopped note over the newer loop's notes."""
    monkeypatch.setattr(committer_module, "_FENCED_NOTE_WAIT", 0.0)
    broker = broker_with()
    offsets, clients = eos_committer(broker)
    clients.producer.begin()
    offsets.commit({IN0: 2})
    assigned_clients(broker, EOS).producer.init_transactions()
    offsets.note_stopped()
    assert [n.state for n in notes(broker)] == ["running"]
