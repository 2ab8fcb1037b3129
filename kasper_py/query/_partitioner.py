"""Where a key lives: the input partition a producer chose for it. Two partitioners,
as the producers of the input topic compute them: librdkafka's default
(``consistent_random``: CRC-32 of the key bytes) and the Java client's (``murmur2``).
"""

from __future__ import annotations

import zlib
from typing import Literal

__all__ = ["PARTITIONERS", "Partitioner", "murmur2", "partition_for"]

Partitioner = Literal["crc32", "murmur2"]
PARTITIONERS: tuple[Partitioner, ...] = ("crc32", "murmur2")

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """The Java client's ``Utils.murmur2(data)``: 32-bit MurmurHash2 with seed
    ``0x9747b28c``, as a signed int like Java's (``murmur2(b"21") == -973932308``)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    body = length - length % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length % 4
    if tail:
        for i in range(tail - 1, -1, -1):  # Java's switch falls through 3, 2, 1
            h ^= data[body + i] << (8 * i)
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


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
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    raise ValueError(f"unknown partitioner {partitioner!r}; use one of {PARTITIONERS}")
