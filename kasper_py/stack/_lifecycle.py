"""Starting, stopping and inspecting stack components, with timings for the user.

``up`` is idempotent (a running component is left alone) and never leaves a half
started server behind: if the readiness probe fails, the process is stopped again.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack import _process
from kasper_py.stack._catalog import COMPONENTS, GROUPS, build
from kasper_py.stack._components import Component
from kasper_py.stack._errors import StackError
from kasper_py.stack._settings import Settings, record_stack_dir

DEFAULT_UP = ("kafka", "redis")
Report = Callable[[str], None]


@dataclass(frozen=True)
class ComponentStatus:
    """What ``status()`` knows about one component."""

    name: str
    running: bool
    pid: int | None
    address: str
    log_file: Path

    def __str__(self) -> str:
        state = f"running  pid {self.pid}" if self.running else "stopped"
        return f"{self.name:<15} {state:<18} {self.address}"


def select(names: Sequence[str], default: Sequence[str]) -> list[str]:
    """Expand ``all`` and groups (``spark``), drop duplicates, keep the order given;
    ``default`` when empty."""
    chosen: list[str] = []
    for name in names or default:
        for expanded in COMPONENTS if name == "all" else GROUPS.get(name, (name,)):
            if expanded not in COMPONENTS:
                known = ", ".join([*GROUPS, *COMPONENTS, "all"])
                raise StackError(f"unknown stack component {expanded!r} (known: {known})")
            if expanded not in chosen:
                chosen.append(expanded)
    return chosen


def status_of(component: Component) -> ComponentStatus:
    """Running or not, judged by the pid file and the process it names."""
    pid = _process.running_pid(component.pid_file)
    return ComponentStatus(component.name, pid is not None, pid, component.address,
                           component.log_file)


def start(component: Component, report: Report) -> ComponentStatus:
    """Install, configure and launch ``component``; return once it answers requests."""
    current = status_of(component)
    if current.running:
        report(f"{component.name}: already running (pid {current.pid}) at {current.address}")
        if current.pid is not None and component.reconfigure(current.pid):
            report(f"{component.name}: configuration changed, reloaded")
        return current
    began = time.monotonic()
    program = component.prepare()
    launched = time.monotonic()
    pid = _process.spawn(component.command(program), component.log_file, component.pid_file,
                         cwd=component.directory, environment=component.environment())
    try:
        _process.wait_ready(component.name, pid, component.is_ready, component.ready_timeout,
                            component.log_file)
    except StackError as error:
        _process.stop(component.pid_file, grace_seconds=5.0)
        raise StackError(f"{error}{_port_hint(component)}") from None
    except BaseException:  # Ctrl-C while waiting: do not leave a half-started server
        _process.stop(component.pid_file, grace_seconds=5.0)
        raise
    ready = time.monotonic()
    report(f"{component.name}: started at {component.address} (pid {pid}) in "
           f"{ready - began:.1f} s (install/config {launched - began:.1f} s, "
           f"start {ready - launched:.1f} s)")
    return status_of(component)


def _port_hint(component: Component) -> str:
    """After a failed start our process is gone: anything still on the port is someone else."""
    if _process.port_open(LOOPBACK, component.port):
        return (f"\nhint: another process already listens on {component.address}; stop it or "
                f"choose another port ({component.port_variable})")
    return ""


def stop(component: Component, purge: bool, report: Report) -> None:
    """Stop ``component`` if we started it; with ``purge`` also delete its data and logs."""
    began = time.monotonic()
    pid = _process.stop(component.pid_file, component.stop_grace)
    took = time.monotonic() - began
    if pid is None:
        report(f"{component.name}: not running")
    else:
        report(f"{component.name}: stopped (pid {pid}) in {took:.1f} s")
    if purge and component.directory.exists():
        shutil.rmtree(component.directory)
        report(f"{component.name}: purged {component.directory}")


def up(names: Sequence[str], settings: Settings, report: Report) -> list[ComponentStatus]:
    """Start the named components (default kafka and redis) in the order given; a stack
    found from the cwd is recorded for this user, so ``status`` finds it from anywhere."""
    chosen = select(names, DEFAULT_UP)
    if settings.found:
        record_stack_dir(settings.stack_dir)
    return [start(build(name, settings), report) for name in chosen]


def down(names: Sequence[str], settings: Settings, purge: bool, report: Report) -> None:
    """Stop the named components (default: all), in the reverse order of ``all``: Spark's
    workers before their master."""
    chosen = select(names, tuple(COMPONENTS))
    for name in reversed(COMPONENTS):
        if name in chosen:
            stop(build(name, settings), purge, report)


def status(settings: Settings) -> list[ComponentStatus]:
    """The status of every component of the stack."""
    return [status_of(build(name, settings)) for name in COMPONENTS]
