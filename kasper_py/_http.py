"""The base of kasper_py's small HTTP endpoints (the loop's metrics, health and queries,
the supervisor's): one way to answer, no access log (probes and scrapes every few
seconds would flood stderr), and the ``Request``/``Response`` an ``App`` mounted on
the metrics server (``kasper_py.query``) sees.

The server is the standard library's ``ThreadingHTTPServer``: a thread per request,
so a slow read never holds up a scrape, and nothing runs on the loop's thread.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

__all__ = ["App", "QuietHandler", "Request", "Response", "request_of"]


@dataclass(frozen=True)
class Request:
    """One HTTP request: its method, its path (percent-decoded, as text), the path's
    raw bytes (percent-decoded, for binary keys), its query parameters (the last value
    of each) and headers (lower-case names)."""

    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    raw_path: bytes = b""
    target: str = ""
    """The request target as sent (path and query string, still percent-encoded)."""


@dataclass(frozen=True)
class Response:
    """An answer: ``body`` bytes go out as they are, ``str`` as UTF-8, anything else as
    JSON (``content_type`` then defaults to ``application/json``)."""

    body: Any = None
    status: int = 200
    content_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def encoded(self) -> tuple[str, bytes]:
        """(content type, body bytes)."""
        if isinstance(self.body, bytes):
            return self.content_type or "application/octet-stream", self.body
        if isinstance(self.body, str):
            return self.content_type or "text/plain; charset=utf-8", self.body.encode()
        text = json.dumps(self.body, separators=(",", ":"), ensure_ascii=False,
                          default=_json_default)
        return self.content_type or "application/json", text.encode()


def _json_default(value: Any) -> Any:
    """Bytes as UTF-8 text (or ``{"base64": ...}`` when not UTF-8); tuples and sets as
    lists; anything else as its ``str()``."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode()}
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


App = Callable[[Request], "Response | None"]
"""Answers a request, or ``None`` when the path is not its own."""


def request_of(method: str, target: str, headers: Mapping[str, str]) -> Request:
    """The ``Request`` of an HTTP request line's ``target`` (``/path?query``)."""
    parts = urlsplit(target)
    raw = unquote_to_bytes(parts.path)
    return Request(method, raw.decode("utf-8", "replace"),
                   dict(parse_qsl(parts.query, keep_blank_values=True)),
                   {k.lower(): v for k, v in headers.items()}, raw, target)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler with ``_send`` and a silent access log."""

    def _send(self, status: int, content_type: str, body: bytes,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, app: App) -> bool:
        """Answer with ``app``; False when it has nothing at this path."""
        response = app(request_of(self.command, self.path, dict(self.headers.items())))
        if response is None:
            return False
        content_type, body = response.encoded()
        self._send(response.status, content_type, body, response.headers)
        return True

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet."""
