"""``OffsetTracker``: what has been committed per topic-partition, so a commit
that would move an offset backwards fails loudly instead of replaying silently.
"""

from __future__ import annotations

from kasper_py.exceptions import OffsetError

__all__ = ["OffsetTracker"]

TopicPartitionKey = tuple[str, int]


class OffsetTracker:
    """Remembers the next offset to read that was last committed, per topic-partition."""

    def __init__(self) -> None:
        self._committed: dict[TopicPartitionKey, int] = {}

    def check(self, next_offsets: dict[TopicPartitionKey, int]) -> None:
        """Raise ``OffsetError`` if any offset is below what was committed before."""
        for (topic, partition), offset in next_offsets.items():
            previous = self._committed.get((topic, partition))
            if previous is not None and offset < previous:
                raise OffsetError(
                    f"refusing to commit {topic}[{partition}] offset {offset}: "
                    f"{previous} was already committed"
                )

    def mark_committed(self, next_offsets: dict[TopicPartitionKey, int]) -> None:
        """Record offsets that the broker accepted."""
        self._committed.update(next_offsets)

    def committed(self, topic: str, partition: int) -> int | None:
        """The next offset to read that this process committed last, or ``None``."""
        return self._committed.get((topic, partition))
