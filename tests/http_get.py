"""A GET the tests send to the library's HTTP servers (metrics, health), answering
error statuses too."""

from __future__ import annotations

import urllib.error
import urllib.request

__all__ = ["get"]


def get(url: str) -> tuple[int, str]:
    """Status and body of a GET, also for 4xx/5xx."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
