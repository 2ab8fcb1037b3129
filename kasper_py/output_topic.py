"""``OutputTopic``: an output topic a processor declares (``Config.output_topics``),
with the partitions, replicas and settings it is created with: a value below both
``config`` (which declares it, and names it publicly) and ``kafka/`` (which creates it).
Checking it against the cluster and creating it is ``kafka/``'s, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kasper_py.exceptions import ConfigError

__all__ = ["OutputTopic"]

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # what Kafka accepts as a topic name


@dataclass(frozen=True)
class OutputTopic:
    """An output topic a processor declares (``Config.output_topics``). ``kasper run
    --create-topics`` creates it when it is absent; every ``kasper run`` refuses to start
    when it is absent otherwise, or exists with another partition count than declared."""

    name: str
    """The topic's name."""
    partitions: int | None = None
    """Its partition count, checked when it exists; ``None``: created with the input
    topics' count (co-partitioned with them), and any count is taken when it exists."""
    replication_factor: int | None = None
    """Replicas it is created with; ``None``: the broker's ``default.replication.factor``."""
    config: Mapping[str, str] = field(default_factory=dict)
    """Topic settings it is created with (``retention.ms``, ``cleanup.policy``...); an
    existing topic's settings are neither checked nor changed."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOPIC.match(self.name):
            raise ConfigError("output_topics", f"{self.name!r} is not a topic name (letters, "
                              "digits, '.', '_' and '-', at most 249)")
        for name in ("partitions", "replication_factor"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError("output_topics", f"{self.name!r}: {name} must be an int "
                                  f">= 1 or None, got {value!r}")
        if not isinstance(self.config, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str | int | float | bool)
                for k, v in self.config.items()):
            raise ConfigError("output_topics", f"{self.name!r}: config must map setting "
                              f"names to values, got {self.config!r}")
        # Kafka takes every topic setting as a string; TOML gives numbers and booleans
        object.__setattr__(self, "config", {k: str(v).lower() if isinstance(v, bool) else str(v)
                                            for k, v in self.config.items()})

    @classmethod
    def of(cls, value: OutputTopic | Mapping[str, Any] | str) -> OutputTopic:
        """``value`` as an ``OutputTopic``: one already, a mapping of its fields (a TOML
        table), or ``"name"`` / ``"name:partitions"`` (the environment and flags)."""
        if isinstance(value, OutputTopic):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown or "name" not in value:
                raise ConfigError("output_topics", f"a declared topic takes name, partitions, "
                                  f"replication_factor and config, got {dict(value)!r}")
            return cls(**value)
        if isinstance(value, str):
            name, sep, count = value.partition(":")
            if sep and not count.isdigit():
                raise ConfigError("output_topics", f"{value!r} is not NAME or "
                                  "NAME:PARTITIONS")
            return cls(name, int(count) if sep else None)
        raise ConfigError("output_topics", f"a declared topic is an OutputTopic, a table or "
                          f"'NAME[:PARTITIONS]', got {value!r}")
