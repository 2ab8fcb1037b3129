"""What the stack's Prometheus scrapes, by file-based discovery: ``targets.json`` (set
by hand or by tests) and one ``targets/<pid>-<processor>.json`` per running
``kasper run``, written when its metrics port opens and removed when it exits.

Nothing here starts Prometheus; a machine without the stack's Prometheus folder gets
no files at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from kasper_py.stack._process import alive
from kasper_py.stack._settings import LOOPBACK, Settings

PROMETHEUS = "prometheus"
"""The Prometheus component's name, and so its folder in the stack."""

_PID_PREFIX = re.compile(r"^(\d+)-")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# A listener on every interface is scraped through the loopback.
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def targets_file(settings: Settings) -> Path:
    """The targets written by ``kasper_py.stack.set_prometheus_targets``."""
    return settings.component_dir(PROMETHEUS) / "targets.json"


def targets_dir(settings: Settings) -> Path:
    """The folder of the running processors' target files."""
    return settings.component_dir(PROMETHEUS) / "targets"


def write_targets(path: Path, targets: Sequence[str]) -> None:
    """Write a ``file_sd_configs`` file listing ``targets`` (``host:port``). The write
    goes through a rename, so Prometheus never reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # not *.json: never read
    partial.write_text(json.dumps([{"targets": list(targets)}], indent=2) + "\n")
    partial.replace(path)


@contextlib.contextmanager
def scraped(processor: str, address: tuple[str, int] | None,
            settings: Settings) -> Iterator[Path | None]:
    """While the block runs, the stack's Prometheus (if this machine has one) scrapes
    the metrics server at ``address``; yields the target file written, or None."""
    try:
        target = _register(processor, address, settings) if address is not None else None
    except OSError:  # a folder not ours to write: the processor runs unscraped
        target = None
    try:
        yield target
    finally:
        if target is not None:
            target.unlink(missing_ok=True)


def _register(processor: str, address: tuple[str, int], settings: Settings) -> Path | None:
    if not settings.component_dir(PROMETHEUS).is_dir():
        return None
    folder = targets_dir(settings)
    folder.mkdir(exist_ok=True)
    _remove_dead(folder)
    host, port = address
    target = folder / f"{os.getpid()}-{_UNSAFE.sub('_', processor)}.json"
    write_targets(target, [f"{LOOPBACK if host in _WILDCARDS else host}:{port}"])
    return target


def _remove_dead(folder: Path) -> None:
    """Drop the files of processes that died without removing theirs (SIGKILL)."""
    for path in folder.glob("*.json"):
        match = _PID_PREFIX.match(path.name)
        if match and not alive(int(match[1])):
            path.unlink(missing_ok=True)
