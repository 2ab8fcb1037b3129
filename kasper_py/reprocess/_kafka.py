"""The driver's Kafka admin: ``KafkaAdmin`` raising ``ReprocessError`` (and
``BrokerUnreachableError`` when no broker answers), under the driver's client id.
"""

from __future__ import annotations

from kasper_py import exceptions
from kasper_py.config import Config
from kasper_py.exceptions import ReprocessError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.topics import input_partitions
from kasper_py.message import TopicPartitionKey

__all__ = ["BrokerUnreachableError", "KafkaFacts"]


class BrokerUnreachableError(ReprocessError, exceptions.BrokerUnreachableError):
    """Kafka did not answer the driver's requests in time."""


class KafkaFacts(KafkaAdmin):
    """A ``KafkaAdmin`` of the live group for the reprocessing driver."""

    def __init__(self, config: Config, timeout: float = 30.0) -> None:
        super().__init__(config, timeout=timeout, client_id=f"{config.name}-reprocess",
                         failure=ReprocessError, unreachable=BrokerUnreachableError)
        self.config = config

    def input_keys(self) -> list[TopicPartitionKey]:
        """Every (topic, partition) to reprocess; ``TopicError`` as for the live loop when
        a topic is missing, the counts differ or an ``input_partitions`` is missing."""
        return input_partitions(self.config, self.metadata())
