"""``OutputTopic``: an output topic a processor declares (``Config.output_topics``),
with the partitions, replicas and settings it is created with: a value below both
``config`` (which declares it, and names it publicly) and ``kafka/`` (which creates it).
Checking it against the cluster and creating it is ``kafka/``'s, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kasper_py.exceptions import ConfigError
from kasper_py.serdes import Serde, serde_for

__all__ = ["OutputTopic", "declared_topics", "value_serdes"]

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
    value_serde: str | Serde | None = None
    """Encodes the values sent to it, as ``Config.value_serde`` names one (``json``, a
    registry format, a ``Serde``); ``None``: ``Config.value_serde``, which also decodes
    the input. A processor reading bytes (``value_serde="bytes"``) sends JSON this way."""

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
        if self.value_serde is not None and not isinstance(self.value_serde, str | Serde):
            raise ConfigError("output_topics", f"{self.name!r}: value_serde must be a serde "
                              f"name or a Serde, got {self.value_serde!r}")
        # Kafka takes every topic setting as a string; TOML gives numbers and booleans
        object.__setattr__(self, "config", {k: str(v).lower() if isinstance(v, bool) else str(v)
                                            for k, v in self.config.items()})

    @classmethod
    def of(cls, value: OutputTopic | Mapping[str, Any] | str) -> OutputTopic:
        """``value`` as an ``OutputTopic``: one already, a mapping of its fields (a TOML
        table), or ``"NAME[:PARTITIONS][@VALUE_SERDE]"`` (the environment and flags:
        ``"totals"``, ``"totals:6"``, ``"totals:6@json"``, ``"totals@json"``)."""
        if isinstance(value, OutputTopic):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown or "name" not in value:
                raise ConfigError("output_topics", "a declared topic takes name, partitions, "
                                  "replication_factor, config and value_serde, got "
                                  f"{dict(value)!r}")
            return cls(**value)
        if isinstance(value, str):
            head, at, serde = value.partition("@")
            name, sep, count = head.partition(":")
            if (sep and not count.isdigit()) or (at and not serde):
                raise ConfigError("output_topics", f"{value!r} is not NAME, NAME:PARTITIONS, "
                                  "NAME@VALUE_SERDE or NAME:PARTITIONS@VALUE_SERDE")
            return cls(name, int(count) if sep else None, value_serde=serde or None)
        raise ConfigError("output_topics", f"a declared topic is an OutputTopic, a table or "
                          f"'NAME[:PARTITIONS][@VALUE_SERDE]', got {value!r}")


def declared_topics(topics: Any, resolve: Callable[[str | Serde], Serde]
                    ) -> tuple[OutputTopic, ...]:
    """``Config.output_topics`` checked: each as an ``OutputTopic`` (see ``of``), none
    twice, each ``value_serde`` resolved by ``resolve`` (``Config``'s own resolution, so
    a registry format takes ``Config.registry``)."""
    if isinstance(topics, str | Mapping) or not isinstance(topics, Sequence):
        raise ConfigError("output_topics", f"must be a list of declared topics, got {topics!r}")
    declared = tuple(OutputTopic.of(topic) for topic in topics)
    names = [topic.name for topic in declared]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError("output_topics", f"declares {', '.join(map(repr, twice))} twice")
    return tuple(topic if topic.value_serde is None
                 else replace(topic, value_serde=resolve(topic.value_serde))
                 for topic in declared)


def value_serdes(topics: Sequence[OutputTopic]) -> dict[str, Serde]:
    """The value serde of each declared topic that has its own (resolved by ``Config``),
    by topic name: what the ``Sender`` encodes the values sent there with."""
    return {topic.name: serde_for(topic.value_serde) for topic in topics
            if topic.value_serde is not None}
