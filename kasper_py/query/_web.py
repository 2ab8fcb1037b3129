"""The HTTP face of ``Tables``, mounted on the loop's query server (``server.py``), and
the user's views. Routes (GET only)::

    /tables                          the tables, their kinds and the partitions held here
    /tables/{name}?prefix=&from=&to=&limit=&cursor=&partition=   one page of a scan
    /tables/{name}/{key}             the key's value (and a "hint" when it was found
                                     where another partitioner than
                                     Config.query_partitioner puts it)
    /tables/{name}/{key}?from=&to=   a windowed table's windows of the key (ms)
    <view path>                      a registered view

A key held by another instance answers 307 to the same path there (421 with a JSON
body naming the partition when no instance announced it); errors answer JSON
``{"error": <type>, "status": ..., "message": ...}`` with the status of their
``QueryError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import structlog

from kasper_py.exceptions import (
    BadQueryError,
    KasperError,
    KeyNotFoundError,
    NotHereError,
    QueryError,
)
from kasper_py.observability.http import Request, Response, error_response
from kasper_py.query._tables import Tables
from kasper_py.stores.query import Scan

__all__ = ["RESERVED", "QueryApp", "View", "check_view_path"]

_log = structlog.get_logger("kasper_py")
View = Callable[[Request, Tables], Any]
"""A user's web view: answers a ``Request`` with a ``Response``, or with any JSON value
(sent with status 200), reading the processor's ``Tables``."""
RESERVED = ("/metrics", "/health", "/tables")


def check_view_path(path: str) -> None:
    """Refuse a view path that is not absolute or that the server already answers."""
    if not isinstance(path, str) or not path.startswith("/") or " " in path:
        raise ValueError(f"a view path starts with '/' and has no spaces, got {path!r}")
    for taken in RESERVED:
        if path == taken or path.startswith(taken + "/"):
            raise ValueError(f"view path {path!r} is taken by kasper_py's own {taken}")


class QueryApp:
    """Answers ``/tables`` paths and the views; ``None`` for any other path."""

    def __init__(self, tables: Tables, views: Mapping[str, View],
                 endpoint: str | None = None) -> None:
        for path in views:
            check_view_path(path)
        self.tables = tables
        self.views = dict(views)
        self.endpoint = endpoint
        """This instance's own URL (a redirect never points here)."""

    def __call__(self, request: Request) -> Response | None:
        view = self.views.get(request.path)
        segments = urlsplit(request.target).path.split("/", 3)
        if view is None and segments[1] != "tables":
            return None
        try:
            return self._view(view, request) if view else self._route(request, segments)
        except NotHereError as exc:
            return self._elsewhere(exc, request)
        except KeyNotFoundError as exc:
            return _not_found(exc)
        except QueryError as exc:
            return _error(exc.status, type(exc).__name__, str(exc))
        except KasperError as exc:  # a store failed
            return _error(503, type(exc).__name__, str(exc))

    def _route(self, request: Request, segments: list[str]) -> Response:
        if len(segments) == 2 or segments[2:] == [""]:
            return Response({"processor": self.tables.config.name,
                             "tables": self.tables.describe()})
        table = unquote_to_bytes(segments[2]).decode("utf-8", "replace")
        partition = _int_param(request, "partition")
        if len(segments) == 3 or segments[3] == "":
            return Response(self._scan(table, request, partition))
        key = self.tables.key_of(table, unquote_to_bytes(segments[3]))
        if "from" in request.params or "to" in request.params:
            windows = self.tables.windows(table, key, _int_param(request, "from") or 0,
                                          _int_param(request, "to", 2 ** 63 - 1) or 0)
            return Response({"table": table, "key": key, "windows": [
                {"start": w.start, "end": w.end, "value": w.value} for w in windows]})
        found = self.tables.find(table, key, partition=partition,
                                 stale=request.params.get("stale") == "ok")
        hint = {"hint": found.hint} if found.hint else {}
        if found.standby_lag is None:
            return Response({"table": table, "key": key, "value": found.value, **hint})
        lag = found.standby_lag
        return Response({"table": table, "key": key, "value": found.value, "standby_lag": lag},
                        headers={STANDBY_LAG_HEADER: str(lag)})

    def _scan(self, table: str, request: Request, partition: int | None) -> dict[str, Any]:
        raw = _raw_params(request.target)
        limit = _int_param(request, "limit", 100)
        scan = Scan(prefix=raw.get("prefix", b""), start=raw.get("from"), end=raw.get("to"),
                    cursor=request.params.get("cursor") or None, limit=limit or 100)
        page = self.tables.scan(table, scan, partition=partition)
        return {"table": table, **page}

    def _view(self, view: View, request: Request) -> Response:
        try:
            answer = view(request, self.tables)
        except QueryError:
            raise
        except Exception as exc:  # a view's bug answers 500; the loop goes on
            _log.warning("kasper.view_failed", path=request.path, error=repr(exc))
            return _error(500, type(exc).__name__, f"view {request.path} raised: {exc}")
        return answer if isinstance(answer, Response) else Response(answer)

    def _elsewhere(self, exc: NotHereError, request: Request) -> Response:
        body = {"error": type(exc).__name__, "status": 421, "message": str(exc),
                "partition": exc.partition, "endpoint": exc.endpoint}
        if exc.endpoint is None or exc.endpoint == self.endpoint:
            return Response(body, status=421)
        return Response(body, status=307, headers={"Location": exc.endpoint + request.target})


STANDBY_LAG_HEADER = "Kasper-Standby-Lag"
"""The header of an answer from a standby's warm copy: its lag in changelog offsets."""


def _error(status: int, kind: str, message: str) -> Response:
    return error_response(status, message, kind)


def _not_found(exc: KeyNotFoundError) -> Response:
    """A 404 for a missing key; from a standby's copy, with the copy's lag (body and
    header, as a found value has them): the key may not have reached the copy yet."""
    if exc.standby_lag is None:
        return _error(exc.status, type(exc).__name__, str(exc))
    response = error_response(exc.status, str(exc), type(exc).__name__,
                              headers={STANDBY_LAG_HEADER: str(exc.standby_lag)})
    return replace(response, body={**response.body, "standby_lag": exc.standby_lag})


def _int_param(request: Request, name: str, default: int | None = None) -> int | None:
    text = request.params.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise BadQueryError(f"parameter {name}={text!r} is not an integer") from None


def _raw_params(target: str) -> dict[str, bytes]:
    """Query parameters as bytes (percent-decoded; ``+`` is a space): scan bounds are
    key-serde bytes, which need not be UTF-8."""
    found: dict[str, bytes] = {}
    for pair in urlsplit(target).query.split("&"):
        name, _, value = pair.partition("=")
        if name:
            found[name] = unquote_to_bytes(value.replace("+", " "))
    return found
