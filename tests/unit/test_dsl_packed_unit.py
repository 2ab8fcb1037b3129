"""Packed repartition records (``kasper_py.dsl.packed``): the frame round trip, a
malformed frame's error, the reading stage taking plain and packed records (of both
shapes) in one batch, partitioning as the producer's, and ``pack_repartitions=False``."""

from __future__ import annotations

import json
import random
import struct
from collections import Counter
from typing import Any

import pytest

from kasper_py.config import Config
from kasper_py.dsl import Builder
from kasper_py.dsl.packed import FRAME_CAP, PACKED, PACKED_KEY, frames, unpack, unpacked
from kasper_py.exceptions import SerdeError
from kasper_py.kafka.batching import decode_batch
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.kafka.sizing import SampledBytes
from kasper_py.message import OutgoingMessage
from kasper_py.serdes import JSON, STRING
from kasper_py.testing import InMemoryBroker, ProcessorDriver, make_message
from kasper_py.topic_processor import TopicProcessor

REPARTITION = "words-by-word-repartition"


def word_count(*, pack: bool = True) -> Builder:
    """Every word of a line through the repartition ``by-word`` (no cache), counted."""
    b = Builder("words", stores="memory", cache=False, pack_repartitions=pack)
    (b.stream("lines").flat_map(lambda _k, line: [(w, 1) for w in line.split()])
        .repartition(name="by-word").group_by_key().count("counts").to_stream().to("counts"))
    return b


def driver_of(builder: Builder, partitions: int = 1, **config: Any) -> ProcessorDriver:
    base = Config(name="words", bootstrap_servers="in-memory:0", input_topics=("lines",),
                  **{"key_serde": "json", "value_serde": "json", **config})
    return ProcessorDriver(builder.build(), config=base, partitions=partitions)


def sent_to(driver: ProcessorDriver, topic: str) -> list[OutgoingMessage]:
    return [m for m in driver.sent if m.topic == topic]


def decoded(messages: list[OutgoingMessage]) -> list[tuple[Any, Any, int | None]]:
    return [(json.loads(m.key or b"null"), json.loads(m.value or b"null"), m.timestamp)
            for m in messages]


def lines(*texts: str) -> list[Any]:
    return [make_message("lines", text, f"doc-{n}", offset=n, timestamp=100 + n)
            for n, text in enumerate(texts)]


# -- the frame ------------------------------------------------------------------------


def test_a_frame_gives_back_its_records_in_order() -> None:
    """Keys and values (empty, ``None``, large), timestamps and headers (a ``None``
    header value too) come back as they went in, in order."""
    records = [(b"k1", b"v1", 5, None), (None, b"", 6, [("h", b"x"), ("n", None)]),
               (b"", None, 7, None), (b"big", b"x" * 100_000, 8, [("\u00e9t\u00e9", b"")])]
    (frame,) = frames(records)
    assert unpack(frame) == [(b"k1", b"v1", 5, ()), (None, b"", 6, (("h", b"x"), ("n", None))),
                             (b"", None, 7, ()), (b"big", b"x" * 100_000, 8,
                                                  (("\u00e9t\u00e9", b""),))]


def test_records_past_the_cap_take_several_frames_each_within_it() -> None:
    """Frames stay within the cap (a record larger than it gets a frame alone), and
    their records, read in turn, are the records in order; alike and unlike sizes."""
    alike = [(b"k%d" % n, b"v" * 20, n, None) for n in range(100)]
    unlike = [(b"k", b"v" * size, n, None) for n, size in enumerate([10, 900, 10, 10, 3000, 5])]
    for records, cap in ((alike, 400), (unlike, 1000), (alike, FRAME_CAP)):
        found = frames(records, cap)
        assert [r[:3] for f in found for r in unpack(f)] == [r[:3] for r in records]
        assert all(len(f) <= cap or len(unpack(f)) == 1 for f in found)
    assert len(frames(alike, 400)) > 1
    assert frames([]) == []
    partials = [(b"k%d" % n, None, n, (("kasper.partial", b"%d" % n),)) for n in range(100)]
    found = frames(partials, 400)
    assert len(found) > 1 and all(len(f) <= 400 for f in found)
    assert [r for f in found for r in unpack(f)] == partials


