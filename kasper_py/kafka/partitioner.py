"""Kafka's murmur2 hash, the Java client's (and librdkafka's ``murmur2_random``)
partitioner for keyed records: the one copy the in-memory broker and query routing use.
"""

from __future__ import annotations

__all__ = ["murmur2", "murmur2_partition"]

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


def murmur2_partition(key: bytes, partitions: int) -> int:
    """``(murmur2(key) & 0x7fffffff) % partitions``: where the Java client puts ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
