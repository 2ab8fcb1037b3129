"""The input topics checked against cluster metadata (kasper_py.kafka.topics), as the live
loop, the CLI and the reprocess driver all check them: one error type, one wording."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from kasper_py import Config, TopicError
from kasper_py.kafka.topics import input_partitions, owned_partitions, partition_count


def metadata(**partitions: int) -> Any:
    """Cluster metadata as list_topics() gives it: topic -> partition count."""
    return SimpleNamespace(topics={
        topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))
        for topic, count in partitions.items()})


def config(*topics: str, partitions: list[int] | None = None) -> Config:
    """A Config reading ``topics`` (and ``partitions`` of each)."""
    return Config(name="p", bootstrap_servers="h:1", input_topics=list(topics),
                  input_partitions=partitions)


def test_owned_pairs_list_every_topic_and_partition() -> None:
    """Valid input partitions give every owned (topic, partition), topic by topic; none
    configured means all of them."""
    assert input_partitions(config("a", "b", partitions=[2, 0]), metadata(a=4, b=4)) == [
        ("a", 0), ("a", 2), ("b", 0), ("b", 2)]
    assert input_partitions(config("a"), metadata(a=2, other=5)) == [("a", 0), ("a", 1)]


def test_a_missing_topic_is_named_with_the_cluster() -> None:
    """A topic the metadata does not hold names the topic and the bootstrap servers."""
    with pytest.raises(TopicError, match="input topic 'b': does not exist on h:1"):
        partition_count(config("a", "b"), metadata(a=4))


def test_unequal_partition_counts_are_listed() -> None:
    """Topics that disagree on their count cannot be processed partition-wise."""
    with pytest.raises(TopicError, match=re.escape("same partition count to be processed "
                                                   "partition-wise; found a=4, b=2")):
        partition_count(config("a", "b"), metadata(a=4, b=2))


def test_missing_input_partitions_are_named() -> None:
    """Configured partitions past the count are named, with the count."""
    with pytest.raises(TopicError, match=re.escape("input_partitions [9] do not exist: the "
                                                   "input topics ['a'] have 4 partitions")):
        owned_partitions(config("a", partitions=[1, 9]), 4)
    assert owned_partitions(config("a"), 3) == [0, 1, 2]
