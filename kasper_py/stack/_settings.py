"""Where the local stack lives and which ports it listens on.

Everything is read from environment variables at call time, so tests can point a
second stack at a temporary directory and other ports. No process handling here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kasper_py._support.ports import free_ports
from kasper_py.stack._errors import StackError

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


def _memory(variable: str, default: str) -> str:
    """Read a JVM-style size (``512m``, ``1g``) from ``variable``; a bad one is a StackError."""
    raw = os.environ.get(variable, "").strip().lower()
    if not raw:
        return default
    if not re.fullmatch(r"[1-9][0-9]*[mg]", raw):
        raise StackError(f"{variable}={raw!r} is not a size like 512m or 2g")
    return raw


def _count(variable: str, default: int) -> int:
    """Read a positive whole number from ``variable``; anything else is a StackError."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise StackError(f"{variable}={raw!r} is not a positive whole number")
    return int(raw)


def _choice(variable: str, default: str, choices: tuple[str, ...]) -> str:
    """Read one of ``choices`` from ``variable``; anything else is a StackError naming it."""
    raw = os.environ.get(variable, "").strip().lower()
    if not raw:
        return default
    if raw not in choices:
        raise StackError(f"{variable}={raw!r} is not one of {', '.join(choices)}")
    return raw


STACK_DIR_NAME = ".kasper-stack"


