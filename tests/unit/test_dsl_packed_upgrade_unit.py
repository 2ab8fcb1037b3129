"""Packed repartition records across versions: the packed record's key (``PACKED_KEY``)
is refused by every serde a kasper_py older than packing could read it with, but
``bytes``, so an older reader stops on it (test_dsl_packed_older runs one); packing is
the default exactly where that holds; this version reads packed records of both shapes
(the first one's null key, today's ``PACKED_KEY``) and plain ones in one batch
(test_dsl_packed_unit)."""

from __future__ import annotations

from typing import Any

import pytest

from kasper_py.config import Config
from kasper_py.dsl._packing import packer_for, stops_older_readers
from kasper_py.dsl.packed import PACKED_KEY
from kasper_py.exceptions import SerdeError
from kasper_py.registry import AvroSerde, JsonSchemaSerde, ProtobufSerde, RegistryConfig
from kasper_py.serdes import BYTES, JSON, STRING, Serde

REPARTITION = "words-by-word-repartition"
REGISTRY = RegistryConfig(url="http://127.0.0.1:1")
"""No registry answers there: refusing the key must need none."""


def config(**fields: Any) -> Config:
    return Config(name="words", bootstrap_servers="in-memory:0", input_topics=("lines",),
                  **{"key_serde": "json", "value_serde": "json", **fields})


@pytest.mark.parametrize("serde", [
    STRING, JSON, AvroSerde(REGISTRY, field="key"), JsonSchemaSerde(REGISTRY, field="key"),
    ProtobufSerde(REGISTRY, "google.protobuf.timestamp_pb2:Timestamp", field="key"),
    AvroSerde(REGISTRY, field="key").for_topic(REPARTITION)], ids=lambda s: s.name)
def test_every_serde_but_bytes_refuses_the_packed_key(serde: Serde) -> None:
    """What an older reader decodes a repartition's key with fails on a packed record's:
    its loop stops, the record not committed, instead of skipping it as keyless."""
    with pytest.raises(SerdeError):
        serde.decode(PACKED_KEY)
    assert BYTES.decode(PACKED_KEY) == PACKED_KEY


@pytest.mark.parametrize(("fields", "pack", "packs"), [
    ({}, None, True),
    ({"key_serde": "str"}, None, True),
    ({"key_serde": "bytes"}, None, False),  # an older reader would take the key
    ({"on_decode_error": "skip"}, None, False),  # an older reader would set it aside
    ({"on_decode_error": "dead_letter", "dead_letter_topic": "dead"}, None, False),
    ({"key_serde": "bytes"}, True, True),  # asked for: the user's call
    ({}, False, False),
    ({"timestamp_extractor": lambda m: None}, True, False),  # event time from values
])
def test_packing_is_the_default_where_an_older_reader_stops_on_it(
        fields: dict[str, Any], pack: bool | None, packs: bool) -> None:
    assert stops_older_readers(config(**fields)) == (
        fields.get("key_serde") != "bytes" and "on_decode_error" not in fields)
    assert (packer_for(pack, config(**fields)) is not None) == packs
