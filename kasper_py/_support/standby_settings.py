"""The standby settings of ``Config`` checked (``kasper_py.config``): how many warm
copies each partition's tables have, and which partitions this process keeps warm. A
bad one is a ``ConfigError`` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kasper_py.exceptions import ConfigError

__all__ = ["check_standby_settings"]


def check_standby_settings(config: Any) -> tuple[int, ...] | None:
    """Check ``num_standby_replicas`` and ``standby_partitions``; return the latter
    sorted (``None`` stays ``None``)."""
    replicas = config.num_standby_replicas
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigError("num_standby_replicas", f"must be an int >= 0, got {replicas!r}")
    partitions = config.standby_partitions
    if partitions is None:
        return None
    if isinstance(partitions, str) or not isinstance(partitions, Sequence):
        raise ConfigError("standby_partitions", "must be a list of ints, or None")
    for partition in partitions:
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ConfigError("standby_partitions", f"invalid partition {partition!r}")
    if config.assignment == "group" and partitions:
        raise ConfigError("standby_partitions", "must be None with assignment='group': "
                          "standbys follow the group's members (num_standby_replicas)")
    if config.assignment == "static" and config.input_partitions is None and partitions:
        raise ConfigError("standby_partitions", "this process owns every partition "
                          "(input_partitions=None): it has none to keep warm")
    owned = set(config.input_partitions or ())
    if owned & set(partitions):
        raise ConfigError("standby_partitions", "a partition this process owns cannot be "
                          f"its standby too: {sorted(owned & set(partitions))}")
    return tuple(sorted(set(partitions)))
