"""The input topics checked against cluster metadata, the same way for the live loop,
the CLI and the reprocess driver: every topic exists, all have one partition count (so
partition-wise processing is possible), and the configured partitions exist. Reading the
metadata stays with each caller, whose client and unreachable-broker error differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kasper_py.config import Config
from kasper_py.exceptions import TopicError

__all__ = ["common_partition_count", "input_partitions", "owned_partitions",
           "partition_count"]


def partition_count(config: Config, metadata: Any) -> int:
    """The input topics' one partition count, from ``list_topics()``'s ``metadata``.

    Raises ``TopicError`` naming a missing topic, or every topic's count when they differ.
    """
    counts: dict[str, int] = {}
    for topic in config.input_topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            reason = "does not exist" if meta is None else meta.error.str()
            raise TopicError(f"input topic {topic!r}: {reason} on {config.bootstrap_servers}")
        counts[topic] = len(meta.partitions)
    return common_partition_count(counts)


def common_partition_count(counts: Mapping[str, int]) -> int:
    """The partition count every input topic shares (``counts``: topic -> its count);
    ``TopicError`` listing them when they differ. The in-memory broker checks with it too."""
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{t}={n}" for t, n in counts.items())
        raise TopicError("input topics must have the same partition count to be processed "
                         f"partition-wise; found {listed}")
    return next(iter(counts.values()))


def owned_partitions(config: Config, count: int) -> list[int]:
    """The partition numbers this process owns when the topics have ``count`` each;
    ``TopicError`` names configured ``input_partitions`` past the count."""
    wanted = config.input_partitions
    if wanted is None:
        return list(range(count))
    missing = [p for p in wanted if p >= count]
    if missing:
        raise TopicError(f"input_partitions {missing} do not exist: the input topics "
                         f"{list(config.input_topics)} have {count} partitions")
    return list(wanted)


def input_partitions(config: Config, metadata: Any) -> list[tuple[str, int]]:
    """Every (topic, partition) this process owns, topic by topic; ``TopicError`` as
    ``partition_count`` and ``owned_partitions`` say."""
    owned = owned_partitions(config, partition_count(config, metadata))
    return [(topic, p) for topic in config.input_topics for p in owned]
