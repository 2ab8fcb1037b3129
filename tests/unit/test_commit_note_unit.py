"""CommitNote: the metadata every loop commit carries, read back by `kasper offsets
reset` and the reprocessing handoff to tell a running loop from a stopped one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from kasper_py import Config
from kasper_py.kafka.offsets import CommitNote, running_loop, running_window


def test_a_note_round_trips_through_commit_metadata() -> None:
    """What a loop writes is what the tools read: state, time, host and pid."""
    note = CommitNote.now("running")
    assert note.host == socket.gethostname() and note.pid == os.getpid()
    decoded = CommitNote.decode(note.encode())
    assert decoded is not None and decoded.state == "running"
    assert decoded.at == pytest.approx(note.at, abs=0.001) and decoded.pid == note.pid


@pytest.mark.parametrize("metadata", [None, "", "written by another tool",
                                      "kasper/1 paused 1.0 h 1", "kasper/1 running x h 1",
                                      "kasper/2 running 1.0 h 1", "kasper/1 running 1.0 h"])
def test_metadata_of_other_committers_is_no_note(metadata: str | None) -> None:
    """Offsets committed by other clients, or by a future format, are not mistaken for
    a kasper loop."""
    assert CommitNote.decode(metadata) is None


def test_running_loop_is_the_newest_running_note_inside_the_window() -> None:
    """Stopped notes and running notes older than the window (a killed loop) do not
    count; of the rest, the newest is named."""
    config = Config(name="n", bootstrap_servers="h:1", input_topics=["t"],
                    delivery_timeout=20.0, batch_wait=1.0)
    assert running_window(config) == 30 + 20 + 2
    now = time.time()
    killed = CommitNote("running", now - 60, "a", 1)
    stopped = CommitNote("stopped", now - 1, "b", 2)
    assert running_loop(config, [killed, stopped, None]) is None
    recent, newest = CommitNote("running", now - 40, "c", 3), CommitNote("running", now - 5,
                                                                        "d", 4)
    assert running_loop(config, [recent, killed, newest, stopped]) == newest
    assert running_loop(config, [recent]) == recent
    assert newest.describe(now) == "running on d (pid 4), committed 5 s ago"


def test_a_note_may_name_the_partition_set_and_old_notes_still_read() -> None:
    """Loops name their partition set (fencing tells same from overlapping sets by it);
    notes written before it existed still decode, with no set."""
    note = CommitNote.now("running", "0-3,7")
    decoded = CommitNote.decode(note.encode())
    assert decoded is not None and decoded.partitions == "0-3,7"
    assert decoded.describe(decoded.at).startswith(
        f"running on {note.host} (pid {note.pid}) on partitions 0-3,7,")
    old = CommitNote.decode("kasper/1 stopped 12.5 h 9")
    assert old == CommitNote("stopped", 12.5, "h", 9, None)


def test_a_note_of_a_process_gone_from_this_host_is_known_dead() -> None:
    """A killed loop's note still says running; on this host its pid is checked, so a
    restart need not wait for the note to age. Other hosts' processes cannot be checked."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
    dead = CommitNote("running", time.time(), socket.gethostname(), int(finished.stdout))
    assert dead.process_gone() and not dead.is_mine()
    mine = CommitNote.now("running")
    assert mine.is_mine() and not mine.process_gone()
    elsewhere = CommitNote("running", time.time(), "another-host.invalid", int(finished.stdout))
    assert not elsewhere.process_gone()