def resolve_stack_dir(stack_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the stack lives, absolute: ``stack_dir``, else ``$KASPER_STACK_DIR``, else
    the first found of a ``.kasper-stack`` folder in the cwd or a folder above it (the
    project's stack), the folder ``up`` last recorded for this user (``record_file()``)
    if it still exists, and ``<cwd>/.kasper-stack``."""
    chosen = stack_dir or os.environ.get("KASPER_STACK_DIR")
    if chosen:
        return Path(chosen).expanduser().resolve()
    return _found_stack_dir()


def _found_stack_dir() -> Path:
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / STACK_DIR_NAME).is_dir():
            return folder / STACK_DIR_NAME
    recorded = _recorded_stack_dir()
    return recorded if recorded is not None else cwd / STACK_DIR_NAME


def _cache_dir() -> Path:
    chosen = os.environ.get("KASPER_STACK_CACHE")
    if chosen:
        return Path(chosen).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "kasper-py" / "stack"


def record_file() -> Path:
    """The per-user note of the last stack started from its own folder:
    ``$XDG_STATE_HOME/kasper-py/stack-dir`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "kasper-py" / "stack-dir"


def _recorded_stack_dir() -> Path | None:
    try:
        recorded = Path(record_file().read_text().strip())
    except OSError:
        return None
    return recorded if recorded.is_absolute() and recorded.is_dir() else None


def record_stack_dir(stack_dir: Path) -> None:
    """Note ``stack_dir`` in ``record_file()``, so the stack is found from any folder.

    Best effort: without a writable home the stack still works from its own folder.
    """
    record = record_file()
    partial = record.with_name(f"{record.name}.{os.getpid()}.tmp")
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(f"{stack_dir}\n")
        partial.replace(record)  # a reader never sees half a path
    except OSError:
        partial.unlink(missing_ok=True)


@dataclass(frozen=True)
class Settings:
    """One stack: its directory, the ports of every component, how Redis persists and
    what each Spark worker offers."""

    stack_dir: Path
    kafka_port: int
    kafka_controller_port: int
    redis_port: int
    cassandra_port: int
    cassandra_storage_port: int
    prometheus_port: int
    schema_registry_port: int
    """The schema registry's HTTP port (its Confluent API under ``/apis/ccompat/v7``)."""
    redis_persistence: str
    """One of ``REDIS_PERSISTENCE``."""
    spark_master_port: int
    spark_master_ui_port: int
    """The master's web UI; its ``/json/`` lists the workers and applications."""
    spark_worker_port: int
    """Worker n (from 1) listens on this port + n - 1."""
    spark_worker_ui_port: int
    """Worker n's web UI is on this port + n - 1."""
    spark_worker_cores: int
    spark_worker_memory: str
    """What each worker offers executors (``--memory``): an executor's heap
    (``spark.executor.memory``, 1g by default) must fit in it."""
    jaeger_port: int
    """Jaeger's query API (HTTP; traces under ``/api/v3/traces``)."""
    jaeger_grpc_port: int
    """Jaeger's query API over gRPC."""
    jaeger_otlp_grpc_port: int
    """Where Jaeger receives OTLP over gRPC."""
    jaeger_otlp_http_port: int
    """Where Jaeger receives OTLP over HTTP (``/v1/traces``): ``otlp_endpoint``."""
    opensearch_port: int
    """OpenSearch's REST API (HTTP)."""
    opensearch_transport_port: int
    """OpenSearch's node-to-node transport (bound, unused by a single node)."""
    postgres_port: int
    """PostgreSQL's port (``KASPER_POSTGRES_PORT``)."""
    cache_dir: Path
    """What a fresh clone need not build again (the jars): ``$KASPER_STACK_CACHE``, else
    ``$XDG_CACHE_HOME/kasper-py/stack`` (``~/.cache`` when unset)."""
    found: bool = False
    """True when ``stack_dir`` was found (``resolve_stack_dir``), not given by the caller
    or ``$KASPER_STACK_DIR``: ``up`` then records it for this user."""

    @classmethod
    def load(cls, stack_dir: str | os.PathLike[str] | None = None) -> Settings:
        """Build from the environment (``KASPER_*_PORT``, ``KASPER_JAEGER_*_PORT``,
        ``KASPER_REDIS_PERSISTENCE``,
        ``KASPER_SPARK_WORKER_CORES`` and ``_MEMORY``) and ``stack_dir``."""
        return cls(
            stack_dir=resolve_stack_dir(stack_dir),
            cache_dir=_cache_dir(),
            found=not (stack_dir or os.environ.get("KASPER_STACK_DIR")),
            kafka_port=_port("KASPER_KAFKA_PORT", 19092),
            kafka_controller_port=_port("KASPER_KAFKA_CONTROLLER_PORT", 19093),
            redis_port=_port("KASPER_REDIS_PORT", 16379),
            cassandra_port=_port("KASPER_CASSANDRA_PORT", 19042),
            cassandra_storage_port=_port("KASPER_CASSANDRA_STORAGE_PORT", 17000),
            prometheus_port=_port("KASPER_PROMETHEUS_PORT", 19090),
            schema_registry_port=_port("KASPER_SCHEMA_REGISTRY_PORT", 18085),
            redis_persistence=_choice("KASPER_REDIS_PERSISTENCE", "aof", REDIS_PERSISTENCE),
            spark_master_port=_port("KASPER_SPARK_MASTER_PORT", 17077),
            spark_master_ui_port=_port("KASPER_SPARK_MASTER_UI_PORT", 18080),
            spark_worker_port=_port("KASPER_SPARK_WORKER_PORT", 17078),
            spark_worker_ui_port=_port("KASPER_SPARK_WORKER_UI_PORT", 18081),
            spark_worker_cores=_count("KASPER_SPARK_WORKER_CORES", 1),
            spark_worker_memory=_memory("KASPER_SPARK_WORKER_MEMORY", "1g"),
            jaeger_port=_port("KASPER_JAEGER_PORT", 16686),
            jaeger_grpc_port=_port("KASPER_JAEGER_GRPC_PORT", 16685),
            jaeger_otlp_grpc_port=_port("KASPER_JAEGER_OTLP_GRPC_PORT", 4317),
            jaeger_otlp_http_port=_port("KASPER_JAEGER_OTLP_HTTP_PORT", 4318),
            opensearch_port=_port("KASPER_OPENSEARCH_PORT", 19200),
            opensearch_transport_port=_port("KASPER_OPENSEARCH_TRANSPORT_PORT", 19300),
            postgres_port=_port("KASPER_POSTGRES_PORT", 15432),
        )

    def component_dir(self, name: str) -> Path:
        """Config, data, log and pid file of one component: removed by ``down --purge``."""
        return self.stack_dir / name

    def lib_dir(self, name: str, recipe: str) -> Path:
        """Jars resolved or built by Maven for one component from ``recipe`` (its pom, or
        a version), in the per-user cache: a fresh clone reuses them, ``down --purge``
        and ``make clean`` keep them, a changed recipe gets a folder of its own."""
        digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
        return self.cache_dir / "lib" / f"{name}-{digest}"




def with_free_spark_ports(settings: Settings) -> Settings:
    """``settings`` with every Spark port one that is free now: a private cluster (tests,
    benchmarks) beside the stack's own."""
    return dataclasses.replace(
        settings, spark_master_port=free_ports(), spark_master_ui_port=free_ports(),
        spark_worker_port=free_ports(2), spark_worker_ui_port=free_ports(2))
