"""The batching, timing and async settings of ``Config`` checked (``kasper_py.config``).
A bad one is a ``ConfigError`` naming it.
"""

from __future__ import annotations

import math
from typing import Any

from kasper_py.exceptions import ConfigError

__all__ = ["MAX_BATCH", "check_batch_settings"]

MAX_BATCH = 1_000_000
"""The largest ``batch_size``: confluent-kafka's cap on one ``consume()`` call."""


def check_batch_settings(config: Any) -> None:
    """``config``'s batch size and bytes, its waits and timeouts in seconds, its async
    concurrency and ``auto_offset_reset``."""
    size = config.batch_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                             or not 1 <= size <= MAX_BATCH):
        raise ConfigError("batch_size", f"must be an int in 1..{MAX_BATCH} or None "
                          f"(chosen for you), got {size!r}")
    limit = config.batch_bytes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError("batch_bytes", f"must be a positive int of bytes, got {limit!r}")
    for name in ("batch_wait", "delivery_timeout", "repartition_purge_interval"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(name, f"must be a positive number of seconds, got {value!r}")
    for name in ("max_latency", "idle_advance", "async_timeout"):
        value = getattr(config, name)
        if value is not None and not _is_seconds(value, above=0):
            raise ConfigError(name, "must be a positive, finite number of seconds or "
                              f"None, got {value!r}")
    if config.max_task_idle is not None and not _is_seconds(config.max_task_idle, above=None):
        raise ConfigError("max_task_idle", "must be a finite number of seconds >= 0 or "
                          f"None (no alignment), got {config.max_task_idle!r}")
    count = config.async_concurrency
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError("async_concurrency", f"must be a positive int, got {count!r}")
    if config.auto_offset_reset not in ("earliest", "latest"):
        raise ConfigError("auto_offset_reset",
                          f"must be 'earliest' or 'latest', got {config.auto_offset_reset!r}")


def _is_seconds(value: object, *, above: float | None) -> bool:
    """``value`` is a finite number of seconds (not a bool), past ``above`` (> it), or
    >= 0 when ``above`` is None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (value > above if above is not None else value >= 0) and value < math.inf
