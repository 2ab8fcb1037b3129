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
from collections.abc import Iterable, Mapping

from kasper_py.kafka.admin import GroupState

__all__ = ["group_placement", "standby_placement", "warm_owner_probability"]


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
    if replicas <= 0:
        return dict.fromkeys(live, ())
    for partition, owner in sorted(owners.items()):
        others = [member for member in live if member != owner]
        others.sort(key=lambda member: _score(member, topic, partition), reverse=True)
        for member in others[:replicas]:
            placed[member].append(partition)
    return {member: tuple(partitions) for member, partitions in placed.items()}


def group_placement(state: GroupState, topic: str, replicas: int
                    ) -> dict[str, tuple[int, ...]]:
    """``standby_placement`` of ``topic`` over the group ``KafkaAdmin.group`` described,
    by member (``client-id@host``)."""
    owners = {partition: member for (name, partition), member in state.owners().items()
              if name == topic}
    return standby_placement(topic, owners, (m.describe() for m in state.members),
                             replicas)


def warm_owner_probability(members: int, replicas: int) -> float:
    """The chance that the member a partition moves to when its owner dies holds a
    warm copy of it, if the assignor picks any of the ``members - 1`` survivors."""
    survivors = members - 1
    if survivors <= 0:
        return 0.0
    return min(replicas, survivors) / survivors
