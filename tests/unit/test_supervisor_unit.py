"""The supervisor of `kasper run --processes N`, without Kafka: how partitions are
split, what a worker's command line is, and how a dying worker is restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from kasper_py.cli.commands import _without_processes
from kasper_py.supervisor import Supervisor, WorkerSpec, split_partitions
from kasper_py.supervisor._supervisor import restart_backoff


def test_partitions_split_into_even_contiguous_runs() -> None:
    """Sizes differ by at most one, in order; more workers than partitions is refused."""
    assert split_partitions([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert split_partitions(list(range(5)), 3) == [[0, 1], [2, 3], [4]]
    assert split_partitions([7], 1) == [[7]]
    with pytest.raises(ValueError, match="3 worker processes for 2 partitions"):
        split_partitions([0, 1], 3)


def test_a_steady_worker_restarts_at_once_and_a_crash_loop_backs_off() -> None:
    """A worker that ran a minute restarts without waiting (a failover waits on it); one
    that dies again soon after waits 1 s, then 2, 4... up to 30 s."""
    assert restart_backoff(61.0, 3) == (0, 0.0)
    assert restart_backoff(5.0, 0) == (1, 1.0)
    assert restart_backoff(5.0, 1) == (2, 2.0)
    assert restart_backoff(5.0, 9) == (10, 30.0)


def test_a_worker_runs_the_same_command_without_processes() -> None:
    """`--processes N`, `--processes` alone and `--processes=N` are all taken out."""
    argv = ["run", "m:f", "--processes", "4", "--config", "c.toml"]
    assert _without_processes(argv) == ["run", "m:f", "--config", "c.toml"]
    assert _without_processes(["run", "m:f", "--processes", "--config", "c"]) == [
        "run", "m:f", "--config", "c"]
    assert _without_processes(["run", "--processes=2", "m:f"]) == ["run", "m:f"]


def test_a_dying_worker_is_restarted_and_sigterm_stops_all(tmp_path) -> None:
    """A worker that exits 3 is started again (restarts counted); one that exits 0 is
    done; SIGTERM is forwarded and the supervisor returns once all have ended."""
    marker = tmp_path / "ran-once"
    flaky = [sys.executable, "-c",
             f"import pathlib,sys,time; p=pathlib.Path({str(marker)!r});"
             "sys.exit(3) if not p.exists() and not p.touch() else time.sleep(60)"]
    done = [sys.executable, "-c", "pass"]
    supervisor = Supervisor([WorkerSpec(0, flaky), WorkerSpec(1, done)])
    seen: list[bool] = []

    def stop_after_the_restart() -> None:  # signals reach the main thread, which runs it
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = supervisor._state
            if state and state[0].restarts == 1 and state[0].process is not None:
                seen.append(state[1].done)
                break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_after_the_restart, daemon=True).start()
    code = supervisor.run()
    assert seen == [True]  # restarted once; the worker that exited 0 was done
    assert code == 1  # the restarted worker ended by SIGTERM, not with 0
    assert supervisor._state[0].process is not None
    assert supervisor._state[0].process.returncode == -signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_stop_signal_during_a_workers_start_still_reaches_it() -> None:
    """SIGTERM handled while a worker is being started (between the restart decision and
    its process existing): the new worker is stopped too, not left running."""
    holder: list[Supervisor] = []

    def popen(command: list[str], env: object = None) -> subprocess.Popen[bytes]:
        holder[0]._on_signal(signal.SIGTERM, None)  # the signal lands mid-start
        return subprocess.Popen(command, env=env)

    supervisor = Supervisor([WorkerSpec(0, [sys.executable, "-c", "import time; time.sleep(60)"])],
                            popen=popen)
    holder.append(supervisor)
    code = supervisor.run()
    assert code == 1 and supervisor._state[0].process is not None
    assert supervisor._state[0].process.returncode == -signal.SIGTERM  # not slept out
