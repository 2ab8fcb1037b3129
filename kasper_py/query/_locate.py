"""Which instance holds a partition: the endpoint each running loop announces in its
commit note (``CommitNote.endpoint``), read with a ``KafkaAdmin`` of the query thread's
own, in both assignment modes.

Why the commit note in group mode too: the group's member metadata names a client id
and an IP, not a port, and librdkafka's Python client has no way to add user data to
the assignment; every loop commits its note on each turn and at least every
``HEARTBEAT_SECONDS`` when idle, for exactly the partitions it holds, so the newest
running note of a partition names its owner (after a rebalance, once the new owner's
first commit lands). Group standbys, which commit nothing, publish their endpoint in
their client id instead (``member_client_id``), where stale lookups find it
(``Tables``' ``warm_elsewhere``).
"""

from __future__ import annotations

import threading
import time

from kasper_py.config import Config
from kasper_py.exceptions import KasperError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.offsets import running_window

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
        self._admin: KafkaAdmin | None = None
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
        if self._admin is None:
            self._admin = KafkaAdmin(self.config, timeout=_TIMEOUT, consumer=False)
        try:
            notes = self._admin.group_notes(self.config.input_topics[0], partitions)
        except KasperError:  # unknown owner: the caller answers 421
            return {}
        window = running_window(self.config)
        return {partition: note.endpoint for partition, note in notes.items()
                if note is not None and note.endpoint and note.running_within(window)
                and note.endpoint != self.own_endpoint}
