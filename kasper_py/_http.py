"""The base of kasper_py's small HTTP endpoints (the loop's metrics and health, the
supervisor's): one way to answer, and no access log (probes and scrapes every few
seconds would flood stderr)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any

__all__ = ["QuietHandler"]


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler with ``_send`` and a silent access log."""

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet."""
