"""An ``AsyncMessageProcessor`` for the async CLI tests: for each input value ``n`` it
GETs ``$LOOKUP_URL/lookup/<n>`` (plain HTTP/1.0 over asyncio streams) and sends the
answer's body to ``$LOOKUP_OUTPUT_TOPIC`` under the input's key. A status other than 200
raises ``LookupFailedError``.

    kasper run async_module:Lookup --app-dir tests/integration --config kasper.toml
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

from kasper_py import AsyncMessageProcessor, Message, Sender


class LookupFailedError(Exception):
    """The lookup service answered with an error status."""


async def get(url: str) -> tuple[int, bytes]:
    """``GET url``: its status and body."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(f"GET {parts.path} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


class Lookup(AsyncMessageProcessor):
    """One lookup per message; a key's lookups in offset order."""

    async def process_message(self, message: Message, sender: Sender) -> None:
        value = message.value.decode()
        status, body = await get(f"{os.environ['LOOKUP_URL']}/lookup/{value}")
        if status != 200:
            raise LookupFailedError(f"lookup of {value} answered {status}")
        sender.send(os.environ["LOOKUP_OUTPUT_TOPIC"], body, key=message.key)
