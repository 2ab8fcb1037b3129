"""The offset range a reprocessing job covers: a half-open ``[start, end)`` per input
topic-partition, planned from earliest / explicit offsets / a time to latest / explicit
offsets / a time (positions resolved by ``kasper_py.kafka.positions``). Planning is
pure: the watermarks and the offsets found for a time come in from ``KafkaAdmin``, so
every check here runs before Spark starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kasper_py.exceptions import ReprocessError
from kasper_py.kafka.positions import OffsetsAtTime, Position, resolve_position, to_millis
from kasper_py.message import TopicPartitionKey

__all__ = ["Position", "RangeError", "ReprocessRange", "plan_range", "to_millis"]

_MAX_LISTED = 5


class RangeError(ReprocessError):
    """The requested range is invalid: a partition that is not an input, an offset outside
    the partition's watermarks, or an end before its start."""


@dataclass(frozen=True)
class ReprocessRange:
    """Start (first offset read) and end (first offset not read) per topic-partition."""

    starts: dict[TopicPartitionKey, int]
    ends: dict[TopicPartitionKey, int]

    @property
    def keys(self) -> list[TopicPartitionKey]:
        """The topic-partitions of the range, sorted."""
        return sorted(self.starts)

    @property
    def partitions(self) -> list[int]:
        """Partition numbers of the range (each spans every input topic)."""
        return sorted({partition for _, partition in self.starts})

    @property
    def messages(self) -> int:
        """Offsets in the range: the message count, unless compaction or transaction
        markers left gaps."""
        return sum(self.ends[key] - self.starts[key] for key in self.starts)

    def spark_offsets(self, which: Literal["start", "end"]) -> str:
        """``startingOffsets``/``endingOffsets`` JSON for Spark's Kafka source."""
        offsets = self.starts if which == "start" else self.ends
        nested: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            nested.setdefault(topic, {})[str(partition)] = offset
        return json.dumps(nested)

    def spark_assign(self) -> str:
        """``assign`` JSON for Spark's Kafka source: the partitions to read per topic."""
        nested: dict[str, list[int]] = {}
        for topic, partition in self.keys:
            nested.setdefault(topic, []).append(partition)
        return json.dumps(nested)

    def describe(self) -> str:
        """``topic[p] start..end`` for every partition, for logs and errors."""
        return ", ".join(f"{t}[{p}] {self.starts[t, p]}..{self.ends[t, p]}"
                         for t, p in self.keys)


def plan_range(
    watermarks: Mapping[TopicPartitionKey, tuple[int, int]],
    start: Position,
    end: Position,
    offsets_at: OffsetsAtTime,
) -> ReprocessRange:
    """Resolve ``start`` and ``end`` over the partitions in ``watermarks`` (low, high).

    Raises ``RangeError`` naming every partition whose start or end falls outside its
    watermarks or whose end comes before its start, and any unknown topic-partition.
    """
    keys = sorted(watermarks)
    starts = _resolve("start", start, keys, watermarks, offsets_at)
    ends = _resolve("end", end, keys, watermarks, offsets_at)
    problems = [*_outside(starts, ends, watermarks), *_reversed(starts, ends)]
    if problems:
        listed = "; ".join(problems[:_MAX_LISTED])
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise RangeError(f"invalid reprocessing range: {listed}{more}")
    return ReprocessRange(starts, ends)


def _resolve(
    which: str,
    position: Position,
    keys: Sequence[TopicPartitionKey],
    watermarks: Mapping[TopicPartitionKey, tuple[int, int]],
    offsets_at: OffsetsAtTime,
) -> dict[TopicPartitionKey, int]:
    # Partitions a mapping leaves out start at earliest / end at latest.
    if isinstance(position, Mapping):
        _check_keys(which, position, keys)
    try:
        return resolve_position(position, keys, watermarks, offsets_at,
                                unnamed="low" if which == "start" else "high")
    except ValueError:
        raise RangeError(f"{which} must be 'earliest', 'latest', a datetime or a mapping "
                         f"of (topic, partition) to offset, got {position!r}") from None


def _check_keys(which: str, offsets: Mapping[TopicPartitionKey, int],
                keys: Sequence[TopicPartitionKey]) -> None:
    known = set(keys)
    for key, offset in offsets.items():
        if (not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[0], str)
                or isinstance(key[1], bool) or not isinstance(key[1], int)):
            raise RangeError(f"{which} offsets must be keyed by (topic, partition), got {key!r}")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise RangeError(f"{which} offset of {key[0]}[{key[1]}] must be an int, "
                             f"got {offset!r}")
        if key not in known:
            topics = sorted({t for t, _ in keys})
            partitions = sorted({p for _, p in keys})
            raise RangeError(f"{which} offsets name {key[0]}[{key[1]}], which is not an input "
                             f"partition being reprocessed (topics {topics}, partitions "
                             f"{partitions})")


def _outside(starts: Mapping[TopicPartitionKey, int], ends: Mapping[TopicPartitionKey, int],
             watermarks: Mapping[TopicPartitionKey, tuple[int, int]]) -> list[str]:
    problems = []
    for which, offsets in (("start", starts), ("end", ends)):
        for (topic, partition), offset in sorted(offsets.items()):
            low, high = watermarks[topic, partition]
            if not low <= offset <= high:
                problems.append(f"{which} offset {offset} of {topic}[{partition}] is outside "
                                f"its watermarks {low} (earliest) to {high} (latest)")
    return problems


def _reversed(starts: Mapping[TopicPartitionKey, int],
              ends: Mapping[TopicPartitionKey, int]) -> list[str]:
    return [f"end before start for {topic}[{partition}]: end offset {ends[topic, partition]} "
            f"< start offset {offset}"
            for (topic, partition), offset in sorted(starts.items())
            if ends[topic, partition] < offset]
