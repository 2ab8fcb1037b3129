"""Key lookups whatever partitioner the input's producers used: the key is looked for
under every partitioner whose partition is held here, answered with a hint naming
``query_partitioner``; a miss names the partitions looked in and the setting."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kasper_py import Config, TopicProcessor
from kasper_py.exceptions import KeyNotFoundError, NotHereError
from kasper_py.query import Lookup, QueryClient, partition_for
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker

from test_query_unit import KeyCount  # isort: skip

PARTITIONS = 4
# keys whose crc32 and murmur2 partitions differ (and one where they agree)
KEYS = [key for key in (f"user-{i}" for i in range(40))
        if partition_for(key.encode(), PARTITIONS, "crc32")
        != partition_for(key.encode(), PARTITIONS, "murmur2")][:6]
SETTING = ('set query_partitioner = "crc32" (TOML, KASPER_QUERY_PARTITIONER=crc32 or '
           'Config(query_partitioner=...))')


def _crc32(key: str) -> int:
    return partition_for(key.encode(), PARTITIONS, "crc32")


def _murmur2(key: str) -> int:
    return partition_for(key.encode(), PARTITIONS, "murmur2")


def _serve(held: list[int], **fields: Any) -> TopicProcessor:
    """A loop holding ``held`` of an input written as confluent-kafka's default
    producer writes it (crc32), each key i counted i + 1 times; defaults otherwise."""
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=PARTITIONS)
    for i, key in enumerate(KEYS):
        for _ in range(i + 1):
            broker.produce("in", b"v", key=key, partition=_crc32(key))
    config = Config(name="q", bootstrap_servers="memory", input_topics=["in"],
                    key_serde="str", query_port=0, input_partitions=held, **fields)
    processor = TopicProcessor(config, KeyCount, stores=[MemoryTable("counts")],
                               clients=broker.clients(config))
    processor.run_loop(until_caught_up=True)
    return processor


@pytest.fixture
def every_partition() -> Iterator[TopicProcessor]:
    processor = _serve(list(range(PARTITIONS)))
    yield processor
    processor.close()


def test_the_keys_partition_differently() -> None:
    """The test's premise: each key's two partitions differ."""
    assert len(KEYS) == 6 and all(_crc32(k) != _murmur2(k) for k in KEYS)


def test_default_settings_find_a_crc32_key_with_a_hint(every_partition: TopicProcessor
                                                       ) -> None:
    """With the default (murmur2) a key a crc32 producer wrote is found in its crc32
    partition, held here; the answer carries a hint naming the setting, in process, over
    HTTP and through the client."""
    key = KEYS[2]
    hint = (f"key {key!r} was found in input partition {_crc32(key)}, where the crc32 "
            "partitioner (librdkafka's default consistent_random: a plain confluent-kafka, "
            f"Go or .NET producer) puts it, not in partition {_murmur2(key)} "
            f"(query_partitioner='murmur2'): {SETTING}")
    assert every_partition.tables.find("counts", key) == Lookup(3, hint)
    assert every_partition.query("counts", key) == 3
    with urllib.request.urlopen(f"{every_partition.endpoint}/tables/counts/{key}") as reply:
        assert json.loads(reply.read()) == {"table": "counts", "key": key, "value": 3,
                                            "hint": hint}
    client = QueryClient(every_partition.endpoint or "")
    assert client.find("counts", key) == Lookup(3, hint)
    assert {k: client.get("counts", k) for k in KEYS} == {k: i + 1 for i, k in enumerate(KEYS)}


def test_the_right_setting_answers_without_a_hint() -> None:
    """``query_partitioner="crc32"`` finds the key where it is: no hint."""
    processor = _serve(list(range(PARTITIONS)), query_partitioner="crc32")
    try:
        assert processor.tables.find("counts", KEYS[0]) == Lookup(1, None)
    finally:
        processor.close()


def test_a_key_absent_everywhere_names_both_partitions(every_partition: TopicProcessor
                                                       ) -> None:
    """A key in neither partition: 404 naming the partitions looked in, no setting (both
    were looked in)."""
    key = next(k for k in (f"nobody-{i}" for i in range(50)) if _crc32(k) != _murmur2(k))
    with pytest.raises(KeyNotFoundError) as caught:
        every_partition.tables.get("counts", key)
    assert str(caught.value) == (
        f"table 'counts' has no value for key {key!r} (looked in input partition "
        f"{_murmur2(key)} (murmur2) and {_crc32(key)} (crc32))")


def test_a_miss_names_the_setting_when_the_other_partition_is_elsewhere() -> None:
    """This instance holds the key's murmur2 partition only: the miss says where a crc32
    producer put the key and which setting routes lookups there."""
    key = KEYS[0]
    processor = _serve([_murmur2(key)])
    try:
        with pytest.raises(KeyNotFoundError) as caught:
            processor.tables.get("counts", key)
    finally:
        processor.close()
    assert str(caught.value) == (
        f"table 'counts' has no value for key {key!r} (looked in input partition "
        f"{_murmur2(key)} (murmur2)); if the input's producers use the crc32 partitioner "
        "(librdkafka's default consistent_random: a plain confluent-kafka, Go or .NET "
        f"producer), the key is in partition {_crc32(key)}, not held here: {SETTING}")


def test_a_key_held_elsewhere_under_the_setting_is_not_here() -> None:
    """Neither partition held here, key not found here: 421 for the configured
    partitioner's partition, as before."""
    key = KEYS[0]
    rest = [p for p in range(PARTITIONS) if p not in (_murmur2(key), _crc32(key))]
    processor = _serve(rest[:1])
    try:
        with pytest.raises(NotHereError, match=rf"input partition {_murmur2(key)} "
                                               r"\(murmur2 partitioner\)"):
            processor.tables.get("counts", key)
    finally:
        processor.close()
