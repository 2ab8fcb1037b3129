"""Whether a TCP port on the loopback is free now: the stack's port choices and the
test containers' (host networking) both ask it."""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "bindable"]

LOOPBACK = "127.0.0.1"


def bindable(port: int) -> bool:
    """True when nothing holds ``port`` on the loopback (a bind succeeds now)."""
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True
