"""Property test of expiry by event time (``Ttl(by="event")``) against a model: random
writes and deletes with out-of-order timestamps, wall-clock steps (which must change
nothing), batch cuts and restarts on a fresh state_dir (a restore from the changelog).
After every turn and every restore the table holds exactly the keys whose date, the
stream time of the turn that last wrote them, is less than the ttl behind the stream
time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kasper_py import Message
from kasper_py.stores.cassandra import CassandraTable
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.ttl import Ttl
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.testing.changelog import MemoryChangelogs
from tests.unit.test_ttl_properties import ttl_driver

TTL_MS = 10_000
TTL = Ttl(TTL_MS / 1000, by="event")

_time = st.integers(0, 60_000)
_write = st.tuples(st.just("write"), st.sampled_from("abcdef"), st.integers(1, 9), _time)
_delete = st.tuples(st.just("delete"), st.sampled_from("abcdef"), st.just(0), _time)
_wall = st.tuples(st.just("wall"), st.just(""), st.integers(0, 100), st.just(0))
_cut = st.tuples(st.just("cut"), st.just(""), st.just(0), st.just(0))
_restart = st.tuples(st.just("restart"), st.just(""), st.just(0), st.just(0))
STEPS = st.lists(st.one_of(_write, _write, _write, _delete, _wall, _cut, _restart),
                 max_size=40)


class _Model:
    """Key -> (value, date); the stream time never goes back, restarts included."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, int]] = {}
        self.stream_time = 0

    def turn(self, writes: list[tuple[str, int, int]]) -> None:
        self.stream_time = max([self.stream_time, *(at for _, _, at in writes)])
        now, written = self.stream_time, {key for key, _, _ in writes}
        self.keys = {k: v for k, v in self.keys.items() if k in written or v[1] + TTL_MS > now}
        for key, value, _ in writes:
            if value:
                self.keys[key] = (value, now)
            else:
                self.keys.pop(key, None)

    def live(self) -> dict[str, int]:
        return {k: value for k, (value, _) in self.keys.items()}


def _driver(state_dir: Path, changelogs: MemoryChangelogs | None, wall: float,
            memory: bool) -> ProcessorDriver:
    return ttl_driver(state_dir, changelogs, wall, memory, TTL)


def _restarted(driver: ProcessorDriver, state_dir: Path) -> ProcessorDriver:
    """``driver`` closed, and a RocksDB table's driver on the fresh ``state_dir``, restored
    from its changelogs: a restart on another machine."""
    driver.close()
    return _driver(state_dir, driver.changelogs, 1_700_000_000.0, memory=False)


def _messages(batch: list[tuple[str, int, int]]) -> list[Message]:
    return [make_message("in", f"{k}={v or ''}", timestamp=at) for k, v, at in batch]


