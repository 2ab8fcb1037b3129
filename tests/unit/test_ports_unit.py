"""The one place free ports come from: below the kernel's ephemeral range, where no
outgoing connection takes one after the probe (two CI failures: a supervisor's worker
could not bind P+1, held by another process's client connection for minutes)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kasper_py._support import ports


def test_a_block_of_free_ports_lies_below_the_ephemeral_range_and_binds() -> None:
    low, _ = ports.ephemeral_range()
    for _ in range(50):
        first = ports.free_ports(3)
        assert first >= 20000 and first + 2 < low
        for port in range(first, first + 3):
            with socket.socket() as server:
                server.bind((ports.LOOPBACK, port))


def test_a_held_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the choice forced onto a port a listener holds, the next one is drawn."""
    with socket.socket() as holder:
        holder.bind((ports.LOOPBACK, 0))
        holder.listen()
        held = holder.getsockname()[1]
        draws = iter([held, held + 10])
        monkeypatch.setattr(ports.random, "randrange", lambda *_: next(draws))
        assert ports.free_ports(1) == held + 10


def test_a_machine_whose_range_starts_low_gets_ports_above_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("10000\t40000\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", setting)
    assert ports.ephemeral_range() == (10000, 40000)
    assert 40000 < ports.free_ports(2) < 65535


def test_an_unreadable_range_is_linuxs_default(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_range() == (32768, 60999)
