"""The loop's standby replicas, chosen once at start: none, or the partitions
``Config.standby_partitions`` names kept warm by ``kasper_py.stores.standby`` (imported
only then, so a processor without RocksDB tables needs no rocksdict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import structlog

from kasper_py.config import Config
from kasper_py.observability.observe import StoreObserver
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.query import WarmCopy

__all__ = ["NoStandbys", "Standbys", "standbys_for"]

_log = structlog.get_logger("kasper_py")


class Standbys(Protocol):
    """Warm copies this process keeps of partitions other processes own."""

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions kept warm."""

    def start(self) -> None:
        """Bring the copies level with where their files stopped, and start tailing."""

    def close(self) -> None:
        """Stop tailing and close the copies."""

    def queryable(self) -> Mapping[int, Mapping[str, WarmCopy]]:
        """The warm copies by partition and table, for stale queries."""


class NoStandbys:
    """This process keeps nothing warm."""

    partitions: tuple[int, ...] = ()

    def start(self) -> None:
        """Nothing to start."""

    def close(self) -> None:
        """Nothing to stop."""

    def queryable(self) -> dict[int, dict[str, WarmCopy]]:
        """No warm copies."""
        return {}


def standbys_for(config: Config, specs: Sequence[StoreSpec],
                 observer: StoreObserver) -> Standbys:
    """The standby replicas ``config.standby_partitions`` asks for, of the local tables
    with a changelog; ``NoStandbys`` when there is nothing to keep warm. A group member
    places none yet: asked for some, it says so in the log."""
    if config.group_mode and config.num_standby_replicas:
        _log.warning("kasper.standby_not_placed", processor=config.name,
                     num_standby_replicas=config.num_standby_replicas,
                     reason="group mode places no standby replicas yet")
    if not config.standby_partitions:
        return NoStandbys()
    from kasper_py.stores.standby import StandbyReplicas, standby_tables  # noqa: PLC0415

    tables = standby_tables(specs)
    if not tables:
        return NoStandbys()
    return StandbyReplicas(config, tables, config.standby_partitions, observer)
