"""The Packer on its own: every record of a batch lands, in order, in the packed record of
the partition murmur2 gives its key, whatever the partition count (a mask a partition
for a few, one pass over the rows for more) and however many keys are new."""

from __future__ import annotations

import random

import pytest

from kasper_py.dsl._packing import Packer
from kasper_py.dsl.packed import PACKED, PACKED_KEY, frames, unpack
from kasper_py.kafka.partitioner import murmur2_partition


def _batch(rng: random.Random, keys: list[bytes], size: int
           ) -> tuple[list[bytes], list[bytes | None], list[int]]:
    chosen = [rng.choice(keys) for _ in range(size)]
    values: list[bytes | None] = [None if n % 7 == 0 else b"v%d" % n for n in range(size)]
    return chosen, values, [1_700_000_000_000 + n for n in range(size)]


@pytest.mark.parametrize("partitions", [1, 2, 4, 5, 12])
def test_each_record_goes_in_order_to_its_keys_partition(partitions: int) -> None:
    """Batches of known keys, of mostly new ones and of a few new ones among known: the
    records of each partition, unpacked, are that partition's records as sent."""
    rng, packer = random.Random(partitions), Packer()
    known = [b"k%d" % n for n in range(50)]
    for keys in (known, [b"new-%d" % n for n in range(400)], [*known, b"late-1", b"l-2"]):
        sent_keys, values, stamps = _batch(rng, keys, 300)
        packed = packer.pack("t", sent_keys, values, stamps, None, partitions)
        assert len({record[3] for record in packed}) == len(packed)
        for topic, value, key, partition, _, _, newest, headers in packed:
            assert (topic, value, key) == ("t", None, PACKED_KEY)
            assert headers[0][0] == PACKED
            wanted = [(k, v, t, ()) for k, v, t in zip(sent_keys, values, stamps, strict=True)
                      if murmur2_partition(k, partitions) == partition]
            assert unpack(headers[0][1]) == wanted
            assert newest == max(t for _, _, t, _ in wanted)
        assert sum(len(unpack(r[7][0][1])) for r in packed) == len(sent_keys)


@pytest.mark.parametrize("odd", [None, [], [("p", b"1"), ("q", b"2")], [("other", b"1")],
                                 [("p", None)], [("p", b"")]], ids=repr)
def test_headers_round_trip_one_each_or_otherwise(odd: list[tuple[str, bytes | None]] | None
                                                  ) -> None:
    """Records with one header each, all of one name (a combined record's partial count,
    encoded and read in C loops), and the same with one record otherwise anywhere (read
    a record at a time): every record's headers come back as they went."""
    one_each = [[("p", b"%d" % n)] for n in range(40)]
    assert [h for *_, h in unpack(frames([(b"k", None, 1, h) for h in one_each])[0])] == [
        tuple(h) for h in one_each]
    for at in (0, 17, 39):
        headers = [*one_each[:at], odd, *one_each[at + 1:]]
        (frame,) = frames([(b"k", b"v", 1, h) for h in headers])
        assert [h for *_, h in unpack(frame)] == [tuple(h or ()) for h in headers]
