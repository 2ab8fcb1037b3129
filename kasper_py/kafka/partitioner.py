"""Kafka's murmur2 hash, the Java client's (and librdkafka's ``murmur2_random``)
partitioner for keyed records: the one copy the in-memory broker, query routing and the
streams DSL's packed repartitions use. ``murmur2_partitions`` hashes many keys at once,
vectorised over the lanes of one Python int (bench/bench_hop_parts.py's ``pack_unique``
row): a third to a fifth of the instructions of hashing each key (docs/performance.md;
librdkafka's own function, called through ctypes, costs more in the call than that:
about 8,000 instructions a key).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import groupby, repeat

__all__ = ["murmur2", "murmur2_partition", "murmur2_partitions"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_WORDS = tuple(struct.Struct(f"<{count}I") for count in range(64))
"""The layout of a body of each count of 4-byte words under 64 (keys are short)."""


def murmur2(data: bytes) -> int:
    """The Java client's ``Utils.murmur2(data)``: 32-bit MurmurHash2 with seed
    ``0x9747b28c``, as a signed int like Java's (``murmur2(b"21") == -973932308``)."""
    length = len(data)
    h = _SEED ^ length
    words = length >> 2
    layout = _WORDS[words] if words < len(_WORDS) else struct.Struct(f"<{words}I")
    for word in layout.unpack_from(data):  # the body, read in one call
        k = word * _M & _MASK
        h = (h * _M & _MASK) ^ ((k ^ k >> 24) * _M & _MASK)
    if length & 3:  # Java's switch falls through 3, 2, 1: the tail, little-endian
        h = (h ^ int.from_bytes(data[words << 2:], "little")) * _M & _MASK
    h ^= h >> 13
    h = h * _M & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """``(murmur2(key) & 0x7fffffff) % partitions``: where the Java client puts ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def murmur2_partitions(keys: Sequence[bytes], partitions: int) -> list[int]:
    """``murmur2_partition`` of each of ``keys``, in order, vectorised: the keys of one
    length are hashed together, each step of the hash one big-int operation over all of
    them (a 64-bit lane a key, so no lane carries into the next), not Python a key."""
    if not keys:
        return []
    lengths = set(map(len, keys))
    if len(lengths) == 1:  # keys of one length (ids, say): hashed in their order
        return _lanes_out(_hashed(keys, lengths.pop()), len(keys), partitions)
    found: dict[bytes, int] = {}
    for length, group in groupby(sorted(set(keys), key=len), key=len):
        same = list(group)
        found.update(zip(same, _lanes_out(_hashed(same, length), len(same), partitions),
                         strict=True))
    return list(map(found.__getitem__, keys))


def _hashed(keys: Sequence[bytes], length: int) -> int:
    """murmur2 of ``keys``, each ``length`` bytes, in 64-bit lanes (low 32 bits each)."""
    count, words = len(keys), (length + 3) >> 2
    mask = int.from_bytes(_LANE * count, "little")
    h = int.from_bytes((_SEED ^ length).to_bytes(8, "little") * count, "little")
    if not words:
        return _finished(h, mask)
    data = array("I", b"".join(map(bytes.ljust, keys, repeat(words * 4), repeat(b"\0"))))
    if _SWAP:
        data.byteswap()
    for word in range(length >> 2):  # the body, a word of every key at a time
        k = _lanes_in(data[word::words]) * _M & mask
        k ^= k >> 24 & mask
        h = (h * _M & mask) ^ (k * _M & mask)
    if length & 3:  # the tail, zero-padded: little-endian, Java's switch falling through
        h = (h ^ _lanes_in(data[words - 1::words])) * _M & mask
    return _finished(h, mask)


def _finished(h: int, mask: int) -> int:
    h ^= h >> 13 & mask
    h = h * _M & mask
    return h ^ (h >> 15 & mask)


def _lanes_in(column: array[int]) -> int:
    """32-bit ``column`` as one int of 64-bit lanes, the first lowest."""
    wide = array("Q", column)
    if _SWAP:
        wide.byteswap()
    return int.from_bytes(wide.tobytes(), "little")


def _lanes_out(hashes: int, count: int, partitions: int) -> list[int]:
    """The partition of each of ``count`` 64-bit lanes of murmur2 ``hashes``."""
    wide = array("Q", (hashes & int.from_bytes(_POSITIVE * count, "little")).to_bytes(
        8 * count, "little"))
    if _SWAP:
        wide.byteswap()
    return list(map(int.__mod__, wide.tolist(), repeat(partitions)))


_LANE = b"\xff\xff\xff\xff\0\0\0\0"
"""A lane's 32 bits, little-endian."""
_POSITIVE = b"\xff\xff\xff\x7f\0\0\0\0"
"""A lane's 31 low bits (Java's ``toPositive``)."""
_SWAP = sys.byteorder == "big"
