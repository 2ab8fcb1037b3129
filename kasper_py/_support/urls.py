"""A server's URL as errors and logs name it: without credentials."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["server_address"]


def server_address(url: str, default_port: int, *, scheme: str | None = None,
                   with_path: bool = True) -> str:
    """``scheme://host:port[/path]`` of ``url``: its user and password left out, its port
    ``default_port`` when the URL names none. ``scheme`` replaces the URL's own (a
    PostgreSQL URL may be ``postgres://`` or ``postgresql://``); ``with_path=False``
    drops the path (a database number or name that says nothing of the server)."""
    parts = urlsplit(url)
    path = parts.path if with_path else ""
    return f"{scheme or parts.scheme}://{parts.hostname}:{parts.port or default_port}{path}"
