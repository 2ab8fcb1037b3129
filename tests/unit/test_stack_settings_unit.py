"""The local stack's settings and command lines, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasper_py.stack import StackError
from kasper_py.stack._components import Redis
from kasper_py.stack._postgres import Postgres
from kasper_py.stack._settings import Settings


def redis_command(tmp_path: Path) -> list[str]:
    """The redis-server command line the stack would run."""
    return Redis(Settings.load(tmp_path)).command("redis-server")


@pytest.mark.parametrize(("value", "expected"), [
    (None, ["--appendonly", "yes", "--appendfsync", "everysec"]),
    ("aof-always", ["--appendonly", "yes", "--appendfsync", "always"]),
    ("NONE", ["--appendonly", "no"]),
])
def test_redis_persistence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None,
                           expected: list[str]) -> None:
    """An append-only file fsynced every second unless KASPER_REDIS_PERSISTENCE says
    otherwise; never RDB snapshots; the data lives in the stack's redis/data folder."""
    if value is None:
        monkeypatch.delenv("KASPER_REDIS_PERSISTENCE", raising=False)
    else:
        monkeypatch.setenv("KASPER_REDIS_PERSISTENCE", value)
    command = " ".join(redis_command(tmp_path))
    assert " ".join(expected) in command and "--save  " in command
    assert f"--dir {tmp_path.resolve() / 'redis' / 'data'}" in command


def test_unknown_redis_persistence_names_the_variable(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt mode is refused before anything starts, listing the modes."""
    monkeypatch.setenv("KASPER_REDIS_PERSISTENCE", "rdb")
    with pytest.raises(StackError, match="KASPER_REDIS_PERSISTENCE='rdb' is not one of aof, "
                                         "aof-always, none"):
        redis_command(tmp_path)


def test_postgres_listens_on_its_own_port_and_the_loopback_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's PostgreSQL runs its own cluster from the stack folder on
    ``KASPER_POSTGRES_PORT`` (15432 by default), TCP on 127.0.0.1 only, no Unix socket in
    the system's folder; its URL names that port with trust authentication."""
    monkeypatch.delenv("KASPER_POSTGRES_PORT", raising=False)
    assert Postgres(Settings.load(tmp_path)).url == "postgresql://postgres@127.0.0.1:15432/postgres"
    monkeypatch.setenv("KASPER_POSTGRES_PORT", "43999")
    postgres = Postgres(Settings.load(tmp_path))
    command = postgres.command("/usr/lib/postgresql/15/bin/postgres")
    at = command.index("/usr/lib/postgresql/15/bin/postgres")
    assert command[at:] == [
        "/usr/lib/postgresql/15/bin/postgres", "-D", str(tmp_path.resolve() / "postgres" / "data"),
        "-p", "43999", "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
        "-c", "max_connections=200"]
    assert postgres.url == "postgresql://postgres@127.0.0.1:43999/postgres"
