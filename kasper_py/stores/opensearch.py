"""OpenSearch-backed state (also Elasticsearch 7+, the same REST API): ``OpenSearchTable``
declares a table, ``OpenSearchStore`` is one partition's view of it. One batch costs one
``_mget`` per ``get_many`` and one ``_bulk`` per ``flush``.

An index per table: ``<prefix>-<table>`` lowercased (``<prefix>`` the processor name
unless given), created at open with one shard (a bulk is applied in order on it). A
document per key: ``_id`` ``<partition>/<key>`` (``<key>`` for a shared table), the key
being the key serde's bytes as UTF-8 text (512 bytes at most); ``_source``
``{"key": <key>, "partition": <p>, "value": <the JSON value>}`` with the json value
serde (searchable, and mapped by OpenSearch's dynamic mapping), else ``"raw"``, the
value serde's bytes in base64. Effectively-once tables keep the next input offset of
each topic in the document ``#offsets/<partition>`` (``{"offsets": {topic: offset}}``).

Effectively-once: each document of a turn is written with external versioning, its
version the sum of the turn's next input offsets (strictly growing from turn to turn
of a partition), so a write replayed from an earlier turn, or a late one of a fenced
process, is a version conflict and counts as already applied; the offsets document is
the bulk's last item, so a restarted loop skips the input it covers. Queries read with
``_mget`` (real time) and scan with ``_search`` (what the index refreshed: within
``index.refresh_interval``, 1 s by default), in key order.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from kasper_py.config import Config
from kasper_py.exceptions import (
    BadQueryError,
    QueryUnavailableError,
    StoreError,
)
from kasper_py.message import TopicPartitionKey
from kasper_py.serdes import JsonSerde, Serde, serde_for
from kasper_py.stores._opensearch_http import NodeUnreachableError, Rest, RestError
from kasper_py.stores.base import BufferedStore, OwnedState, StoreRuntime, StoreSpec, Writes
from kasper_py.stores.lifecycle import already_applied
from kasper_py.stores.query import Scan, ScanPage
from kasper_py.stores.retries import with_retries

__all__ = ["OpenSearchStore", "OpenSearchTable"]


_MAX_ID_BYTES = 512  # OpenSearch refuses longer document ids
_INDEX_NAME = re.compile(r"^[a-z0-9][a-z0-9_.+-]*$")
_MAPPINGS = {"properties": {
    "key": {"type": "keyword"}, "partition": {"type": "integer"},
    "raw": {"type": "binary"}, "offsets": {"type": "object", "enabled": False}}}


class OpenSearchTable(StoreSpec):
    """Declares an OpenSearch table ``name``; every partition's store shares one pool
    of connections to ``url`` (``http[s]://[user:password@]host:port``).

    ``shared=True`` drops the partition from document ids, for tables whose keys are
    co-partitioned with the input (or only read). ``effectively_once=True`` versions
    each turn's documents by its input offsets and stores those offsets, so replayed
    input is skipped and replayed writes are refused. Connection failures and 5xx
    replies are retried ``retries`` times, backing off from ``backoff`` seconds doubling
    up to ``max_backoff``, then raise ``StoreUnavailableError``.
    """

    def __init__(self, name: str, *, url: str = "http://127.0.0.1:9200",
                 index: str | None = None, key_serde: str | Serde = "str",
                 value_serde: str | Serde = "json", prefix: str | None = None,
                 shared: bool = False, effectively_once: bool = False, replicas: int = 0,
                 retries: int = 5, backoff: float = 0.1, max_backoff: float = 2.0,
                 timeout: float = 10.0) -> None:
        if not name or "/" in name:
            raise ValueError(f"table name must be non-empty with no '/', got {name!r}")
        if index is not None and not _INDEX_NAME.match(index):
            raise ValueError(f"index must be lowercase letters, digits, '_.+-', got {index!r}")
        self.name, self.url, self.index = name, url, index
        self.key_serde, self.value_serde = serde_for(key_serde), serde_for(value_serde)
        self.prefix, self.shared, self.effectively_once = prefix, shared, effectively_once
        self.replicas = replicas
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.timeout = timeout
        self._rest: Rest | None = None
        self._created: set[str] = set()

    def open(self, runtime: StoreRuntime) -> OpenSearchStore:
        """Return partition ``runtime.partition``'s store; the first open creates the
        index if it is missing (``PUT /<index>``), effectively-once stores read their
        applied offsets (``GET /<index>/_doc/#offsets/<partition>``)."""
        if self._rest is None:
            self._rest = Rest(self.url, self.timeout)
        return OpenSearchStore(self, self._rest, runtime)

    def close(self) -> None:
        """Close the connections."""
        if self._rest is not None:
            self._rest.close()
            self._rest = None

    def index_name(self, config: Config) -> str:
        """The table's index for processor ``config.name``."""
        if self.index is not None:
            return self.index
        name = f"{self.prefix or config.name}-{self.name}".lower()
        return re.sub(r"[^a-z0-9_.+-]", "_", name).lstrip("_.+-")

    def owned_state(self, config: Config) -> OwnedState:
        """Held in OpenSearch: the index ``<prefix>-<table>`` at the table's address."""
        address = self._rest.address if self._rest else self.url
        return OwnedState(external=f"OpenSearch table {self.name!r}: index "
                          f"{self.index_name(config)} at {address}")

    def ensure_index(self, store: OpenSearchStore, index: str) -> None:
        """``PUT /<index>`` once per table and index; one that exists is kept as it is."""
        if index in self._created:
            return
        body = {"settings": {"number_of_shards": 1, "number_of_replicas": self.replicas},
                "mappings": _MAPPINGS}
        try:
            store.call("PUT index", "PUT", f"/{index}", body)
        except RestError as exc:
            if exc.status != 400 or "already_exists" not in exc.reason:
                raise
        self._created.add(index)


class OpenSearchStore(BufferedStore):
    """One partition of an OpenSearch table: documents ``<partition>/<key>`` (``<key>``
    when shared) of the table's index, values as the module docstring says."""

    def __init__(self, table: OpenSearchTable, rest: Rest, runtime: StoreRuntime) -> None:
        super().__init__(table.name, table.key_serde, table.value_serde, runtime.observer)
        self.processor, self.partition = runtime.config.name, runtime.partition
        self.index = table.index_name(runtime.config)
        self.effectively_once = table.effectively_once
        self.offsets_id = f"#offsets/{self.partition}"
        self._scope = "" if table.shared else f"{self.partition}/"
        self._json_values = isinstance(table.value_serde, JsonSerde)
        self._table, self._rest = table, rest
        self._applied: dict[TopicPartitionKey, int] = {}
        self._observed("open", lambda: table.ensure_index(self, self.index))
        if self.effectively_once:
            self._applied = self._observed("open", self._read_offsets)

    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One ``POST /<index>/_mget`` of the documents' ids."""
        reply = self.call("_mget", "POST", f"/{self.index}/_mget",
                          {"ids": [self._id(k) for k in keys]})
        return self._found(keys, reply)

    def _query_read(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One ``_mget``, no retries (the caller may ask again)."""
        reply = self._query_call("_mget", "POST", f"/{self.index}/_mget",
                                 {"ids": [self._id(k) for k in keys]})
        return self._found(keys, reply)

    def _found(self, keys: list[bytes], reply: Any) -> dict[bytes, bytes]:
        return {key: self._value_bytes(doc["_source"])
                for key, doc in zip(keys, reply["docs"], strict=True) if doc.get("found")}

    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """One ``POST /<index>/_bulk``: an ``index`` or ``delete`` per key, then (when
        effectively-once) the offsets document; any item error fails the flush (and so
        the turn) with a StoreError naming the item. Effectively-once: nothing for a
        replayed batch; version conflicts count as already applied."""
        if self.effectively_once and already_applied(self._applied, next_offsets):
            return
        versioned = self.effectively_once and bool(next_offsets)
        version = sum(next_offsets.values()) if versioned else None
        lines: list[Any] = []
        for key, value in writes.items():
            lines += self._bulk_item(key, value, version)
        if versioned:
            lines += [{"index": {"_id": self.offsets_id}},
                      {"offsets": {topic: offset
                                   for (topic, _), offset in next_offsets.items()}}]
        reply = self.call("_bulk", "POST", f"/{self.index}/_bulk", lines=lines)
        if reply.get("errors"):
            self._raise_item_errors(reply["items"], versioned)
        if versioned:
            self._applied.update(next_offsets)

    def _bulk_item(self, key: bytes, value: bytes | None, version: int | None) -> list[Any]:
        action: dict[str, Any] = {"_id": self._id(key)}
        if version is not None:
            action.update(version=version, version_type="external")
        if value is None:
            return [{"delete": action}]
        return [{"index": action}, self._source(key, value)]

    def _raise_item_errors(self, items: list[Any], versioned: bool) -> None:
        """Raise for the first item that failed other than as an already-applied write
        (a version conflict) or the delete of a missing document; when the offsets
        document was written regardless, put the applied offsets back first, so the
        replay of this turn is not skipped."""
        failed = [result for item in items for result in item.values()
                  if "error" in result and not _applied_before(result)]
        if not failed:
            return
        if versioned:
            self._restore_offsets()
        first = failed[0]
        raise StoreError(
            f"opensearch {self._rest.address}: _bulk for table {self.name!r} partition "
            f"{self.partition}: {len(failed)} of {len(items)} items failed; the first, "
            f"document {first['_id']!r} of index {self.index!r}: "
            f"{first['error'].get('type')}: {first['error'].get('reason')}")

    def _restore_offsets(self) -> None:
        offsets = {topic: offset for (topic, _), offset in self._applied.items()}
        if offsets:
            self.call("PUT offsets", "PUT", f"/{self.index}/_doc/{_quoted(self.offsets_id)}",
                      {"offsets": offsets})
        else:
            self.call("DELETE offsets", "DELETE",
                      f"/{self.index}/_doc/{_quoted(self.offsets_id)}")

    def query_scan(self, scan: Scan) -> ScanPage:
        """One ``POST /<index>/_search``: the partition's documents whose key starts with
        ``prefix`` (and lies in ``[start, end)``), sorted by key, ``search_after`` the
        cursor (the last key of the page before), at most ``limit`` of them."""
        filters: list[Any] = [{"exists": {"field": "key"}}]
        if self._scope:
            filters.append({"term": {"partition": self.partition}})
        if scan.prefix:
            filters.append({"prefix": {"key": _key_text(scan.prefix)}})
        bounds = {op: _key_text(bound) for op, bound in (("gte", scan.start), ("lt", scan.end))
                  if bound is not None}
        if bounds:
            filters.append({"range": {"key": bounds}})
        body: dict[str, Any] = {"size": scan.limit, "sort": [{"key": "asc"}],
                                "query": {"bool": {"filter": filters}}}
        if scan.cursor is not None:
            body["search_after"] = [scan.cursor]
        reply = self._query_call("_search", "POST", f"/{self.index}/_search", body)
        hits = reply["hits"]["hits"]
        pairs = [(hit["_source"]["key"].encode(), self._value_bytes(hit["_source"]))
                 for hit in hits]
        cursor = hits[-1]["_source"]["key"] if len(hits) == scan.limit else None
        return self.decoded_page(pairs, cursor, ordered=True)

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets whose effects this partition already holds (the offsets
        document when opened, then kept by ``flush``)."""
        return dict(self._applied)

    def _read_offsets(self) -> dict[TopicPartitionKey, int]:
        reply = self.call("GET offsets", "GET",
                          f"/{self.index}/_doc/{_quoted(self.offsets_id)}")
        stored = reply.get("_source", {}).get("offsets", {}) if reply.get("found") else {}
        return {(topic, self.partition): int(offset) for topic, offset in stored.items()}

    def _id(self, key: bytes) -> str:
        document_id = self._scope + _key_text(key, error=StoreError)
        if len(document_id.encode()) > _MAX_ID_BYTES:
            raise StoreError(f"opensearch table {self.name!r}: key {key[:40]!r}... makes a "
                             f"document id over {_MAX_ID_BYTES} bytes")
        return document_id

    def _source(self, key: bytes, value: bytes) -> dict[str, Any]:
        source: dict[str, Any] = {"key": key.decode(), "partition": self.partition}
        if self._json_values:
            source["value"] = json.loads(value)
        else:
            source["raw"] = base64.b64encode(value).decode()
        return source

    def _value_bytes(self, source: Mapping[str, Any]) -> bytes:
        if "raw" in source:
            return base64.b64decode(source["raw"])
        return json.dumps(source.get("value"), separators=(",", ":")).encode()

    def call(self, op: str, method: str, path: str, body: Any = None, *,
             lines: list[Any] | None = None) -> Any:
        """One request (a bulk when ``lines`` are given), retrying connection failures
        and 5xx replies with exponential backoff; each attempt counts as a round trip."""
        def request() -> Any:
            if lines is not None:
                return self._rest.bulk(path, lines)
            return self._rest.call(method, path, body)

        what = f"{op} for table {self._table.name!r} partition {self.partition}"
        try:
            return with_retries(self._table, request, retriable=(NodeUnreachableError,),
                                where=f"opensearch {self._rest.address}", what=what,
                                counted=self._count_round_trips)
        except RestError as exc:
            raise RestError(f"opensearch {self._rest.address}: {op} for table {self.name!r} "
                            f"partition {self.partition} failed: {exc}", exc.status,
                            exc.reason) from exc

    def _query_call(self, op: str, method: str, path: str, body: Any) -> Any:
        try:
            return self._rest.call(method, path, body)
        except NodeUnreachableError as exc:
            raise QueryUnavailableError(f"opensearch {self._rest.address} unreachable: {op} "
                                        f"for table {self.name!r}: {exc}") from exc
        except RestError as exc:
            raise QueryUnavailableError(f"opensearch {self._rest.address}: {op} for table "
                                        f"{self.name!r} failed: {exc}") from exc


def _applied_before(result: Mapping[str, Any]) -> bool:
    """True for a bulk item that failed only because its effect is there already: an
    externally versioned write at or below the document's version (a replay)."""
    return bool(result.get("status") == 409
                and result["error"].get("type") == "version_conflict_engine_exception")


def _key_text(key: bytes, error: type[Exception] = BadQueryError) -> str:
    """``key`` as the UTF-8 text OpenSearch keeps it as; ``error`` when it is not UTF-8."""
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise error(f"opensearch keys must be UTF-8 text (the key serde's bytes), "
                    f"got {key[:40]!r}") from None


def _quoted(document_id: str) -> str:
    """A document id as a URL path segment."""
    return quote(document_id, safe="")
