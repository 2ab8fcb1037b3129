"""Group mode's co-partitioning: a member runs partition p only once the group has
assigned it p of every input topic read together with one it holds (p's
co-partitioned peers: ``Config.input_groups``; every input topic when unset). ``PeerWait`` keeps the
partitions held without all their peers, waiting (their topics paused by the
assignment), and fails past ``peer_wait_seconds`` naming what was assigned, what is
missing and the assignor in force. Opening, pausing and resuming stay in ``assignment``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import TopicError
from kasper_py.message import TopicPartitionKey

__all__ = ["PEER_WAIT_MARGIN", "GroupAssignor", "PeerWait", "peer_wait_seconds"]

_log = structlog.get_logger("kasper_py")

PEER_WAIT_MARGIN = 15.0
"""Seconds ``peer_wait_seconds`` adds to the longest a previous owner may keep the
peers: three of the coordinator's heartbeat intervals (5 s by default), in which it
tells this member of what was released."""
_SESSION_TIMEOUT_MS = 45_000
"""The default session timeout (``session.timeout.ms``; KIP-848: the broker's
``group.consumer.session.timeout.ms``): how long a dead owner keeps its partitions."""


def peer_wait_seconds(conf: Mapping[str, object]) -> float:
    """How long a partition waits for its peers, from the consumer settings ``conf``: the
    longest the group lets the member holding them keep them (the rebalance timeout,
    ``max.poll.interval.ms``, within which a live member gives up what it is asked to,
    between two turns; the session timeout for a dead one), plus ``PEER_WAIT_MARGIN``.
    At the defaults of group mode: 300 + 15 s. The KIP-848 coordinator hands a joining
    member each partition as its previous owner releases it, so the peers of a
    partition can arrive one rebalance after it, in any order."""
    rebalance_ms = int(str(conf.get("max.poll.interval.ms", 300_000)))
    session_ms = int(str(conf.get("session.timeout.ms", _SESSION_TIMEOUT_MS)))
    return max(rebalance_ms, session_ms) / 1000 + PEER_WAIT_MARGIN


@dataclass(frozen=True)
class GroupAssignor:
    """The group protocol and the assignor in force, from the consumer settings."""

    protocol: str
    setting: str
    """``group.remote.assignor`` (KIP-848), ``partition.assignment.strategy`` (classic)."""
    assignor: str | None
    """``None``: not set, the broker's default (KIP-848)."""

    @classmethod
    def of(cls, conf: Mapping[str, object]) -> GroupAssignor:
        protocol = str(conf.get("group.protocol", "classic"))
        setting = ("partition.assignment.strategy" if protocol == "classic"
                   else "group.remote.assignor")
        value = conf.get(setting)
        return cls(protocol, setting, None if value is None else str(value))

    @property
    def co_partitions(self) -> bool:
        """True for ``range`` (classic: first in the list, the one the members agree
        on), which gives partition p of every topic to one member when all subscribe to
        the same topics."""
        return (self.assignor or "").split(",")[0].strip() == "range"

    def __str__(self) -> str:
        return (f"group.protocol={self.protocol}, "
                f"{self.setting}={self.assignor or '(the broker default)'}")


