"""Where a key lives: the input partition a producer chose for it. Two partitioners,
as the producers of the input topic compute them: librdkafka's default
(``consistent_random``: CRC-32 of the key bytes) and the Java client's (``murmur2``).
"""

from __future__ import annotations

import zlib
from typing import get_args

from kasper_py._support.query_settings import Partitioner
from kasper_py.kafka.partitioner import murmur2, murmur2_partition

__all__ = ["PARTITIONERS", "PRODUCERS", "Partitioner", "murmur2", "partition_for"]

PARTITIONERS: tuple[Partitioner, ...] = get_args(Partitioner)
PRODUCERS: dict[Partitioner, str] = {
    "crc32": "librdkafka's default consistent_random: a plain confluent-kafka, Go or .NET "
             "producer",
    "murmur2": "the Java client's default, and kasper_py's own producer's"}
"""Who partitions keys with each partitioner, for hints."""


def partition_for(key: bytes, partitions: int, partitioner: Partitioner) -> int:
    """The partition of ``key`` among ``partitions``.

    ``crc32``: librdkafka's default ``consistent_random`` (confluent-kafka and every
    librdkafka client: Python, Go, .NET, C), ``crc32(key) % partitions``. ``murmur2``:
    the Java client's default (Kafka Streams, Connect, Spring, and librdkafka with
    ``partitioner=murmur2_random``), ``(murmur2(key) & 0x7fffffff) % partitions``.
    An empty key is hashed by ``murmur2``; ``consistent_random`` places it at random
    (as it does null keys), so it has no home there: ``ValueError``.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if partitioner == "crc32":
        if not key:
            raise ValueError("an empty key has no partition with the crc32 partitioner: "
                             "librdkafka's consistent_random places empty keys at random")
        return zlib.crc32(key) % partitions
    if partitioner == "murmur2":
        return murmur2_partition(key, partitions)
    raise ValueError(f"unknown partitioner {partitioner!r}; use one of {PARTITIONERS}")
