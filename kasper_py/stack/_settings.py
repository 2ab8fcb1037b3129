"""Where the local stack lives and which ports it listens on.

Everything is read from environment variables at call time, so tests can point a
second stack at a temporary directory and other ports. No process handling here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kasper_py.stack._errors import StackError

LOOPBACK = "127.0.0.1"

REDIS_PERSISTENCE = ("aof", "aof-always", "none")
"""``KASPER_REDIS_PERSISTENCE``: an append-only file fsynced every second (default) or
after every write, or memory only (faster; a restart forgets every key)."""


def _port(variable: str, default: int) -> int:
    """Read a TCP port from ``variable``; a bad value is a StackError naming it."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise StackError(f"{variable}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise StackError(f"{variable}={port} is outside 1-65535")
    return port


def _choice(variable: str, default: str, choices: tuple[str, ...]) -> str:
    """Read one of ``choices`` from ``variable``; anything else is a StackError naming it."""
    raw = os.environ.get(variable, "").strip().lower()
    if not raw:
        return default
    if raw not in choices:
        raise StackError(f"{variable}={raw!r} is not one of {', '.join(choices)}")
    return raw


def resolve_stack_dir(stack_dir: str | os.PathLike[str] | None = None) -> Path:
    """``stack_dir``, else ``$KASPER_STACK_DIR``, else ``<cwd>/.kasper-stack``, absolute."""
    if stack_dir is None:
        stack_dir = os.environ.get("KASPER_STACK_DIR") or Path.cwd() / ".kasper-stack"
    return Path(stack_dir).expanduser().resolve()


@dataclass(frozen=True)
class Settings:
    """One stack: its directory, the ports of every component, and how Redis persists."""

    stack_dir: Path
    kafka_port: int
    kafka_controller_port: int
    redis_port: int
    cassandra_port: int
    cassandra_storage_port: int
    prometheus_port: int
    redis_persistence: str
    """One of ``REDIS_PERSISTENCE``."""

    @classmethod
    def load(cls, stack_dir: str | os.PathLike[str] | None = None) -> Settings:
        """Build from the environment (``KASPER_*_PORT``, ``KASPER_REDIS_PERSISTENCE``)
        and ``stack_dir``."""
        return cls(
            stack_dir=resolve_stack_dir(stack_dir),
            kafka_port=_port("KASPER_KAFKA_PORT", 19092),
            kafka_controller_port=_port("KASPER_KAFKA_CONTROLLER_PORT", 19093),
            redis_port=_port("KASPER_REDIS_PORT", 16379),
            cassandra_port=_port("KASPER_CASSANDRA_PORT", 19042),
            cassandra_storage_port=_port("KASPER_CASSANDRA_STORAGE_PORT", 17000),
            prometheus_port=_port("KASPER_PROMETHEUS_PORT", 19090),
            redis_persistence=_choice("KASPER_REDIS_PERSISTENCE", "aof", REDIS_PERSISTENCE),
        )

    def component_dir(self, name: str) -> Path:
        """Config, data, log and pid file of one component: removed by ``down --purge``."""
        return self.stack_dir / name

    def lib_dir(self, name: str) -> Path:
        """Jars resolved by Maven for one component; kept across ``down --purge``."""
        return self.stack_dir / "lib" / name
