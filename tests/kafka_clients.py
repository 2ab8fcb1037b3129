"""The raw confluent-kafka clients tests build themselves (to produce input, read
output and committed offsets, create or inspect topics), each given the library's
client log (``kasper_py.kafka.client_log``) as the library's own clients are: without
it librdkafka prints its lines (``%6|...|BGQUEUE|...``) straight to the run's stderr,
outside any test's captured output. Import these instead of confluent-kafka's."""

from __future__ import annotations

from typing import Any

import confluent_kafka
from confluent_kafka import admin

from kasper_py.kafka.client_log import with_client_log

__all__ = ["AdminClient", "Consumer", "Producer"]

_PROCESSOR = "kasper-tests"
"""The ``processor`` of the client log lines of tests' own clients."""


class Producer(confluent_kafka.Producer):
    """``confluent_kafka.Producer`` logging through the library's client log."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(with_client_log(conf, _PROCESSOR, "producer"))


class Consumer(confluent_kafka.Consumer):
    """``confluent_kafka.Consumer`` logging through the library's client log."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(with_client_log(conf, _PROCESSOR, "consumer"))


class AdminClient(admin.AdminClient):
    """``confluent_kafka.admin.AdminClient`` logging through the library's client log."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(with_client_log(conf, _PROCESSOR, "admin"))
