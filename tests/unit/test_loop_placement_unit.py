"""Who runs and who keeps warm each partition of static loops, as ``kasper lag`` and
``kasper app describe --members`` read it from the loops' commit notes: a note names
the partitions its loop keeps warm when it commits, so a promotion or a release shows
in the next note, not the partitions the loop was configured with."""

from __future__ import annotations

import time

import pytest

from kasper_py import Config
from kasper_py.cli.app import render, standby_listing
from kasper_py.cli.offsets import loop_placement, placement
from kasper_py.kafka.admin import GroupMember, GroupState
from kasper_py.kafka.offsets import CommitNote, NoteState, PartitionProgress
from kasper_py.loop.committer import OffsetCommitter
from kasper_py.observability.observe import NoopObserver
from kasper_py.testing import InMemoryBroker

CONFIG = Config(name="wc", bootstrap_servers="in-memory", input_topics=["in"])
A, B = "pid-1@host-a", "pid-2@host-b"


def note(state: NoteState, host: str, pid: int, age: float, *standbys: int) -> CommitNote:
    """A note written ``age`` seconds ago on another host."""
    return CommitNote(state, time.time() - age, host, pid, str(pid), None,
                      standbys)


def rows(*notes: CommitNote | None) -> list[PartitionProgress]:
    """Partition ``i`` of "in" committed at 10 with the ``i``-th note."""
    return [PartitionProgress("in", i, 10, 0, 10, n) for i, n in enumerate(notes)]


def test_standbys_ride_in_the_note_and_old_notes_still_read() -> None:
    """``standby=0,2`` sits before the endpoint; a note without it keeps none."""
    written = CommitNote.now("running", "1", "http://h:9", standbys=[2, 0])
    assert written.encode().endswith(" 1 standby=0,2 endpoint=http://h:9")
    read = CommitNote.decode(written.encode())
    assert read is not None and (read.standbys, read.endpoint, read.partitions) == (
        (0, 2), "http://h:9", "1")
    old = CommitNote.decode("kasper/1 running 1.0 h 7 1 endpoint=http://h:9")
    assert old is not None and (old.standbys, old.partitions) == ((), "1")
    assert CommitNote.decode("kasper/1 running 1.0 h 7 1 standby=x") is None


def test_a_promoted_partition_is_run_by_its_new_owner_and_warm_nowhere() -> None:
    """B ran 1 and kept 0 warm (its older note on 1); promoted, its newer note on 0 keeps
    nothing warm: B runs 0 and 1, and no loop keeps a standby."""
    before = loop_placement(CONFIG, rows(note("running", "host-a", 1, 5),
                                         note("running", "host-b", 2, 4, 0)))
    assert before == ({("in", 0): A, ("in", 1): B}, {0: (B,)})
    after = loop_placement(CONFIG, rows(note("running", "host-b", 2, 1),
                                        note("running", "host-b", 2, 4, 0)))
    assert after == ({("in", 0): B, ("in", 1): B}, None)


def test_a_released_partition_is_run_by_nobody_and_warm_again() -> None:
    """B released 0 (its "released" note there) and its newest running note keeps 0 warm:
    nobody runs 0 until A returns, B keeps it warm; stopped or old notes name nobody."""
    released = loop_placement(CONFIG, rows(note("released", "host-b", 2, 2),
                                           note("running", "host-b", 2, 1, 0)))
    assert released == ({("in", 1): B}, {0: (B,)})
    gone = loop_placement(CONFIG, rows(note("stopped", "host-a", 1, 1, 1),
                                       note("running", "host-b", 2, 3600, 0), None))
    assert gone == ({}, None)


def test_describe_members_renders_what_the_notes_say() -> None:
    """``kasper app describe --members`` with static sets: each partition's loop and the
    loops keeping it warm."""
    listing = standby_listing(CONFIG, {1: (A,)}, {0: B, 1: B})
    assert listing == {"topic": "in", "partitions": {"0": [], "1": [A]},
                       "runners": {"0": B, "1": B}}
    text = render({"app": "wc", "name": "wc", "sources": ["in"], "processors": [],
                   "internal_topics": [], "channels": [], "tasks": [], "standbys": listing})
    assert text.endswith("  in (loops running and keeping each partition warm, from their "
                         f"commit notes):\n    partition 0: run by {B}; warm in -\n"
                         f"    partition 1: run by {B}; warm in {A}")


@pytest.mark.parametrize("warm", [(), (0, 2)])
def test_a_committer_notes_the_partitions_kept_warm_at_each_commit(
        warm: tuple[int, ...]) -> None:
    """The committer asks what is kept warm at every commit (a promotion changes it
    between two turns)."""
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.produce("in", "v")
    clients = broker.clients(CONFIG)
    clients.consumer.assign([0])
    kept: list[int] = [5]
    committer = OffsetCommitter(CONFIG, clients.consumer, NoopObserver(),
                                holding=lambda: False, warm=lambda: kept)
    committer.commit({("in", 0): 1})
    first = CommitNote.decode(broker.commits("wc")[-1].metadata)
    kept[:] = warm
    committer.commit({("in", 0): 1})
    second = CommitNote.decode(broker.commits("wc")[-1].metadata)
    assert first is not None and second is not None
    assert (first.standbys, second.standbys) == ((5,), warm)


def test_a_group_with_members_places_partitions_by_its_members_not_the_notes() -> None:
    """Workers run with ``--assignment group`` on the command line, ``kasper lag`` read
    a file without it: the group's members own the partitions; the notes still name
    the member that committed before a rebalance moved the partition."""
    members = (GroupMember("wc-consumer-1", "/10.0.0.1", (("in", 0),)),
               GroupMember("wc-consumer-2", "/10.0.0.2", (("in", 1),)))
    stale = rows(note("running", "host-a", 1, 1), note("running", "host-a", 1, 1))

    owners, warm = placement(CONFIG, GroupState("STABLE", members), stale)

    assert (owners, warm) == ({("in", 0): "wc-consumer-1@10.0.0.1",
                               ("in", 1): "wc-consumer-2@10.0.0.2"}, None)
    assert placement(CONFIG, GroupState("EMPTY", ()), stale)[0] == {("in", 0): A,
                                                                   ("in", 1): A}
