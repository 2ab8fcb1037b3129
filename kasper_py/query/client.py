"""``QueryClient``: reads a running processor's tables over HTTP(S) from another process.
The standard library's ``urllib`` serves (GET, JSON, redirects, TLS), so the client adds
no dependency; it follows an instance's 307 to the one holding the key, with its bearer
token, but never from HTTPS down to HTTP.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import IO, Any
from urllib.parse import quote, urlencode

from kasper_py.exceptions import (
    BadQueryError,
    KeyNotFoundError,
    NotFoundError,
    NotHereError,
    QueryError,
    QueryUnavailableError,
    UnauthorizedError,
    UnknownTableError,
)
from kasper_py.query._tables import Lookup
from kasper_py.serdes import Serde, serde_for

__all__ = ["QueryClient"]

_ERRORS: dict[str, type[QueryError]] = {
    cls.__name__: cls for cls in (BadQueryError, KeyNotFoundError, UnknownTableError,
                                  NotFoundError, QueryUnavailableError)}
_BY_STATUS: dict[int, type[QueryError]] = {400: BadQueryError, 401: UnauthorizedError,
                                           404: NotFoundError, 503: QueryUnavailableError}


class QueryClient:
    """Reads tables of the processor serving at ``url`` (or the first of ``urls`` that
    answers), e.g. ``QueryClient("http://host:9100").get("counts", "alice")``.

    Keys are encoded with the table's key serde (``key_serde=``, else the one
    ``/tables`` names), so pass them as the processor's code sees them: ``"alice"``,
    ``42``. Errors are ``QueryError`` subclasses: ``KeyNotFoundError`` and
    ``UnknownTableError`` (404), ``BadQueryError`` (400), ``NotHereError`` (421: no
    instance announced the key's partition), ``UnauthorizedError`` (401: no token or
    the wrong one), ``QueryUnavailableError`` (503, or no instance reachable).

    ``token`` is sent as ``Authorization: Bearer <token>`` (``Config.query_token`` of
    the processor). For HTTPS, ``ca_file`` names the PEM file of the CA (or the
    self-signed certificate) that signed the servers' certificates; ``ssl_context``
    replaces the whole TLS setup; by default the system's CAs are trusted.
    """

    def __init__(self, url: str | Sequence[str], *, timeout: float = 10.0,
                 token: str | None = None, ca_file: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                               for u in urls):
            raise ValueError(f"url must be an http(s) URL or a list of them, got {url!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout = timeout
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        context = ssl_context or ssl.create_default_context(cafile=ca_file)
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=context), _NoDowngrade())
        self._serdes: dict[str, Serde] = {}

    def __repr__(self) -> str:
        token = ", token='***'" if "Authorization" in self._headers else ""
        return f"QueryClient({self.urls!r}{token})"

    def tables(self) -> list[dict[str, Any]]:
        """What ``GET /tables`` lists: name, backend, kind, serdes, partitions held."""
        tables: list[dict[str, Any]] = self._get("/tables")["tables"]
        return tables

    def get(self, table: str, key: Any, *, key_serde: str | Serde | None = None,
            stale: bool = False) -> Any:
        """The value of ``key``; ``KeyNotFoundError`` when the table has none. With
        ``stale``, an instance keeping the key's partition warm as a standby answers
        from its copy (``find`` tells its lag) instead of sending to the owner."""
        return self.find(table, key, key_serde=key_serde, stale=stale).value

    def find(self, table: str, key: Any, *, key_serde: str | Serde | None = None,
             stale: bool = False) -> Lookup:
        """``get``, with the server's hint when it found the key where another
        partitioner than its ``Config.query_partitioner`` puts it, and with ``stale`` the
        standby copy's lag in changelog offsets when one answered (``standby_lag``)."""
        path = self._key_path(table, key, key_serde) + ("?stale=ok" if stale else "")
        answer = self._get(path)
        return Lookup(answer["value"], answer.get("hint"), answer.get("standby_lag"))

    def windows(self, table: str, key: Any, time_from: int = 0, time_to: int = 2 ** 63 - 1,
                *, key_serde: str | Serde | None = None) -> list[dict[str, Any]]:
        """A windowed table's windows of ``key`` overlapping ``[time_from, time_to]`` (ms):
        ``{"start", "end", "value"}`` dicts, earliest first."""
        query = urlencode({"from": time_from, "to": time_to})
        answer = self._get(f"{self._key_path(table, key, key_serde)}?{query}")
        windows: list[dict[str, Any]] = answer["windows"]
        return windows

    def scan(self, table: str, *, prefix: str | bytes | None = None,
             start: str | bytes | None = None, end: str | bytes | None = None,
             page: int = 100, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """Every (key, value) of ``table`` on the instance asked, page by page. Bounds are
        key-serde bytes (text as UTF-8): ``prefix``, ``start`` inclusive, ``end``
        exclusive; ordered within each partition except for Redis tables."""
        params: dict[str, Any] = {"limit": page}
        for name, value in (("prefix", prefix), ("from", start), ("to", end),
                            ("partition", partition)):
            if value is not None:
                params[name] = value
        cursor = None
        while True:
            query = urlencode({**params, **({"cursor": cursor} if cursor else {})})
            answer = self._get(f"/tables/{quote(table, safe='')}?{query}")
            for key, value, _ in answer["items"]:
                yield key, value
            cursor = answer["cursor"]
            if cursor is None:
                return

    # -- HTTP -------------------------------------------------------------------------

    def _key_path(self, table: str, key: Any, key_serde: str | Serde | None) -> str:
        serde = serde_for(key_serde) if key_serde is not None else self._key_serde(table)
        encoded = serde.encode(key)
        if not encoded:
            raise BadQueryError(f"key {key!r} encodes to no bytes")
        return f"/tables/{quote(table, safe='')}/{quote(bytes(encoded), safe='')}"

    def _key_serde(self, table: str) -> Serde:
        if table not in self._serdes:
            names = []
            for described in self.tables():
                names.append(described["name"])
                name = described.get("key_serde")
                if name in ("bytes", "str", "json"):
                    self._serdes[described["name"]] = serde_for(name)
            if table not in names:
                raise UnknownTableError(f"no table {table!r} here; its tables: {names}")
        if table not in self._serdes:
            raise BadQueryError(f"table {table!r}: its key serde is not one the client "
                                "knows: pass key_serde=")
        return self._serdes[table]

    def _get(self, path: str) -> Any:
        failures = []
        for url in self.urls:
            request = urllib.request.Request(url + path, headers=self._headers)
            try:
                with self._opener.open(request, timeout=self.timeout) as reply:
                    return json.loads(reply.read())
            except urllib.error.HTTPError as exc:
                raise _error_of(exc) from None
            except (urllib.error.URLError, OSError) as exc:
                failures.append(f"{url}: {exc}")
        raise QueryUnavailableError(f"no query endpoint answered within {self.timeout:g}s: "
                                    f"{'; '.join(failures)}")


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Follows redirects (the bearer token goes along: every instance of a processor
    shares it), except from HTTPS to plain HTTP, which would send the token in clear."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,  # noqa: PLR0917 - urllib calls it so
                         msg: str, headers: Any, newurl: str) -> urllib.request.Request | None:
        if req.full_url.startswith("https://") and not newurl.startswith("https://"):
            raise QueryUnavailableError(f"{req.full_url} redirected to {newurl}: refused, "
                                        "a redirect from HTTPS to HTTP would send the "
                                        "token in clear")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _error_of(exc: urllib.error.HTTPError) -> QueryError:
    try:
        body = json.loads(exc.read())
    except ValueError:
        body = {}
    message = body.get("message") or f"HTTP {exc.code} from {exc.url}"
    if exc.code == 421:
        return NotHereError(message, partition=body.get("partition", -1),
                            endpoint=body.get("endpoint"))
    if body.get("error") == "KeyNotFoundError":
        return KeyNotFoundError(message, standby_lag=body.get("standby_lag"))
    kind = _ERRORS.get(body.get("error", "")) or _BY_STATUS.get(exc.code, QueryError)
    return kind(message)
