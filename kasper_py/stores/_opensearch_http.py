"""The REST calls the OpenSearch store makes (``_mget``, ``_bulk``, ``_search``, index
creation), over urllib3's pooled, thread-safe connections: JSON in and out, and the
failures mapped to kasper_py's errors. What the documents hold lives in opensearch.py.

A connection failure, a timeout or a 5xx reply is retriable (the node is down, starting
or overloaded); any other reply that is not 2xx is the request's own fault.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from kasper_py._support.urls import server_address
from kasper_py.exceptions import StoreError

try:
    import urllib3
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "kasper_py.stores.opensearch needs urllib3: pip install kasper-py[opensearch]") from exc

__all__ = ["NodeUnreachableError", "Rest", "RestError"]


class NodeUnreachableError(Exception):
    """The node did not answer, or answered 5xx: worth another try."""


class RestError(StoreError):
    """The node refused the request (a 4xx reply); ``status`` and ``reason`` are its."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class Rest:
    """JSON requests to one OpenSearch (or Elasticsearch 7+) base URL."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.address = server_address(url, 9200, with_path=False)
        self._base = url.rstrip("/")
        # Retries are the store's (bounded, with backoff, counted), not urllib3's.
        self._pool = urllib3.PoolManager(
            retries=False, timeout=urllib3.Timeout(connect=timeout, read=timeout),
            headers=_auth_headers(parts.username, parts.password))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``method path`` with a JSON body; the decoded JSON reply."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        return self._send(method, path, data, "application/json")

    def bulk(self, path: str, lines: Sequence[Any]) -> Any:
        """``POST path`` (a ``_bulk`` endpoint) with ``lines`` as newline-delimited JSON."""
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        return self._send("POST", path, data.encode(), "application/x-ndjson")

    def close(self) -> None:
        """Close the pooled connections."""
        self._pool.clear()

    def _send(self, method: str, path: str, data: bytes | None, content_type: str) -> Any:
        try:
            reply = self._pool.request(method, self._base + path, body=data,
                                       headers={"Content-Type": content_type})
        except urllib3.exceptions.HTTPError as exc:
            raise NodeUnreachableError(f"{method} {path}: {exc}") from exc
        if reply.status >= 500:
            raise NodeUnreachableError(
                f"{method} {path}: HTTP {reply.status} {_reason(reply.data)}")
        if reply.status >= 400 and reply.status != 404:
            reason = _reason(reply.data)
            raise RestError(f"{method} {path}: HTTP {reply.status} {reason}",
                            reply.status, reason)
        return json.loads(reply.data) if reply.data else {}


def _auth_headers(username: str | None, password: str | None) -> dict[str, str]:
    """Basic authentication from the URL's ``user:password@``, if it names one."""
    if username is None:
        return {}
    return dict(urllib3.make_headers(basic_auth=f"{username}:{password or ''}"))


def _reason(data: bytes) -> str:
    """The ``error.type: error.reason`` of an error reply, else its first 200 bytes."""
    try:
        error = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")
    if isinstance(error, dict):
        return f"{error.get('type')}: {error.get('reason')}"
    return str(error)
