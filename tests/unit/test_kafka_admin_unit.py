"""``kasper_py.kafka``: positions parsed and resolved one way, the admin's error
mapping and answers (on stand-in clients), and the one murmur2."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kasper_py import Config
from kasper_py.exceptions import AdminError, BrokerUnreachableError, ReprocessError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.offsets import CommitNote, PartitionProgress, start_offset
from kasper_py.kafka.partitioner import murmur2, murmur2_partition
from kasper_py.kafka.positions import parse_offset, parse_position, resolve_position

MARKS = {("t", 0): (10, 50), ("t", 1): (0, 9)}
CONFIG = Config(name="adm", bootstrap_servers="127.0.0.1:1", input_topics=["t"])


@pytest.mark.parametrize(("text", "expected"), [
    ("earliest", "earliest"), (" latest ", "latest"),
    ("1700000000000", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ("2023-11-14T22:13:20", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ("t:0=5,u:1=7", {("t", 0): 5, ("u", 1): 7}),
])
def test_parse_position(text: str, expected: object) -> None:
    """Every text form of a position; a time without a zone is UTC."""
    assert parse_position(text) == expected


def test_parse_position_without_offsets_refuses_them() -> None:
    """``offsets=False`` (``--to``) takes no explicit offsets; the error names the forms."""
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_position("t:0=5", offsets=False)
    with pytest.raises(ValueError, match="TOPIC:PARTITION=OFFSET"):
        parse_offset("t:0=-1")


def test_resolve_position() -> None:
    """earliest/latest from the watermarks, a time from the lookup, explicit offsets
    with the unnamed partitions filled or left out."""
    keys = sorted(MARKS)
    assert resolve_position("earliest", keys, MARKS, dict) == {("t", 0): 10, ("t", 1): 0}
    assert resolve_position("latest", keys, MARKS, dict) == {("t", 0): 50, ("t", 1): 9}
    asked: list[int] = []
    found = resolve_position(datetime(1970, 1, 1, 0, 0, 1), keys, MARKS,
                             lambda ms: asked.append(ms) or {("t", 0): 20, ("t", 1): 9})
    assert found == {("t", 0): 20, ("t", 1): 9} and asked == [1000]
    named = {("t", 1): 3}
    assert resolve_position(named, keys, MARKS, dict) == {("t", 1): 3}
    assert resolve_position(named, keys, MARKS, dict, unnamed="high") == {("t", 0): 50,
                                                                          ("t", 1): 3}
    with pytest.raises(ValueError, match="not a position"):
        resolve_position(42, keys, MARKS, dict)  # type: ignore[arg-type]


def test_start_offset_and_progress() -> None:
    """Nothing committed, or a committed offset below the low watermark, starts where
    auto_offset_reset points; lag counts from there."""
    assert start_offset(None, 10, 50, "earliest") == 10
    assert start_offset(None, 10, 50, "latest") == 50
    assert start_offset(30, 10, 50, "latest") == 30
    # A committed offset whose records were deleted resets, as the consumer does.
    assert start_offset(5, 10, 50, "earliest") == 10
    assert start_offset(5, 10, 50, "latest") == 50
    assert PartitionProgress("t", 0, 5, 10, 50).lag("earliest") == 40
    row = PartitionProgress("t", 0, None, 10, 50)
    assert row.key == ("t", 0) and row.start("earliest") == 10 and row.lag("earliest") == 40


class FakeConsumer:
    """Answers committed/watermarks, or raises a KafkaException with ``error``."""

    def __init__(self, error: int | None = None) -> None:
        self.error = error

    def _raise(self) -> None:
        if self.error is not None:
            raise KafkaException(KafkaError(self.error))

    def committed(self, tps: list[Any], timeout: float) -> list[Any]:
        self._raise()
        note = CommitNote("running", 1.0, "h", 1).encode()
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition,
                                offset=-1 if tp.partition else 7, metadata=note) for tp in tps]

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self._raise()
        return MARKS[tp.topic, tp.partition]

    def close(self) -> None:
        pass


def admin_with(consumer: FakeConsumer, **kwargs: Any) -> KafkaAdmin:
    admin = KafkaAdmin(CONFIG, timeout=0.1, **kwargs)
    admin._consumer.close()
    admin._consumer = consumer
    return admin


def test_progress_reads_committed_notes_and_watermarks() -> None:
    """One row per partition: committed offset (None when nothing is), watermarks, note."""
    rows = admin_with(FakeConsumer()).progress(sorted(MARKS))
    assert [(r.key, r.committed, r.low, r.high) for r in rows] == [
        (("t", 0), 7, 10, 50), (("t", 1), None, 0, 9)]
    assert rows[0].note is not None and rows[0].note.state == "running"


@pytest.mark.parametrize(("code", "kind"), [(KafkaError._TRANSPORT, BrokerUnreachableError),
                                            (KafkaError.UNKNOWN, AdminError)])
def test_kafka_errors_are_mapped_once(code: int, kind: type[Exception]) -> None:
    """A KafkaException becomes BrokerUnreachableError when no broker answered, else
    AdminError; Kafka's code is kept and the message says what was asked."""
    with pytest.raises(kind, match=r"reading the offsets of group .adm. on 127\.0\.0\.1:1") as info:
        admin_with(FakeConsumer(code)).committed([("t", 0)])
    assert info.value.code == code  # type: ignore[attr-defined]


def test_a_front_end_chooses_its_exception_classes() -> None:
    """The reprocessing driver's admin raises ReprocessError."""
    admin = admin_with(FakeConsumer(KafkaError.UNKNOWN), failure=ReprocessError)
    with pytest.raises(ReprocessError):
        admin.watermarks([("t", 0)])


def test_murmur2_matches_the_java_client() -> None:
    """The one murmur2: Java's Utils.murmur2 and its partitioner."""
    assert murmur2(b"21") == -973932308
    assert murmur2_partition(b"21", 1) == 0
    assert all(0 <= murmur2_partition(bytes([i]), 7) < 7 for i in range(50))
