"""The query server's settings of ``Config`` checked (``kasper_py.config``): its port,
address, bearer token, TLS pair, key partitioner and announced endpoint. A bad one is a
``ConfigError`` naming it. Also the URL the server is reached by (``query_url``), the
one rule for the commit notes' endpoint and a group member's published one.
"""

from __future__ import annotations

import re
import socket
from typing import Any, Literal, get_args

from kasper_py._support.secrets import remember_secrets
from kasper_py.exceptions import ConfigError

__all__ = ["PARTITIONERS", "Partitioner", "announced_endpoint", "check_port",
           "check_query_settings", "query_url"]

Partitioner = Literal["crc32", "murmur2"]
"""How a key's partition is found (``Config.query_partitioner``)."""
PARTITIONERS: tuple[str, ...] = get_args(Partitioner)
_ENDPOINT = re.compile(r"^https?://[^\s/]+/?$")
_MIN_TOKEN = 16
_WILDCARDS = ("0.0.0.0", "::", "")


def check_port(name: str, port: Any) -> None:
    """``port`` is a TCP port or ``None``."""
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 <= port <= 65535):
        raise ConfigError(name, f"must be a port 0..65535 or None, got {port!r}")


def check_query_settings(config: Any) -> str | None:
    """Check ``config``'s query settings (a ``Config`` under construction); its
    ``query_endpoint`` without a trailing slash, or ``None``."""
    check_port("query_port", config.query_port)
    if config.query_port is not None and config.query_port != 0 \
            and config.query_port == config.metrics_port:
        raise ConfigError("query_port", f"{config.query_port} is the metrics port too: the "
                          "tables are served apart from the metrics; choose another")
    if not isinstance(config.query_host, str) or not config.query_host.strip():
        raise ConfigError("query_host", f"must be an address to bind, got {config.query_host!r}")
    token = config.query_token
    if token is not None:
        if not isinstance(token, str) or len(token) < _MIN_TOKEN or token != token.strip():
            raise ConfigError("query_token", f"must be a string of at least {_MIN_TOKEN} "
                              "characters without surrounding spaces (a random secret)")
        remember_secrets({"query_token": token})
    tls = {"query_tls_cert": config.query_tls_cert, "query_tls_key": config.query_tls_key}
    for name, path in tls.items():
        if path is not None and not (isinstance(path, str) and path):
            raise ConfigError(name, f"must be a PEM file path or None, got {path!r}")
    if (config.query_tls_cert is None) != (config.query_tls_key is None):
        missing = next(name for name, path in tls.items() if path is None)
        raise ConfigError(missing, "is needed too: TLS takes a certificate and its key")
    if config.query_partitioner not in PARTITIONERS:
        raise ConfigError("query_partitioner", "must be 'crc32' (librdkafka's default) or "
                          f"'murmur2' (the Java client's), got {config.query_partitioner!r}")
    endpoint = config.query_endpoint
    if endpoint is None:
        return None
    if not isinstance(endpoint, str) or not _ENDPOINT.match(endpoint):
        raise ConfigError("query_endpoint", "must be an http(s) URL without spaces or a "
                          f"path, like 'http://host:9100', got {endpoint!r}")
    return endpoint.rstrip("/")


def query_url(config: Any, port: int) -> str:
    """The URL other instances reach ``config``'s query server by, serving on ``port``:
    ``query_endpoint`` when set, else ``http(s)://<host>:<port>`` (the hostname for a
    wildcard ``query_host``, an IPv6 address in brackets)."""
    if config.query_endpoint:
        return str(config.query_endpoint)
    scheme = "https" if config.query_tls_cert is not None else "http"
    host = config.query_host
    if host in _WILDCARDS:
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def announced_endpoint(config: Any) -> str | None:
    """``config``'s query URL as known before its server starts (``query_url``): ``None``
    without a ``query_port``, or with port 0 and no ``query_endpoint`` (the kernel picks
    the port at bind)."""
    if config.query_port is None or (config.query_port == 0 and not config.query_endpoint):
        return None
    return query_url(config, config.query_port)
