"""What ``kasper app reset`` removes for an app, worked out from its declarations alone
(no Kafka here): the topics it owns, its groups, its stores' folders, and the external
stores it cannot reset. The CLI (kasper_py.cli.app) checks them against the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kasper_py.app.topology import App
from kasper_py.config import Config
from kasper_py.kafka.topics import leader_group, leader_topic

__all__ = ["ResetScope", "reset_scope"]


@dataclass(frozen=True)
class ResetScope:
    """Everything an app owns under a config: ``repartitions`` and ``changelogs``
    (topics), ``leader`` (topic, if it exists), the ``groups`` whose offsets go, the
    sources (whose offsets move to ``auto_offset_reset`` or ``--to``), its stores'
    local folders (``paths``) and the ``external`` stores (descriptions) left alone."""

    sources: tuple[str, ...]
    repartitions: tuple[str, ...]
    changelogs: tuple[str, ...]
    leader: str
    groups: tuple[str, ...]
    paths: tuple[Path, ...]
    external: tuple[str, ...]

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the app owns, repartitions first."""
        return (*self.repartitions, self.leader, *self.changelogs)


def reset_scope(app: App, config: Config) -> ResetScope:
    """What resetting ``app`` run as ``config.name`` in group ``config.group`` covers."""
    owned = [spec.owned_state(config) for spec in app.stores]
    return ResetScope(
        sources=app.sources,
        repartitions=tuple(r.topic(config.name) for r in app.repartitions.values()),
        changelogs=tuple(topic for state in owned for topic in state.topics),
        leader=leader_topic(config.name),
        groups=(config.group, leader_group(config)),
        paths=tuple(path for state in owned for path in state.paths),
        external=tuple(state.external for state in owned if state.external is not None))
