"""A loop stopped at once (a second Ctrl-C) leaves no "running" commit note behind to
refuse resets; a dry run is never refused by a note, only warned."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402
from test_cli import cli_env, kasper, kasper_command, run_args, write_config  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration
pytest_plugins = ["conftest_stores"]

N = 40


def _just_after_a_commit(committed: Callable[[], int]) -> None:
    """Return as soon as the committed offset moves: a new turn has just begun."""
    before, deadline = committed(), time.monotonic() + 30
    while committed() == before:
        assert time.monotonic() < deadline, "no commit within 30 s"
        time.sleep(0.05)


def test_a_double_ctrl_c_clears_its_note_and_a_dry_run_is_never_refused(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """While a slow loop runs, ``offsets reset --dry-run`` exits 0 with its plan and a
    warning naming the loop (a real reset is refused, exit 5). Two SIGINTs mid-batch stop
    it at once (exit 130) without moving the committed offset, and its note then says
    stopped: the same reset goes through at once, without --force."""
    source, sink = new_topic("note-in"), new_topic("note-out")
    kafka.produce(source, [f"m{i}".encode() for i in range(N)])
    name = unique_name("cli-note")
    config = write_config(tmp_path, name, source, batch_size=2)
    env = cli_env(bootstrap, sink, EXAMPLE_PAUSE="2")
    process = subprocess.Popen([*kasper_command(), *run_args(config)], env=env, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (kafka.committed(name, source)[0] or 0) >= 2, "a first commit",
                 timeout=60)
        dry = kasper("offsets", "reset", "--to", "earliest", "--dry-run", "-c", config,
                     env=env)
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.splitlines()[-1] == f"dry run: group {name} unchanged"
        assert dry.stderr.startswith("kasper: warning: a kasper loop is running on ")
        assert f"(pid {process.pid})" in dry.stderr
        assert dry.stderr.endswith(": a reset now would be refused (and undone by its next "
                                   "commit) unless it has stopped\n")
        refused = kasper("offsets", "reset", "--to", "earliest", "-c", config, env=env)
        assert refused.returncode == 5 and "is being processed" in refused.stderr
        _just_after_a_commit(lambda: kafka.committed(name, source)[0] or 0)
        process.send_signal(signal.SIGINT)  # mid-batch: the turn sleeps 2 s more
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err[-3000:]
    committed = kafka.committed(name, source)[0]
    assert committed is not None and 2 <= committed < N
    show = kasper("offsets", "show", "-c", config, env=env)
    assert "last commit by a kasper loop: stopped on" in show.stdout, show.stdout
    assert kafka.committed(name, source)[0] == committed  # the note moved no offset
    done = kasper("offsets", "reset", "--to", "earliest", "-c", config, env=env)
    assert done.returncode == 0, done.stderr
    assert kafka.committed(name, source)[0] == 0