class PeerWait:
    """The partitions of ``config``'s input topics a member holds without all their
    peers, each with when (on ``clock``) it began waiting; ``check`` fails those past
    ``bound`` seconds (``peer_wait_seconds``)."""

    def __init__(self, config: Config, clock: Callable[[], float],
                 keys: Callable[[Sequence[int]], list[TopicPartitionKey]]) -> None:
        self._name, self._group = config.name, config.group
        self._topics = list(config.input_topics)
        self._groups = [set(g) for g in config.input_groups or (config.input_topics,)]
        self._keys = keys
        """The input topics' keys of some partition numbers (``InputConsumer.keys``)."""
        conf = config.to_consumer_conf()
        self.assignor, self.bound = GroupAssignor.of(conf), peer_wait_seconds(conf)
        self._clock = clock
        self._since: dict[int, float] = {}

    @property
    def waiting(self) -> list[int]:
        """The partitions waiting for their peers."""
        return sorted(self._since)

    def split(self, partitions: Iterable[int], held: Collection[TopicPartitionKey]
              ) -> tuple[list[int], list[int]]:
        """Of ``partitions``, those ``held`` of every topic (ready to run), and the others."""
        ready: list[int] = []
        short: list[int] = []
        for p in sorted(set(partitions)):
            (ready if not self._missing([p], held) else short).append(p)
        return ready, short

    def wait(self, partitions: Sequence[int], held: Collection[TopicPartitionKey]) -> None:
        """``partitions`` are ``held`` without all their peers: they wait from now (one
        already waiting keeps its start)."""
        new = [p for p in partitions if p not in self._since]
        now = self._clock()
        self._since.update(dict.fromkeys(new, now))
        if new:
            _log.info("kasper.waiting_for_peers", processor=self._name,
                      held=_names(self._held(new, held)),
                      missing=_names(self._missing(new, held)), seconds=self.bound)

    def arrived(self, partitions: Iterable[int]) -> list[int]:
        """Of ``partitions`` (now held of every topic), those that were waiting: forgotten."""
        return [p for p in sorted(set(partitions)) if self._since.pop(p, None) is not None]

    def forget(self, partitions: Iterable[int]) -> None:
        """``partitions`` are revoked: they wait no more."""
        for p in partitions:
            self._since.pop(p, None)

    def check(self, held: Collection[TopicPartitionKey]) -> None:
        """Raise ``TopicError`` when a partition has waited more than ``bound`` seconds."""
        if not self._since:
            return
        now = self._clock()
        late = [p for p, since in sorted(self._since.items()) if now - since > self.bound]
        if late:
            raise TopicError(self._late(late, held))

    def _late(self, late: list[int], held: Collection[TopicPartitionKey]) -> str:
        """What was assigned, what is missing, the assignor in force, and what to do."""
        said = (f"the group assigned {self._held(late, held)} to this member without "
                f"their co-partitioned peers {self._missing(late, held)}, which had not "
                f"come after {self.bound:g} s (group {self._group!r}, {self.assignor}): "
                "a partition runs only with every input topic's partition of its number. ")
        if not self.assignor.co_partitions:
            return said + (f"Use the range assignor ({self.assignor.setting}=range, the "
                           "default of group mode; see Config.assignment), which gives "
                           "partition p of every input topic to one member.")
        return said + (f"The range assignor is in force: it co-partitions members that "
                       f"subscribe to the same topics, so a member of group "
                       f"{self._group!r} reads other topics (another processor, or "
                       "another version of this one, with the same group id?). `kasper "
                       "lag` shows which member holds each partition.")

    def _held(self, partitions: Iterable[int], held: Collection[TopicPartitionKey]
              ) -> list[TopicPartitionKey]:
        return [(t, p) for p in partitions for t in self._topics if (t, p) in held]

    def _missing(self, partitions: Iterable[int], held: Collection[TopicPartitionKey]
                 ) -> list[TopicPartitionKey]:
        """The peers of ``partitions`` not ``held``: of each group read together that
        has a key held, its other keys."""
        missing = []
        for p in partitions:
            keys = self._keys([p])
            for group in self._groups:
                mine = [tp for tp in keys if tp[0] in group]
                if any(tp in held for tp in mine):
                    missing += [tp for tp in mine if tp not in held]
        return sorted(set(missing), key=_keys_order(self._topics))


def _keys_order(topics: Sequence[str]) -> Callable[[TopicPartitionKey], tuple[int, int]]:
    """Orders keys by partition, then by the topic's place in ``topics``."""
    place = {t: i for i, t in enumerate(topics)}
    return lambda tp: (tp[1], place[tp[0]])


def _names(keys: Iterable[TopicPartitionKey]) -> list[str]:
    return [f"{t}[{p}]" for t, p in keys]
