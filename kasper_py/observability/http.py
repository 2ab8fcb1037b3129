"""The one HTTP server of kasper_py's endpoints (the loop's metrics and health, its table
queries and views, the supervisor's): ``HttpServer`` answers GET with the ``Handler``s
mounted on it, every error as JSON (``{"error", "status", "message"}``, the standard
library's own 404/414/501 pages included), other methods with 405 and an ``Allow``
header, optionally behind a bearer token (``BearerGuard``) and TLS. No access log:
probes and scrapes every few seconds would flood stderr.

It is the standard library's ``ThreadingHTTPServer``: a thread per request, so a slow
read never holds up a scrape, and nothing runs on the loop's thread.
"""

from __future__ import annotations

import base64
import hmac
import json
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

import structlog

__all__ = ["BearerGuard", "Handler", "HttpServer", "QuietHandler", "Request", "Response",
           "error_response", "request_of", "tls_context"]

_log = structlog.get_logger("kasper_py")
_REQUEST_TIMEOUT = 30.0
"""Seconds a connection may take to send its request (TLS handshake included), so a
client that opens a connection and says nothing holds a thread no longer."""


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


Handler = Callable[[Request], "Response | None"]
"""Answers a request, or ``None`` when the path is not its own (the metrics', the
queries', the supervisor's). Not ``kasper_py.app.App``, the application."""
App = Handler
"""The old name of ``Handler``, kept for imports of it; not in ``__all__``."""
Guard = Callable[[Request], "Response | None"]
"""Checked before any app: a refusal (401, say), or ``None`` to let the request in."""


def error_response(status: int, message: str, kind: str | None = None,
                   headers: Mapping[str, str] | None = None) -> Response:
    """The one error shape: ``{"error": kind, "status": status, "message": message}``;
    ``kind`` defaults to the status's name (``NotFound``, ``MethodNotAllowed``)."""
    if kind is None:
        kind = HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "")
    return Response({"error": kind, "status": status, "message": message}, status=status,
                    headers=headers or {})


def request_of(method: str, target: str, headers: Mapping[str, str]) -> Request:
    """The ``Request`` of an HTTP request line's ``target`` (``/path?query``)."""
    parts = urlsplit(target)
    raw = unquote_to_bytes(parts.path)
    return Request(method, raw.decode("utf-8", "replace"),
                   dict(parse_qsl(parts.query, keep_blank_values=True)),
                   {k.lower(): v for k, v in headers.items()}, raw, target)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler with ``_send``, JSON error pages and a silent access log."""

    timeout = _REQUEST_TIMEOUT

    def _send(self, status: int, content_type: str, body: bytes,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _reply(self, response: Response) -> None:
        content_type, body = response.encoded()
        self._send(response.status, content_type, body, response.headers)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """The standard library's own errors (a request line too long, a method it has
        no ``do_`` for, a malformed request) in the one JSON shape, not its HTML page."""
        self.close_connection = True
        response = error_response(code, explain or message or HTTPStatus(code).phrase)
        content_type, body = response.encoded()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet."""