def v1_frame(records: list[tuple[bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]]
             ) -> bytes:
    """``records`` in a version 1 frame with a headers section, each record's headers
    encoded in turn: what the first version with packing wrote (the layout in
    ``kasper_py.dsl.packed``'s docstring)."""
    n = len(records)
    sections = [struct.pack("<BIB", 1, n, 1), struct.pack(f"<{n}q", *(r[2] for r in records)),
                struct.pack(f"<{n}i", *(len(r[0]) for r in records)),
                struct.pack(f"<{n}i", *(-1 if r[1] is None else len(r[1]) for r in records)),
                *(r[0] for r in records), *(r[1] or b"" for r in records)]
    for *_, headers in records:
        sections.append(struct.pack("<H", len(headers)))
        sections += [struct.pack("<Hi", len(name), len(value)) + name.encode() + value
                     for name, value in headers]
    return b"".join(sections)


def test_a_frame_is_version_2_only_with_a_headers_column() -> None:
    """One header a record, all of one name (a combined count's partial): version 2, a
    headers column; no headers, or headers of several names: version 1, as the first
    version with packing wrote and reads them. Its version 1 frames of one header a
    record read here as they did."""
    partials = [(b"k%d" % n, None, n, (("kasper.partial", b"%d" % n),)) for n in range(5)]
    (column,) = frames(partials)
    assert column[0] == 2 and unpack(column) == partials
    assert frames([(b"k", b"v", 1, None)])[0][0] == 1
    mixed = [*partials[:2], (b"k9", b"v", 9, (("a", b"1"), ("b", b"2")))]
    assert frames(mixed)[0][0] == 1 and unpack(frames(mixed)[0]) == mixed
    assert unpack(v1_frame(partials)) == partials
    assert unpack(v1_frame(mixed)) == mixed


