"""How a Spark task's Arrow records (``task.COLUMNS``) of one partition number become a
turn's ``Batch``, chosen once per partition: ``MessageReader`` builds the messages as
read and decodes them (``decode_batch``, every processor); ``TableReader`` keeps an
``ArrowMessageProcessor``'s records columnar (``kasper_py.arrow.TableBatch``), so its
table is built with no ``Message`` per record (JSON values by Arrow's reader). Nothing
here imports pyspark.
"""

from __future__ import annotations

import base64
import importlib
import itertools
import json
from typing import Any, Protocol, cast

from kasper_py.arrow import ArrowMessageProcessor, TableBatch, import_pyarrow, json_values
from kasper_py.config import Config
from kasper_py.kafka.batching import Batch, decode_batch, offset_range
from kasper_py.message import Message
from kasper_py.processor import MessageProcessor
from kasper_py.serdes import BYTES, JSON, STRING

__all__ = ["MessageReader", "RecordReader", "TableReader", "messages_of", "reader_for"]


class RecordReader(Protocol):
    """Arrow records of one partition number (a table of ``COLUMNS``) -> one turn's batch."""

    def batch(self, records: Any) -> Batch:
        """The batch of ``records`` (raises ``SerdeError``/``OffsetError`` as the loop's
        decoder does)."""


def reader_for(config: Config, processor: MessageProcessor | None) -> RecordReader:
    """``TableReader`` for an ``ArrowMessageProcessor`` (its own ``process()``) whose
    values are JSON left as bytes (``value_serde="bytes"``, the loop's Arrow JSON path) or
    decoded by the ``json`` serde, and whose keys are bytes or text, of one input topic or
    several, without dead letters of failed batches (they need the records as read);
    ``MessageReader`` otherwise."""
    messages = MessageReader(config)
    if (isinstance(processor, ArrowMessageProcessor)
            and type(processor).process is ArrowMessageProcessor.process
            and config.value_decoder in (BYTES, JSON) and config.key_decoder in (BYTES, STRING)
            and config.on_process_error != "dead_letter"):
        return TableReader(config, messages)
    return messages


class MessageReader:
    """Messages as read, decoded by the turn's decoder, as the loop's records are."""

    def __init__(self, config: Config) -> None:
        self._config = config

    def batch(self, records: Any) -> Batch:
        config = self._config
        return decode_batch(messages_of(records), config.key_decoder, config.value_decoder,
                            set_aside=config.on_decode_error != "fail",
                            keep_read=config.on_process_error == "dead_letter")


class TableReader:
    """The records kept as columns: the batch's one partition holds a ``TableBatch``
    whose table is ``arrow_table`` of these columns, the same function ``to_arrow`` uses
    in the loop, so both runners hand ``process_table`` the same table. Several topics'
    records are grouped topic by topic, in the order the topics first come, as the loop's
    decoder groups them. Keys the text serde cannot decode, and values whose table from
    Arrow's JSON reader might not be the ``json`` serde's (``json_values``), go through
    ``MessageReader`` (the loop's decoding, its error or ``on_decode_error``'s policy)."""

    def __init__(self, config: Config, messages: MessageReader) -> None:
        self._text_keys = config.key_decoder is STRING
        self._json_serde = config.value_decoder is JSON
        self._messages = messages
        self._pa = import_pyarrow()
        self._compute = importlib.import_module("pyarrow.compute")

    def batch(self, records: Any) -> Batch:
        records, spans = self._topic_by_topic(records)
        columns = self._columns(records)
        if columns is None:
            return self._messages.batch(records)
        partition = columns["partition"][0].as_py()
        offsets, stamps = columns["offset"], columns["timestamp"]
        ranges = {(topic, partition): offset_range(
            (topic, partition), offsets[start].as_py(), offsets[stop - 1].as_py(),
            stop - start, first_timestamp=stamps[start].as_py(),
            last_timestamp=stamps[stop - 1].as_py())
            for topic, start, stop in spans}
        table = TableBatch(columns, lambda: self._messages.batch(records).by_partition[partition])
        # The turn hands this to process(), whose ArrowMessageProcessor reads it as a
        # sequence or through to_arrow: it stands for the partition's list of messages.
        return Batch(by_partition={partition: cast(list[Message], table)}, ranges=ranges)

    def _topic_by_topic(self, records: Any) -> tuple[Any, list[tuple[str, int, int]]]:
        """``records`` grouped by topic (each keeps its order), and each topic's rows as
        ``(topic, start, stop)``."""
        topics = records.column("topic")
        names = self._compute.unique(topics).to_pylist()  # in the order they first come
        if len(names) == 1:
            return records, [(names[0], 0, records.num_rows)]
        parts = [records.filter(self._compute.equal(topics, name)) for name in names]
        stops = list(itertools.accumulate(part.num_rows for part in parts))
        return self._pa.concat_tables(parts), [
            (name, stop - part.num_rows, stop) for name, part, stop in zip(names, parts, stops,
                                                                          strict=True)]

    def _columns(self, records: Any) -> dict[str, Any] | None:
        """The columns ``arrow_table`` takes, the records' own Arrow arrays (no object per
        record), the values as their columns with the ``json`` serde; ``None`` when a key
        is not UTF-8 text the ``str`` serde would decode, or the values need the serde's
        own decoding."""
        pa, compute = self._pa, self._compute
        keys = records.column("key")
        if self._text_keys:
            try:
                keys = keys.cast(pa.string())
            except pa.ArrowInvalid:
                return None
        values: Any = records.column("value").to_pylist()
        if self._json_serde:
            values = json_values(values, as_json_serde=True)
            if values is None:
                return None
        # Spark's timestampType -1 is "no timestamp", which a Message holds as None
        stamps = compute.if_else(compute.less(records.column("timestampType"), 0),
                                 pa.scalar(None, pa.int64()), records.column("timestamp"))
        return {"topic": records.column("topic"), "partition": records.column("partition"),
                "offset": records.column("offset"), "timestamp": stamps, "key": keys,
                "value": values}


def messages_of(records: Any) -> list[Message]:
    """Arrow records of ``COLUMNS`` -> Messages as read (key and value bytes; the turn's
    ``decode_batch`` decodes them, as it does the loop's records). Spark's
    ``timestampType`` is Kafka's Java id (-1 none, 0 create time, 1 log-append time),
    one below confluent-kafka's, which ``Message.timestamp_type`` uses."""
    topics, partitions, offsets, keys, values, stamps, kinds, headers = (
        records.column(i).to_pylist() for i in range(8))
    new = tuple.__new__  # Message is a NamedTuple; this skips its Python-level __new__
    return [new(Message, (topic, partition, offset, key, value, None if kind < 0 else stamp,
                          _headers(header) if header else (), max(kind + 1, 0)))
            for topic, partition, offset, key, value, stamp, kind, header
            in zip(topics, partitions, offsets, keys, values, stamps, kinds, headers,
                   strict=True)]


def _headers(encoded: str) -> tuple[tuple[str, bytes | None], ...]:
    """Spark's ``to_json`` of the headers column: ``[{"key": .., "value": base64}]``."""
    return tuple((header["key"], None if header.get("value") is None
                  else base64.b64decode(header["value"])) for header in json.loads(encoded))