class BearerGuard:
    """Lets in requests carrying ``Authorization: Bearer <token>``, compared in constant
    time; answers any other with 401 and a JSON body, and counts it with ``rejected``
    (``missing``: no bearer token; ``wrong``: another token)."""

    def __init__(self, token: str, rejected: Callable[[str], None] = lambda reason: None
                 ) -> None:
        if not token:
            raise ValueError("a bearer token must not be empty")
        self._token = token.encode()
        self._rejected = rejected

    def __call__(self, request: Request) -> Response | None:
        scheme, _, offered = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not offered.strip():
            return self._refuse("missing", "this endpoint needs an 'Authorization: Bearer "
                                "<token>' header")
        if not hmac.compare_digest(offered.strip().encode(), self._token):
            return self._refuse("wrong", "the bearer token is not this endpoint's")
        return None

    def _refuse(self, reason: str, message: str) -> Response:
        self._rejected(reason)
        return error_response(401, message, "Unauthorized",
                              {"WWW-Authenticate": 'Bearer realm="kasper"'})

    def __repr__(self) -> str:
        return "BearerGuard(token='***')"


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side TLS context from a PEM certificate (chain) and its key; raises
    ``OSError``/``ssl.SSLError`` when they do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], owner: HttpServer) -> None:
        self.owner = owner
        super().__init__(address, _AppHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up or fails its TLS handshake: a debug line, no traceback."""
        _log.debug("kasper.http_request_failed", server=self.owner.name,
                   client=str(client_address))


class _AppHandler(QuietHandler):
    """GET: the guard, then the mounted apps in order, else a JSON 404. POST: the guard,
    then the apps mounted for POST. Any other method, or a POST none answers: 405 with
    ``Allow: GET`` (after the guard, so it tells a stranger nothing)."""

    server: _Server

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, on the request's thread, not accept's

    def do_GET(self) -> None:
        owner = self.server.owner
        request = request_of(self.command, self.path, dict(self.headers.items()))
        if not self._answer(request, owner.apps):
            self._reply(error_response(404, f"nothing at {request.path}; try "
                                       f"{', '.join(owner.paths())}"))

    def do_POST(self) -> None:
        request = request_of(self.command, self.path, dict(self.headers.items()))
        if not self._answer(request, self.server.owner.post_apps):
            self._not_allowed()

    def _answer(self, request: Request, apps: Sequence[Handler]) -> bool:
        """The guard's refusal, else the first of ``apps`` to answer; False when none
        did (nothing sent)."""
        owner = self.server.owner
        response = owner.guard(request) if owner.guard is not None else None
        for app in list(apps):  # each asked only while none has answered
            if response is not None:
                break
            response = app(request)
        if response is not None:
            self._reply(response)
        return response is not None

    def _not_allowed(self) -> None:
        owner = self.server.owner
        request = request_of(self.command, self.path, dict(self.headers.items()))
        refused = owner.guard(request) if owner.guard is not None else None
        self._reply(refused or error_response(
            405, f"{self.command} is not allowed: this endpoint answers GET only",
            headers={"Allow": "GET"}))

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815


_SHUTDOWN_POLL = 0.05
"""How often the serving thread looks for ``close()``: the standard library's 0.5 s made
each server's close wait 0.25 s on average, and a process stops both of its servers in
turn on its way out (part of a static failover: bench_failover.py --breakdown)."""


class HttpServer:
    """A background HTTP(S) server on ``host:port`` (0: any free port) answering GET with
    the ``Handler``s mounted on it, in order; ``guard`` (a ``BearerGuard``) is asked first,
    and ``tls`` (``tls_context``) makes it HTTPS. ``paths`` name what it serves, for
    the 404's hint."""

    def __init__(self, host: str, port: int, *, name: str, apps: Sequence[Handler] = (),
                 paths: Sequence[str] = (), guard: Guard | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.apps: list[Handler] = list(apps)
        self.post_apps: list[Handler] = []
        """Those answering POST (``mount(post=True)``)."""
        self.guard = guard
        self._paths = list(paths)
        self.scheme = "https" if tls is not None else "http"
        self._httpd = _Server((host, port), self)
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        args=(_SHUTDOWN_POLL,), name=f"kasper-{name}",
                                        daemon=True)
        self._thread.start()

    def mount(self, app: Handler, paths: Sequence[str] = (), *, post: bool = False) -> None:
        """Answer the paths ``app`` knows (it returns ``None`` for the others): GET, or
        with ``post`` POST (an admin action; any other POST is answered 405)."""
        (self.post_apps if post else self.apps).append(app)
        self._paths += [p for p in paths if p not in self._paths]

    def unmount(self, app: Handler) -> None:
        """Stop answering with ``app``."""
        if app in self.apps:
            self.apps.remove(app)

    def paths(self) -> list[str]:
        """The paths this server answers, for a 404's hint."""
        return list(self._paths)

    @property
    def host(self) -> str:
        """The address bound."""
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        """The port actually bound (useful when asked for port 0)."""
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        """Stop the server and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
