"""A static partition set as a label (``Config.partition_set``, the transactional id's
tail): ranges like ``0-3,7``. Here so a promotion can name another loop's set too.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["partition_label"]


def partition_label(partitions: Iterable[int]) -> str:
    """``0-3,7`` for 0, 1, 2, 3 and 7 (sorted, duplicates dropped)."""
    spans: list[list[int]] = []
    for partition in sorted(set(partitions)):
        if spans and spans[-1][1] == partition - 1:
            spans[-1][1] = partition
        else:
            spans.append([partition, partition])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
