"""The loop's standby replicas, chosen once at start: none, the partitions
``Config.standby_partitions`` names, or (group mode, ``Config.num_standby_replicas``)
those the group placement gives this member after each rebalance
(``loop.standby_placement``), kept warm by ``kasper_py.stores.standby`` (imported only
then, so a processor without RocksDB tables needs no rocksdict).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from kasper_py.config import Config
from kasper_py.loop.standby_placement import MemberPlacement
from kasper_py.observability.observe import StoreObserver
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.query import WarmCopy

__all__ = ["NoStandbys", "Standbys", "standbys_for"]


class Standbys(Protocol):
    """Warm copies this process keeps of partitions other processes own."""

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions kept warm."""

    def start(self) -> None:
        """Bring the copies level with where their files stopped, and start tailing."""

    def promote(self, partitions: Collection[int]) -> None:
        """This process is about to open ``partitions`` as their owner: stop keeping them
        warm, their folders handed over so the open reads only the changelog's tail."""

    def revoked(self, partitions: Collection[int]) -> None:
        """This process no longer owns ``partitions``: they may be kept warm again."""

    def close(self) -> None:
        """Stop tailing and close the copies."""

    def queryable(self) -> Mapping[int, Mapping[str, WarmCopy]]:
        """The warm copies by partition and table, for stale queries."""


class NoStandbys:
    """This process keeps nothing warm."""

    partitions: tuple[int, ...] = ()

    def start(self) -> None:
        """Nothing to start."""

    def promote(self, partitions: Collection[int]) -> None:
        """Nothing kept warm to hand over."""

    def revoked(self, partitions: Collection[int]) -> None:
        """Nothing to keep warm."""

    def close(self) -> None:
        """Nothing to stop."""

    def queryable(self) -> dict[int, dict[str, WarmCopy]]:
        """No warm copies."""
        return {}


def standbys_for(config: Config, specs: Sequence[StoreSpec],
                 observer: StoreObserver) -> Standbys:
    """The standby replicas asked for, of the local tables with a changelog: static, the
    partitions of ``config.standby_partitions``; a group member, those the group
    placement gives it (``MemberPlacement``, asked after each rebalance and every
    second); ``NoStandbys`` when there is nothing to keep warm."""
    group = config.group_mode and config.num_standby_replicas > 0
    if not group and not config.standby_partitions:
        return NoStandbys()
    from kasper_py.stores.standby import StandbyReplicas, standby_tables  # noqa: PLC0415

    tables = standby_tables(specs)
    if not tables:
        return NoStandbys()
    if group:
        return StandbyReplicas(config, tables, (), observer,
                               placement=MemberPlacement(config))
    return StandbyReplicas(config, tables, config.standby_partitions or (), observer)
