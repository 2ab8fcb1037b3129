"""Which instance holds a partition: the endpoint each running loop announces in its
commit note (``CommitNote.endpoint``), read with an admin client of the query thread's
own, in both assignment modes.

Why the commit note in group mode too: the group's member metadata names a client id
and an IP, not a port, and librdkafka's Python client has no way to add user data to
the assignment; every loop commits its note on each turn and at least every
``HEARTBEAT_SECONDS`` when idle, for exactly the partitions it holds, so the newest
running note of a partition names its owner (after a rebalance, once the new owner's
first commit lands).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kasper_py._client_log import with_client_log
from kasper_py.config import Config
from kasper_py.offsets import CommitNote, running_window

__all__ = ["Locator"]

_FRESH_SECONDS = 2.0
"""How long the notes read once answer every query (a burst of redirects costs one read)."""
_TIMEOUT = 5.0


class Locator:
    """Endpoints announced by running loops of ``config.name``, per input partition."""

    def __init__(self, config: Config, own_endpoint: str | None) -> None:
        self.config = config
        self.own_endpoint = own_endpoint
        self._lock = threading.Lock()
        self._admin: Any = None
        self._read_at = float("-inf")
        self._endpoints: dict[int, str] = {}

    def endpoint(self, partition: int, partitions: int) -> str | None:
        """The URL of the running loop that holds ``partition`` (of ``partitions``), or
        ``None`` when none announced one (not running, stale note, no metrics port)."""
        with self._lock:
            if time.monotonic() - self._read_at > _FRESH_SECONDS:
                self._endpoints = self._read(partitions)
                self._read_at = time.monotonic()
            return self._endpoints.get(partition)

    def _read(self, partitions: int) -> dict[int, str]:
        """One ``ListConsumerGroupOffsets`` of the first input topic's partitions."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: PLC0415

        topic = self.config.input_topics[0]
        request = ConsumerGroupTopicPartitions(
            self.config.group, [TopicPartition(topic, p) for p in range(partitions)])
        try:
            future = self._client().list_consumer_group_offsets([request])
            result = next(iter(future.values())).result(_TIMEOUT)
        except Exception:  # unknown owner: the caller answers 421
            return {}
        window, found = running_window(self.config), {}
        for tp in result.topic_partitions:
            note = CommitNote.decode(getattr(tp, "metadata", None))
            if (note is not None and note.endpoint and note.running_within(window)
                    and note.endpoint != self.own_endpoint):
                found[tp.partition] = note.endpoint
        return found

    def _client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient  # noqa: PLC0415

            self._admin = AdminClient(with_client_log(self.config.to_admin_conf(),
                                                      self.config.name, "admin"))
        return self._admin
