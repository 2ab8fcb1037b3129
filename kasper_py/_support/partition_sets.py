"""A static partition set as a label (``Config.partition_set``, the transactional id's
tail): ranges like ``0-3,7``, and the transactional id it makes. Here so a promotion can
name another loop's set, and its id, too.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["partition_label", "transactional_id_of"]


def partition_label(partitions: Iterable[int]) -> str:
    """``0-3,7`` for 0, 1, 2, 3 and 7 (sorted, duplicates dropped)."""
    spans: list[list[int]] = []
    for partition in sorted(set(partitions)):
        if spans and spans[-1][1] == partition - 1:
            spans[-1][1] = partition
        else:
            spans.append([partition, partition])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def transactional_id_of(name: str, label: str) -> str:
    """``<name>@<label>``: the exactly-once producer's id of the loop of processor
    ``name`` running the partition set ``label`` (``Config.transactional_id``)."""
    return f"{name}@{label}"