def _check(steps: list[tuple[str, str, int, int]], memory: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        wall, restarts, model = 1_700_000_000.0, 0, _Model()
        driver = _driver(Path(folder) / "0", None, wall, memory)
        batch: list[tuple[str, int, int]] = []
        for op, key, number, at in [*steps, ("cut", "", 0, 0)]:
            if op in ("write", "delete"):
                batch.append((key, number, at))
            elif op == "wall":  # hours of wall clock: nothing expires by it
                driver.advance_wall_clock(number * 3600)
                wall += number * 3600
                assert dict(driver.store("t").items()) == model.live()
            elif op == "cut" or (op == "restart" and memory):
                driver.process(_messages(batch))
                model.turn(batch)
                batch = []
                assert dict(driver.store("t").items()) == model.live()
            else:  # a restart on another machine; the unflushed batch is lost
                batch = []
                driver.close()
                restarts += 1
                driver = _driver(Path(folder) / str(restarts), driver.changelogs, wall, memory)
                assert dict(driver.store("t").items()) == model.live()
        driver.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
# Found by hypothesis: keys dated 0 were restored with the wall clock Kafka stamps on a
# record produced with timestamp 0 (the first kept an expired key, the second expired
# every key: the restored table's time jumped to the wall clock).
@example([("write", "a", 1, 0), ("cut", "", 0, 0), ("restart", "", 0, 0),
          ("delete", "b", 0, 10_000)])
@example([("write", "a", 1, 0), ("cut", "", 0, 0), ("delete", "a", 0, 1), ("write", "a", 1, 0),
          ("cut", "", 0, 0), ("restart", "", 0, 0)])
def test_a_rocksdb_table_expires_keys_by_the_stream_time(
        steps: list[tuple[str, str, int, int]]) -> None:
    """RocksDB, with restores from the changelog at random points."""
    _check(steps, memory=False)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_a_memory_table_expires_keys_by_the_stream_time(
        steps: list[tuple[str, str, int, int]]) -> None:
    """The memory table, same model (a restart is a plain cut: its state is the dict)."""
    _check(steps, memory=True)


def test_a_late_record_is_dated_with_the_stream_time_not_its_own() -> None:
    """A record older than the stream time writes a key that lives a full ttl from the
    stream time: the key is not born expired."""
    with tempfile.TemporaryDirectory() as folder:
        driver = _driver(Path(folder), None, 1_700_000_000.0, memory=False)
        driver.process(_messages([("a", 1, 50_000)]))
        driver.process(_messages([("b", 2, 1_000)]))  # late by 49 s, ttl 10 s
        assert dict(driver.store("t").items()) == {"a": 1, "b": 2}
        driver.process(_messages([("c", 3, 59_999)]))
        assert dict(driver.store("t").items()) == {"a": 1, "b": 2, "c": 3}
        driver.process(_messages([("c", 4, 60_000)]))
        assert dict(driver.store("t").items()) == {"c": 4}
        driver.close()


def test_a_restore_keeps_the_stream_time_its_writes_were_dated_with() -> None:
    """After a restore on a fresh folder the table's time starts at its newest write's
    date, so a first batch of older records neither dates keys earlier nor revives the
    expiry of keys the stream time already covered."""
    with tempfile.TemporaryDirectory() as folder:
        driver = _driver(Path(folder) / "0", None, 1_700_000_000.0, memory=False)
        driver.process(_messages([("a", 1, 50_000)]))
        driver = _restarted(driver, Path(folder) / "1")
        driver.process(_messages([("b", 2, 1_000)]))
        driver.process(_messages([("c", 3, 55_000)]))
        assert dict(driver.store("t").items()) == {"a": 1, "b": 2, "c": 3}
        driver.process(_messages([("c", 4, 60_000)]))
        assert dict(driver.store("t").items()) == {"c": 4}
        driver.close()


def test_a_key_dated_0_keeps_its_date_through_a_restore() -> None:
    """A key written at stream time 0 is restored with date 0, not with the wall clock
    the producer stamps on a record produced with timestamp 0: it expires at stream time
    ``ttl`` after a restore as before it, and the restored table's time stays at 0."""
    with tempfile.TemporaryDirectory() as folder:
        driver = _driver(Path(folder) / "0", None, 1_700_000_000.0, memory=False)
        driver.process(_messages([("a", 1, 0)]))
        driver = _restarted(driver, Path(folder) / "1")
        driver.process(_messages([("b", 2, 9_999)]))
        assert dict(driver.store("t").items()) == {"a": 1, "b": 2}
        driver = _restarted(driver, Path(folder) / "2")
        assert dict(driver.store("t").items()) == {"a": 1, "b": 2}
        driver.process(_messages([("c", 3, 10_000)]))
        assert dict(driver.store("t").items()) == {"b": 2, "c": 3}
        driver.close()


@pytest.mark.parametrize("table", [RedisTable, CassandraTable])
def test_server_expiry_refuses_event_time(table: type) -> None:
    """Redis and Cassandra expire keys on their own clock: by='event' is refused."""
    with pytest.raises(ValueError, match="expires keys on the server's clock: ttl by='event' "
                                         "takes a RocksDBTable or a MemoryTable"):
        table("t", ttl=TTL)
