"""Where a group member keeps standby replicas, by a rule independent of the assignor:
each partition is hashed with each member that does not own it (rendezvous hashing),
and the ``replicas`` members with the highest scores keep it warm. Every member that
learns the same live members and owners computes the same placement, so no member
has to announce a choice before the others can route stale queries to it.

With ``replicas >= members - 1`` every member warms every partition it does not own.
Otherwise, when the owner dies and the assignor hands its partition to one of the
``members - 1`` survivors without regard to this rule, that survivor holds a warm copy
with probability ``replicas / (members - 1)`` (``warm_owner_probability``).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import KasperError
from kasper_py.kafka.admin import GroupMember, GroupState, KafkaAdmin

__all__ = ["MemberPlacement", "WarmEndpoints", "group_placement", "standby_placement",
           "warm_members", "warm_owner_probability"]

_log = structlog.get_logger("kasper_py")


def _score(member: str, topic: str, partition: int) -> int:
    digest = hashlib.blake2b(f"{topic}\x00{partition}\x00{member}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


def standby_placement(topic: str, owners: Mapping[int, str], members: Iterable[str],
                      replicas: int) -> dict[str, tuple[int, ...]]:
    """The partitions each of ``members`` keeps warm: for each partition in ``owners``
    (partition -> owning member), the ``replicas`` non-owning members with the highest
    rendezvous score. Every member appears in the result, with ``()`` if it keeps
    nothing warm."""
    live = sorted(set(members))
    placed: dict[str, list[int]] = {member: [] for member in live}
    for partition, owner in sorted(owners.items()):
        for member in _ranked(topic, partition, owner, live)[:max(replicas, 0)]:
            placed[member].append(partition)
    return {member: tuple(partitions) for member, partitions in placed.items()}


def _ranked(topic: str, partition: int, owner: str, members: Iterable[str]) -> list[str]:
    """The members but ``owner``, highest rendezvous score for ``partition`` first."""
    others = [member for member in members if member != owner]
    return sorted(others, key=lambda member: _score(member, topic, partition), reverse=True)


def warm_members(state: GroupState, topic: str, partition: int, replicas: int
                 ) -> list[GroupMember]:
    """The members of the group ``state`` describes that keep ``partition`` of ``topic``
    warm (``group_placement``), the highest score first; none while no member owns it."""
    owners = _owners(state, topic)
    if partition not in owners:
        return []
    by_name = {m.describe(): m for m in state.members}
    ranked = _ranked(topic, partition, owners[partition], sorted(by_name))
    return [by_name[name] for name in ranked[:max(replicas, 0)]]


def group_placement(state: GroupState, topic: str, replicas: int
                    ) -> dict[str, tuple[int, ...]]:
    """``standby_placement`` of ``topic`` over the group ``KafkaAdmin.group`` described,
    by member (``client-id@host``)."""
    return standby_placement(topic, _owners(state, topic),
                             (m.describe() for m in state.members), replicas)


def _owners(state: GroupState, topic: str) -> dict[int, str]:
    """The owner of each assigned partition of ``topic`` in the group ``state``
    describes (``client-id@host``), by partition."""
    return {partition: member for (name, partition), member in state.owners().items()
            if name == topic}


def warm_owner_probability(members: int, replicas: int) -> float:
    """The chance that the member a partition moves to when its owner dies holds a
    warm copy of it, if the assignor picks any of the ``members - 1`` survivors."""
    survivors = members - 1
    if survivors <= 0:
        return 0.0
    return min(replicas, survivors) / survivors


class MemberPlacement:
    """What this group member keeps warm now (``StandbyReplicas``' placement): the
    group described (``KafkaAdmin.group``), this member found by its consumer's client
    id, and ``group_placement`` of the first input topic (the others are co-partitioned
    with it). ``None`` (keep what is kept) while the group cannot be described or the
    member is not in it yet, or when its client id names several members."""

    def __init__(self, config: Config, describe: Callable[[], GroupState] | None = None
                 ) -> None:
        self.config = config
        self.client_id = str(config.to_consumer_conf()["client.id"])
        self._describe = describe
        self._said: str | None = None

    def __call__(self) -> tuple[int, ...] | None:
        if self._describe is None:  # on first use, on the standby thread
            self._describe = KafkaAdmin(self.config, consumer=False).group
        try:
            state = self._describe()
        except KasperError as exc:
            self._say("group not described", error=str(exc))
            return None
        me = [m for m in state.members if m.client_id == self.client_id]
        if len(me) != 1:
            self._say("not in the group yet" if not me else
                      "client.id shared by several members: set one per process",
                      members=len(me))
            return None
        self._said = None
        placed = group_placement(state, self.config.input_topics[0],
                                 self.config.num_standby_replicas)
        return placed.get(me[0].describe(), ())

    def _say(self, reason: str, **details: object) -> None:
        """Log why nothing is placed, once per reason."""
        if reason != self._said:
            self._said = reason
            _log.warning("kasper.standby_not_placed", processor=self.config.name,
                         client_id=self.client_id, reason=reason, **details)


class WarmEndpoints:
    """Where stale queries of a partition go in group mode (``Tables``' ``warm_elsewhere``):
    the query endpoints of the members keeping it warm (``warm_members``), as their client
    ids publish them (``member_client_id``), the first choice first. The group is
    described at most every ``fresh`` seconds (a burst of queries costs one
    ``DescribeConsumerGroups``); a member that publishes no endpoint is left out, and an
    undescribable group gives none."""

    def __init__(self, config: Config, describe: Callable[[], GroupState] | None = None,
                 fresh: float = 2.0) -> None:
        self.config = config
        self._describe = describe
        self._fresh = fresh
        self._lock = threading.Lock()
        self._state: GroupState | None = None
        self._read_at = float("-inf")

    def __call__(self, partition: int) -> list[str]:
        state = self._group()
        if state is None:
            return []
        members = warm_members(state, self.config.input_topics[0], partition,
                               self.config.num_standby_replicas)
        return [m.query_endpoint for m in members if m.query_endpoint]

    def _group(self) -> GroupState | None:
        with self._lock:
            if time.monotonic() - self._read_at > self._fresh:
                if self._describe is None:  # on first use, on a query thread
                    self._describe = KafkaAdmin(self.config, timeout=5.0, consumer=False).group
                try:
                    self._state = self._describe()
                except KasperError as exc:
                    _log.info("kasper.standbys_not_found", processor=self.config.name,
                              error=str(exc))
                    self._state = None
                self._read_at = time.monotonic()
            return self._state
