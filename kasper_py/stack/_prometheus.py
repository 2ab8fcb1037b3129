"""The stack's Prometheus and what it scrapes, by file-based discovery: ``targets.json``
(set by hand or by tests) and one ``targets/<pid>-<processor>.json`` per running
``kasper run``, written when its metrics port opens and removed when it exits.

A machine without the stack's Prometheus folder gets no target files at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack._components import Component
from kasper_py.stack._install import apt_install
from kasper_py.stack._process import alive
from kasper_py.stack._settings import Settings

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


class Prometheus(Component):
    """Debian's prometheus, scraping every second what ``targets.json`` and the files of
    ``targets/`` list (running processors register there, see ``scraped``)."""

    name = PROMETHEUS
    ready_timeout = 30.0

    @property
    def port(self) -> int:
        return self.settings.prometheus_port

    @property
    def targets_file(self) -> Path:
        return targets_file(self.settings)

    def prepare(self) -> str:
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        self._configure()
        return apt_install("prometheus", "prometheus")

    def reconfigure(self, pid: int) -> bool:
        """Rewrite a configuration older than this version's and SIGHUP Prometheus, which
        reloads it: a stack left running still learns to discover processors."""
        if not self._configure():
            return False
        os.kill(pid, signal.SIGHUP)
        return True

    def _configure(self) -> bool:
        """Write ``prometheus.yml`` and the targets; True when the file changed."""
        config = self.directory / "prometheus.yml"
        before = config.read_text() if config.is_file() else None
        targets_dir(self.settings).mkdir(parents=True, exist_ok=True)
        self.render("prometheus.yml", config.name, targets_file=self.targets_file,
                    targets_dir=targets_dir(self.settings))
        if not self.targets_file.exists():
            self.targets_file.write_text("[]\n")
        return config.read_text() != before

    def command(self, program: str) -> list[str]:
        return [program, f"--config.file={self.directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address={self.address}",
                "--storage.tsdb.retention.time=1d"]

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=1) as reply:
                return int(reply.status) == 200
        except (urllib.error.URLError, OSError):
            return False