@pytest.mark.parametrize(("frame", "why"), [
    (b"\x03\x01\x00\x00\x00\x00", "frame version 3 is unknown"),
    (b"\x01", "shorter than its head"),
    (frames([(b"key", b"value", 1, None)])[0][:-2], "ends inside its data"),
    (frames([(b"key", b"value", 1, None)])[0][:10], "ends inside the sizes"),
    (frames([(b"key", b"value", 1, None)])[0] + b"!", "1 bytes after its 1 records"),
    (frames([(b"k", b"v", 1, [("name", b"value")])])[0][:-3], "ends inside the headers"),
])
def test_a_malformed_frame_says_what_is_wrong(frame: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        unpack(frame)


# -- the app --------------------------------------------------------------------------


def test_a_turn_sends_one_packed_record_per_partition_and_counts_as_plain() -> None:
    """300 words over 4 partitions: one packed record per partition, each holding the
    words the producer would have put there (murmur2 of the key); the counts, their
    timestamps and the input's committed offsets are those of plain records."""
    text = [" ".join(f"w{(n * 7 + i) % 13}" for i in range(10)) for n in range(30)]
    packed, plain = driver_of(word_count(), 4), driver_of(word_count(pack=False), 4)
    for driver in (packed, plain):
        driver.process(lines(*text))
    outer = sent_to(packed, REPARTITION)
    assert sorted(m.partition for m in outer) == [0, 1, 2, 3]
    assert all(m.key == PACKED_KEY and m.value is None and m.headers
               and m.headers[0][0] == PACKED for m in outer)
    for m in outer:
        inner = unpacked([m])
        assert {murmur2_partition(i.key or b"", 4) for i in inner} == {m.partition}
    assert len(sent_to(plain, REPARTITION)) == 300
    assert sorted(decoded(unpacked(outer))) == sorted(decoded(sent_to(plain, REPARTITION)))
    assert sorted(decoded(sent_to(packed, "counts"))) == sorted(
        decoded(sent_to(plain, "counts")))
    assert {tp: o for tp, o in packed.committed.items() if tp[0] == "lines"} == {
        tp: o for tp, o in plain.committed.items() if tp[0] == "lines"}
    assert {tp: o for tp, o in packed.committed.items() if tp[0] == REPARTITION} == {
        (REPARTITION, p): 1 for p in range(4)}  # each partition's one packed record


def test_pack_repartitions_false_writes_a_plain_record_per_record() -> None:
    driver = driver_of(word_count(pack=False))
    driver.process(lines("a b a"))
    assert [(m.key, m.value, m.headers) for m in sent_to(driver, REPARTITION)] == [
        (b'"a"', b"1", None), (b'"b"', b"1", None), (b'"a"', b"1", None)]


def test_a_timestamp_extractor_gets_plain_records() -> None:
    """Records whose event time an extractor reads from their values cross plain: the
    packed record has no value to read it from."""
    driver = driver_of(word_count(), timestamp_extractor=lambda m: None)
    driver.process(lines("a b"))
    assert [m.headers for m in sent_to(driver, REPARTITION)] == [None, None]


def packed_message(records: list[tuple[Any, Any]], offset: int, key: bytes | None = None
                   ) -> Any:
    """A packed record of ``records``, its key ``key`` (``None``: as the first packing
    version wrote them; ``PACKED_KEY``: as this one does)."""
    (frame,) = frames([(json.dumps(k).encode(), json.dumps(v).encode(), 0, None)
                       for k, v in records])
    return make_message(REPARTITION, None, key, offset=offset, timestamp=500 + offset,
                        headers=((PACKED, frame),))


def plain_message(key: str, offset: int) -> Any:
    return make_message(REPARTITION, b"1", json.dumps(key).encode(), offset=offset,
                        timestamp=500 + offset)


def test_plain_and_packed_records_in_one_batch_are_read_in_order() -> None:
    """What an older version (or a user) wrote plain, and packed records, in one batch
    of the repartition: every record counted in order; a packed record's records take
    its timestamp when theirs is 0."""
    driver = driver_of(word_count())
    driver.process([plain_message("a", 0), packed_message([("b", 1), ("a", 1)], 1),
                    plain_message("b", 2), packed_message([("c", 1)], 3)], encoded=True)
    assert decoded(sent_to(driver, "counts")) == [
        ("a", 1, 500), ("b", 1, 501), ("a", 2, 501), ("b", 2, 502), ("c", 1, 503)]
    assert driver.committed == {(REPARTITION, 0): 4}


@pytest.mark.parametrize("key_serde", ["json", "bytes"])
def test_both_packed_shapes_and_plain_records_are_read_in_one_batch(key_serde: str) -> None:
    """Plain, first-shape packed (null key) and packed (``PACKED_KEY``) records in one
    batch: every record counted, in order, all four offsets committed, with a key serde
    that refuses the packed key (decoded as none) and with one that takes it."""
    driver = driver_of(word_count(), key_serde=key_serde)
    driver.process([plain_message("a", 0), packed_message([("b", 1), ("a", 1)], 1),
                    plain_message("b", 2),
                    packed_message([("c", 1), ("a", 1)], 3, PACKED_KEY)], encoded=True)
    assert decoded(sent_to(driver, "counts")) == [
        ("a", 1, 500), ("b", 1, 501), ("a", 2, 501), ("b", 2, 502), ("c", 1, 503),
        ("a", 3, 503)]
    assert driver.committed == {(REPARTITION, 0): 4}


def test_the_decoder_passes_a_packed_record_on_even_when_it_sets_others_aside() -> None:
    """With ``on_decode_error="skip"`` a packed record is not undecodable input: it goes
    on (no key, no value, its frame), while a record whose key does not decode is set
    aside; the packed key without the packed header, or with a value, is such a record."""
    messages = [packed_message([("a", 1)], 0, PACKED_KEY),
                plain_message("b", 1)._replace(key=b"\xff"),
                plain_message("c", 2)._replace(key=PACKED_KEY), plain_message("d", 3),
                packed_message([("e", 1)], 4, PACKED_KEY)._replace(value=b"1")]
    batch = decode_batch(messages, STRING, JSON, set_aside=True)
    passed, kept = batch.by_partition[0]
    assert (passed.key, passed.value, passed.headers) == (None, None, messages[0].headers)
    assert (kept.key, kept.value) == ('"d"', 1)
    assert [u.offset for u in batch.undecodable] == [1, 2, 4]
    with pytest.raises(SerdeError, match=rf"cannot decode {REPARTITION}\[0\] offset 2"):
        decode_batch(messages[2:], STRING, JSON)


def test_a_malformed_packed_record_fails_the_turn_naming_it() -> None:
    """A packed record whose frame is cut short: ``SerdeError`` naming the topic,
    partition and offset; nothing of the turn sent, its offsets not committed."""
    driver = driver_of(word_count())
    driver.process([plain_message("a", 0)], encoded=True)
    bad = packed_message([("b", 1)], 1)
    bad = bad._replace(headers=((PACKED, bad.headers[0][1][:-1]),))
    sent = len(driver.sent)
    with pytest.raises(SerdeError, match=rf"{REPARTITION}\[0\] offset 2: the frame ends"):
        driver.process([plain_message("c", 1), bad._replace(offset=2)], encoded=True)
    assert len(driver.sent) == sent
    assert driver.committed == {(REPARTITION, 0): 1}


def test_a_packed_value_the_serde_refuses_fails_the_turn_naming_it() -> None:
    driver = driver_of(word_count())
    (frame,) = frames([(b'"a"', b"{not json", 0, None)])
    with pytest.raises(SerdeError, match=rf"packed in {REPARTITION}\[0\] offset 7: json"):
        driver.process([make_message(REPARTITION, None, None, offset=7, timestamp=1,
                                     headers=((PACKED, frame),))], encoded=True)
    assert driver.committed == {}


def test_a_malformed_packed_record_goes_to_the_dead_letter_topic_when_asked() -> None:
    """With ``on_process_error="dead_letter"`` the poison policy applies to a packed
    record as to any bad input: it goes to the dead-letter topic with its original
    header, the records beside it are counted, the batch is committed."""
    driver = driver_of(word_count(), on_process_error="dead_letter",
                       dead_letter_topic="dead")
    bad = packed_message([("b", 1)], 1)
    bad = bad._replace(headers=((PACKED, b"\x09" + bad.headers[0][1][1:]),))
    driver.process([plain_message("a", 0), bad, plain_message("a", 2)], encoded=True)
    assert decoded(sent_to(driver, "counts")) == [("a", 1, 500), ("a", 2, 502)]
    (letter,) = sent_to(driver, "dead")
    assert letter.headers is not None and letter.headers[0] == bad.headers[0]
    assert driver.committed[(REPARTITION, 0)] == 3


class _Read:
    """A consumed record as the consumer hands it (the parts ``SampledBytes`` reads)."""

    def __init__(self, frame: bytes) -> None:
        self._headers = [(PACKED, frame)]

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers


def test_the_batch_byte_limit_weighs_a_packed_record_by_its_frame() -> None:
    """A packed record's key and value are empty, its records in its header: the loop's
    byte limit (``Config.batch_bytes``) weighs the frame."""
    (frame,) = frames([(b"k%d" % n, b"v" * 100, n, None) for n in range(100)])
    assert SampledBytes()([_Read(frame)] * 16) == 16 * len(frame)


def test_one_batch_of_5000_words_over_20_crosses_in_one_packed_record() -> None:
    """test_dsl_cache_unit's rule holds packed: 5,000 words over 20 distinct, counted
    with the cache, send one combined record per word, all 20 in one packed record
    (one partition), and one update per word, the word's count."""
    rng = random.Random(5)
    words = [rng.choice([f"w{i}" for i in range(20)]) for _ in range(5000)]
    b = Builder("words", stores="memory", pack_repartitions=True)
    (b.stream("lines").flat_map_values(str.split).group_by(lambda _k, word: word)
        .count("counts").to_stream().to("counts"))
    driver = ProcessorDriver(b.build(), key_serde="json", value_serde="json")
    driver.process([make_message("lines", " ".join(words[n:n + 10]), timestamp=n + 1)
                    for n in range(0, 5000, 10)])
    (outer,) = sent_to(driver, "words-counts-by-key-repartition")
    assert len(unpacked([outer])) == 20
    assert {w: n for w, n, _ in decoded(sent_to(driver, "counts"))} == Counter(words)
    assert len(sent_to(driver, "counts")) == 20


def test_the_loop_on_the_in_memory_broker_packs_each_partitions_share() -> None:
    """The real loop (``TopicProcessor``) learns the repartition's partition count at
    start: each of 3 partitions gets packed records holding the words murmur2 puts there;
    the counts are exact and every record of both topics is committed."""
    broker = InMemoryBroker()
    broker.create_topic("lines", 3)
    broker.create_topic("counts", 3)
    text = [f"w{n % 5} w{n % 3} x" for n in range(40)]
    for n, line in enumerate(text):
        broker.produce("lines", json.dumps(line), key=json.dumps(f"doc{n}"))
    config = Config(name="words", bootstrap_servers="in-memory", input_topics=["lines"],
                    key_serde="json", value_serde="json", batch_size=7,
                    auto_offset_reset="earliest")
    processor = TopicProcessor(config, word_count().build(), clients=broker.clients(config))
    processor.run_loop(until_caught_up=True)
    processor.close()
    inner = []
    for partition in range(3):
        outer = broker.read(REPARTITION, partition)
        assert all(m.headers[0][0] == PACKED for m in outer)
        keys = [key for m in outer for key, *_ in unpack(m.headers[0][1] or b"")]
        assert {murmur2_partition(key or b"", 3) for key in keys} <= {partition}
        inner += keys
    assert sorted(inner) == sorted(json.dumps(w).encode() for w in " ".join(text).split())
    last = {json.loads(m.key): json.loads(m.value) for m in broker.read("counts")}
    assert last == Counter(" ".join(text).split())
    committed = broker.committed("words")
    for topic in ("lines", REPARTITION):
        for partition in range(3):
            assert committed.get((topic, partition), 0) == broker.watermarks(topic, partition)[1]
