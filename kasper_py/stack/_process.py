"""Detached server processes: start, pid files, liveness, readiness wait and stop.

A started server runs in its own session, outlives the Python process that started
it, and is known only through its pid file. The pid file also records the kernel's
start time of the process, so a recycled pid is never mistaken for (or killed as)
one of ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kasper_py.stack._errors import StackError

LOG_TAIL_LINES = 30

# `sh` puts the server in the background and prints its pid, then exits at once: the
# server is re-parented to init, so no zombie is left behind in our process and no
# Popen object has to outlive this call.
_DETACH_SCRIPT = 'log="$1"; shift; "$@" >"$log" 2>&1 </dev/null & echo $!'


def _start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (field 22 of /proc/<pid>/stat); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it follow the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    if Path("/proc").is_dir():
        return _start_time(pid) is not None
    try:  # no procfs (macOS): signal 0 is the only portable probe
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spawn(command: Sequence[str], log_file: Path, pid_file: Path, cwd: Path,
          environment: Mapping[str, str] | None = None) -> int:
    """Start ``command`` detached in a new session, output to ``log_file``; write ``pid_file``.

    ``environment`` is added to this process's own environment for the server.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if log_file.exists():  # keep the previous run's log for a post-mortem of its end
        log_file.replace(log_file.with_name(log_file.name + ".1"))
    launcher = subprocess.run(
        ["sh", "-c", _DETACH_SCRIPT, "sh", str(log_file), *command],
        capture_output=True, text=True, check=False, start_new_session=True, cwd=cwd,
        env={**os.environ, **(environment or {})},
    )
    if launcher.returncode != 0 or not launcher.stdout.strip().isdigit():
        raise StackError(f"could not launch {command[0]}: {launcher.stderr.strip()}")
    pid = int(launcher.stdout.strip())
    write_pid_file(pid_file, pid)
    return pid


def write_pid_file(pid_file: Path, pid: int) -> None:
    """Record ``pid`` and its start time (second line) in ``pid_file``."""
    start = _start_time(pid) or ""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{pid}\n{start}\n")


def running_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that very process is still running, else None."""
    try:
        lines = pid_file.read_text().split()
    except OSError:
        return None
    if not lines or not lines[0].isdigit():
        return None
    pid = int(lines[0])
    if not alive(pid):
        return None
    recorded_start = lines[1] if len(lines) > 1 else None
    if recorded_start and Path("/proc").is_dir() and _start_time(pid) != recorded_start:
        return None  # the pid was recycled by an unrelated process
    return pid


def stop(pid_file: Path, grace_seconds: float) -> int | None:
    """SIGTERM the process of ``pid_file``, SIGKILL it after ``grace_seconds``; remove the file.

    Returns the pid that was stopped, or None if nothing of ours was running.
    """
    pid = running_pid(pid_file)
    if pid is not None:
        _signal(pid, signal.SIGTERM)
        if not _wait_gone(pid, grace_seconds):
            _signal(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)
    pid_file.unlink(missing_ok=True)
    return pid


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
        os.kill(pid, signum)


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return not alive(pid)


def log_tail(log_file: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``log_file``, or a note that it is empty or missing."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return f"(no log at {log_file})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(the log is empty)"


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_ready(name: str, pid: int, is_ready: Callable[[], bool], timeout: float,
               log_file: Path) -> None:
    """Poll ``is_ready`` until it is true; StackError if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            raise StackError(start_failure(name, "exited during start-up", log_file))
        if is_ready():
            return
        time.sleep(0.25)
    raise StackError(start_failure(name, f"was not ready within {timeout:.0f} s", log_file))


def start_failure(name: str, what: str, log_file: Path) -> str:
    """The message for a failed start: what happened, where the log is, and its tail."""
    return (f"{name} {what}; log: {log_file}\n"
            f"--- last {LOG_TAIL_LINES} lines of {log_file} ---\n{log_tail(log_file)}")
