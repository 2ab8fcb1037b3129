"""kasper_py.kafka.partitioner: the one murmur2, a key at a time and vectorised over many
keys, against the Java client's own vectors."""

from __future__ import annotations

import random

import pytest

from kasper_py.kafka.partitioner import murmur2, murmur2_partition, murmur2_partitions

JAVA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"": 275646681,
                b"a-little-bit-long-string": -985981536,
                b"a-little-bit-longer-string": -1486304829,
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
                b"abc": 479470107, b"kafka": -798503068}
"""Kafka's UtilsTest.testMurmur2 vectors (Java's signed ints)."""


def _java_murmur2(data: bytes) -> int:
    """Java's Utils.murmur2, transcribed line by line (the tests' reference)."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    for i in range(len(data) // 4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little") * m & 0xFFFFFFFF
        k = (k ^ k >> 24) * m & 0xFFFFFFFF
        h = (h * m & 0xFFFFFFFF) ^ k
    tail = data[len(data) // 4 * 4:]
    if tail:
        h = (h ^ int.from_bytes(tail, "little")) * m & 0xFFFFFFFF
    h = (h ^ h >> 13) * m & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _java_partition(key: bytes, partitions: int) -> int:
    return (JAVA_MURMUR2[key] & 0x7FFFFFFF) % partitions


def test_murmur2_gives_javas_values() -> None:
    """A key at a time: the Java client's values, signed as Java returns them (and the
    transcription the other tests use as their reference gives them too)."""
    assert {key: murmur2(key) for key in JAVA_MURMUR2} == JAVA_MURMUR2
    assert {key: _java_murmur2(key) for key in JAVA_MURMUR2} == JAVA_MURMUR2
    assert murmur2(b"21") == -973932308


@pytest.mark.parametrize("partitions", [1, 7, 12, 2**31 - 1])
def test_both_partitioners_put_javas_vectors_where_java_does(partitions: int) -> None:
    """The scalar and the vectorised partitioner agree with Java's toPositive % n."""
    keys = list(JAVA_MURMUR2)
    expected = [_java_partition(key, partitions) for key in keys]
    assert [murmur2_partition(key, partitions) for key in keys] == expected
    assert murmur2_partitions(keys, partitions) == expected


def test_vectorised_partitions_equal_the_scalar_ones_on_random_keys() -> None:
    """Keys of every length from 0 to 80 bytes and a long one past the cached layouts,
    repeated, in any order: each key's partition is the scalar one's, in order."""
    rng = random.Random(34)
    keys = [rng.randbytes(rng.randrange(81)) for _ in range(3000)]
    keys += [rng.randbytes(300), b"\xff" * 7, b"\x00" * 4]
    keys += rng.sample(keys, 500)
    for partitions in (3, 100, 2**31 - 1):
        assert murmur2_partitions(keys, partitions) == [
            murmur2_partition(key, partitions) for key in keys]
    assert [murmur2(key) for key in keys] == [_java_murmur2(key) for key in keys]


def test_no_keys_no_partitions() -> None:
    """An empty batch of new keys hashes nothing."""
    assert murmur2_partitions([], 5) == []
