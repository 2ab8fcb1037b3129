"""Free TCP ports on the loopback: the stack's port choices, the test containers' (host
networking) and the test suite's servers all ask here.

A port handed out is chosen below the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``). A port inside it can be free when probed
and taken a moment later as the local port of any process's outgoing connection (a
Kafka client's, a JVM's), which then holds it for as long as the connection lives; a
server that binds it later fails with "Address already in use"."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["LOOPBACK", "bindable", "free_ports"]

LOOPBACK = "127.0.0.1"

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_EPHEMERAL = (32768, 60999)
_LOWEST = 20000
"""The lowest port handed out: the stack's own defaults lie below it."""


def bindable(port: int) -> bool:
    """True when nothing holds ``port`` on the loopback (a bind succeeds now)."""
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    """The first and last port the kernel gives outgoing connections (Linux's default
    where the machine does not say)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return _LINUX_EPHEMERAL
    return low, high


def free_ports(count: int = 1) -> int:
    """A port P such that P ... P+count-1 are free on the loopback now and outside the
    ephemeral range, so that no outgoing connection takes one of them later. Two callers
    at the same moment may still draw the same P (one in thousands): a server that fails
    to bind it says so."""
    low, high = ephemeral_range()
    if low - _LOWEST > 1000 + count:
        first_choice, last_choice = _LOWEST, low - count
    else:
        first_choice, last_choice = high + 1, 65536 - count
    while True:
        first = random.randrange(first_choice, last_choice)
        if all(bindable(first + offset) for offset in range(count)):
            return first
