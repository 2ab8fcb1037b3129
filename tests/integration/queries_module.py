"""Processors for the query tests through ``kasper run``, written the short way: no
``__init__`` (the base class keeps the context).

    kasper run queries_module:Count --stores queries_module:stores --views queries_module:VIEWS
    kasper run queries_module:Count --stores queries_module:opensearch_stores
    kasper run queries_module:Relay      # re-keys nothing: sends each record on, keyed
"""

from __future__ import annotations

import os
from typing import Any

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.query import Request, Response, Scan, Tables
from kasper_py.stack import opensearch_url
from kasper_py.stores.opensearch import OpenSearchTable
from kasper_py.stores.rocksdb import RocksDBTable


class Count(MessageProcessor):
    """Counts messages per key (str) in the RocksDB table "counts"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.context.store("counts")
        totals = counts.get_many({m.key for m in messages})
        for m in messages:
            totals[m.key] = totals.get(m.key, 0) + 1
        counts.put_many(totals)


class Relay(MessageProcessor):
    """Sends every message on to ``$QUERIES_RELAY_TOPIC`` with its key: kasper_py's
    producer places it (murmur2, as the library writes)."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        topic = os.environ["QUERIES_RELAY_TOPIC"]
        for m in messages:
            sender.send(topic, m.value, m.key)


def stores(config: Config) -> list[RocksDBTable]:
    """The counts table, str keys as the input's (so queries find the partition)."""
    return [RocksDBTable("counts", key_serde="str", value_serde="json")]


def top(request: Request, tables: Tables) -> Response:
    """The ``n`` biggest counts held by this instance."""
    items: list[Any] = tables.scan("counts", Scan(limit=1000))["items"]
    ranked = sorted(items, key=lambda item: (-item[1], item[0]))[:int(request.params["n"])]
    return Response({"top": [[key, count] for key, count, _ in ranked]})


VIEWS = {"/top": top}


def opensearch_stores(config: Config) -> list[OpenSearchTable]:
    """The counts table in the stack's OpenSearch (``$KASPER_OPENSEARCH_URL`` else the
    local node), str keys as the input's."""
    return [OpenSearchTable("counts", url=opensearch_url(), effectively_once=True)]


def json_stores(config: Config) -> list[RocksDBTable]:
    """The counts table with json keys (the input's keys are JSON text)."""
    return [RocksDBTable("counts", key_serde="json", value_serde="json")]
