"""CommitNote: the metadata every loop commit carries, read back by `kasper offsets
reset` and the reprocessing handoff to tell a running loop from a stopped one."""

from __future__ import annotations

import os
import socket
import time

import pytest

from kasper_py import Config
from kasper_py.offsets import CommitNote, running_loop, running_window


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
