"""Time to live on local tables (``RocksDBTable(ttl=)``, ``MemoryTable(ttl=)``), driven
by ``ProcessorDriver``'s wall clock: a key expires ``ttl`` after its last write, is
removed with a changelog tombstone, and a restore never brings it back."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.stores.ttl import Ttl
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.testing.changelog import MemoryChangelogs

CHANGELOG = "ttl-seen-changelog"
START = 1_700_000_000.0


class Seen(MessageProcessor):
    """Each value ``key=value`` writes ``key`` to table "seen" (``key=`` deletes it)."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        seen = self.context.store("seen")
        for message in messages:
            key, _, value = message.value.partition("=")
            if value:
                seen.put(key, value)
            else:
                seen.delete(key)


def _driver(state_dir: Path, *, ttl: float | Ttl | None = 10.0, guarantee: str = "at_least_once",
            changelogs: MemoryChangelogs | None = None, start: float = START,
            memory: bool = False) -> ProcessorDriver:
    config = Config(name="ttl", bootstrap_servers="unused:9092", input_topics=["in"],
                    key_serde="str", value_serde="str", state_dir=str(state_dir),
                    processing_guarantee=guarantee)  # type: ignore[arg-type]
    table = MemoryTable("seen", ttl=ttl) if memory else RocksDBTable("seen", ttl=ttl)
    return ProcessorDriver(Seen, config=config, stores=[table], changelogs=changelogs,
                           wall_clock_start=start)


def _write(driver: ProcessorDriver, *values: str) -> None:
    driver.process([make_message("in", value) for value in values])


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_an_expired_key_is_removed_with_a_tombstone(tmp_path: Path, guarantee: str) -> None:
    """a and b written at t, a rewritten at t+6; at t+11 the next turn removes b only,
    with a tombstone after its write in the changelog; a expires at t+16."""
    driver = _driver(tmp_path, guarantee=guarantee)
    _write(driver, "a=1", "b=1")
    driver.advance_wall_clock(6)
    _write(driver, "a=2")
    driver.advance_wall_clock(5)
    _write(driver, "c=1")
    assert dict(driver.store("seen").items()) == {"a": "2", "c": "1"}
    assert driver.changelogs.records(CHANGELOG)[-2:] in ([(b"c", b'"1"'), (b"b", None)],
                                                         [(b"b", None), (b"c", b'"1"')])
    driver.advance_wall_clock(5)
    _write(driver)
    assert dict(driver.store("seen").items()) == {"c": "1"}
    assert driver.changelogs.records(CHANGELOG)[-1] == (b"a", None)
    driver.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_restore_holds_no_expired_key(tmp_path: Path, guarantee: str) -> None:
    """A driver on a fresh state_dir, restoring after the ttl passed and before any turn
    removed the keys, reads none of them, and its first turn writes their tombstones."""
    first = _driver(tmp_path / "a", guarantee=guarantee)
    _write(first, "a=1", "b=1")
    first.advance_wall_clock(8)
    _write(first, "b=2")
    first.close()
    second = _driver(tmp_path / "b", guarantee=guarantee, changelogs=first.changelogs,
                     start=START + 12)
    assert dict(second.store("seen").items()) == {"b": "2"}
    assert second.store("seen").get("a") is None
    _write(second)
    assert first.changelogs.records(CHANGELOG)[-1] == (b"a", None)
    third = _driver(tmp_path / "c", guarantee=guarantee, changelogs=first.changelogs,
                    start=START + 12)
    assert dict(third.store("seen").items()) == {"b": "2"}
    second.close()
    third.close()


def test_turning_ttl_on_restores_the_files_with_each_keys_expiry(tmp_path: Path) -> None:
    """Files written without a ttl hold no expiry: opened with one, they are read again
    from the changelog, whose records carry their write time, so old keys expire too."""
    plain = _driver(tmp_path, ttl=None)
    _write(plain, "old=1")
    plain.advance_wall_clock(100)
    _write(plain, "new=1")
    plain.close()
    with_ttl = _driver(tmp_path, changelogs=plain.changelogs, start=START + 105)
    assert dict(with_ttl.store("seen").items()) == {"new": "1"}
    with_ttl.advance_wall_clock(6)
    _write(with_ttl)
    assert dict(with_ttl.store("seen").items()) == {}
    assert sorted(plain.changelogs.records(CHANGELOG)[-2:]) == [(b"new", None), (b"old", None)]
    with_ttl.close()


def test_a_turn_removes_at_most_sweep_limit_keys_oldest_first(tmp_path: Path) -> None:
    """Five keys written a second apart, all expired: sweep_limit=2 removes two a turn,
    in the order they were written."""
    driver = _driver(tmp_path, ttl=Ttl(10.0, sweep_limit=2))
    for key in "abcde":
        _write(driver, f"{key}=1")
        driver.advance_wall_clock(1)
    driver.advance_wall_clock(20)
    remaining = []
    for _ in range(3):
        _write(driver)
        remaining.append("".join(sorted(dict(driver.store("seen").items()))))
    assert remaining == ["cde", "e", ""]
    driver.close()


def test_a_deleted_key_is_not_expired_again(tmp_path: Path) -> None:
    """A key deleted by the processor leaves no expiry behind: no second tombstone."""
    driver = _driver(tmp_path)
    _write(driver, "a=1")
    _write(driver, "a=")
    driver.advance_wall_clock(30)
    _write(driver)
    assert driver.changelogs.records(CHANGELOG) == [(b"a", b'"1"'), (b"a", None)]
    driver.close()


def test_the_memory_table_expires_by_last_write(tmp_path: Path) -> None:
    """The memory table: a rewritten key lives on, the other expires."""
    driver = _driver(tmp_path, memory=True)
    _write(driver, "a=1", "b=1")
    driver.advance_wall_clock(6)
    _write(driver, "a=2")
    driver.advance_wall_clock(5)
    _write(driver)
    assert dict(driver.store("seen").items()) == {"a": "2"}
    driver.close()


@pytest.mark.parametrize("ttl", [0, -1.0, True])
def test_a_ttl_must_be_positive(ttl: float) -> None:
    """ttl=0, a negative one or a bool is a ValueError naming the value."""
    with pytest.raises(ValueError, match="ttl must be a positive number of seconds"):
        RocksDBTable("seen", ttl=ttl)


def test_a_global_table_takes_no_ttl() -> None:
    """A global table is written by its changelog's owner: ttl= there is refused."""
    with pytest.raises(ValueError, match="give the ttl to that table"):
        RocksDBTable("seen", global_table=True, changelog_topic="x", ttl=5)
