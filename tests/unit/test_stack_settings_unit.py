"""The local stack's settings and command lines, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasper_py.stack import StackError
from kasper_py.stack._components import Redis
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
