"""The built site as a browser shows it, for the docs check
(tests/integration/test_docs_browser.py, ``make docs-check``): headless Chromium takes
a screenshot of a page, and reports what the page holds once its scripts have run,
through a probe script added to the page's copy (Chromium's ``--dump-dom``, no driver
library, nothing from the network)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WIDTH = 1280
"""The window's width: a laptop's, where code lines were cut before (issue 36)."""

_PROBE = Path(__file__).with_name("probe.js")
"""The script added to a page's copy; it reports into ``<script id="kasper-probe">``."""
_REPORT = re.compile(r'<script type="application/json" id="kasper-probe">(.*?)</script>',
                     re.DOTALL)


class BrowserError(RuntimeError):
    """Chromium is missing, failed, or the page never reported."""


def chromium() -> str:
    """Path of the Chromium binary (``make chromium`` installs Debian's package)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise BrowserError("Chromium not found on PATH; `make chromium` installs it "
                       "(apt-get install chromium)")


@contextlib.contextmanager
def serve(site: Path) -> Iterator[str]:
    """The built ``site`` over HTTP on a free loopback port: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def add_probe(site: Path, page: str) -> None:
    """Add the probe script to ``page`` (a folder of ``site``, ``""`` for the home)."""
    index = site / page / "index.html"
    script = f"<script>\n{_PROBE.read_text()}</script>"
    index.write_text(index.read_text().replace("</body>", script + "</body>", 1))


def _run(url: str, *flags: str, height: int) -> str:
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
               "--hide-scrollbars", "--no-first-run", "--disable-extensions",
               f"--window-size={WIDTH},{height}", "--virtual-time-budget=15000",
               *flags, url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            check=False)
    if result.returncode != 0:
        raise BrowserError(f"chromium failed on {url}: {result.stderr[-2000:]}")
    return result.stdout


def report(url: str) -> dict[str, Any]:
    """What the page at ``url`` (with the probe added) shows, as its probe reported."""
    found = _REPORT.search(_run(url, "--dump-dom", height=900))
    if found is None:
        raise BrowserError(f"{url}: the page's probe never reported")
    result: dict[str, Any] = json.loads(found.group(1))
    return result


def screenshot(url: str, png: Path, height: int = 2000) -> None:
    """A screenshot of the page at ``url``, ``WIDTH`` x ``height`` pixels, into ``png``."""
    _run(url, f"--screenshot={png}", height=height)
    if not png.is_file():
        raise BrowserError(f"chromium wrote no screenshot of {url}")
