"""What the examples share to write their sample input: creating its topics. Not part of
the library, and no example of its own."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient, NewTopic


def create_topics(bootstrap: str, topics: Sequence[str], partitions: int,
                  config: Mapping[str, str] | None = None) -> None:
    """Create ``topics`` with ``partitions`` each (and the topic settings ``config``); an
    existing topic is fine for a sample (noted on stderr)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(t, partitions, 1, config=dict(config or {})) for t in topics]
    for future in admin.create_topics(new).values():
        try:
            future.result(30)
        except Exception as exc:  # an existing topic is fine for a sample
            print(f"note: {exc}", file=sys.stderr)
