"""Property test of tables with a time to live against a model: random writes, deletes,
wall-clock steps, batch cuts and restarts on a fresh state_dir (a restore from the
changelog); after every turn and every restore the table holds exactly the keys whose
last write is younger than the ttl."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.stores.ttl import Ttl
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.testing.changelog import MemoryChangelogs

TTL = 10.0
START = 1_700_000_000.0

_write = st.tuples(st.just("write"), st.sampled_from("abcdef"), st.integers(1, 9))
_delete = st.tuples(st.just("delete"), st.sampled_from("abcdef"), st.just(0))
_advance = st.tuples(st.just("advance"), st.just(""), st.integers(0, 7))
_cut = st.tuples(st.just("cut"), st.just(""), st.just(0))
_restart = st.tuples(st.just("restart"), st.just(""), st.just(0))
STEPS = st.lists(st.one_of(_write, _write, _delete, _advance, _cut, _restart), max_size=40)


class Apply(MessageProcessor):
    """``key=value`` writes, ``key=`` deletes, in table "t"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        table = self.context.store("t")
        for message in messages:
            key, _, value = message.value.partition("=")
            table.put(key, int(value) if value else None)


class _Model:
    """Key -> (value, time of its last write); a turn expires, then writes."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, float]] = {}

    def turn(self, writes: list[tuple[str, int]], now: float) -> None:
        written = {key for key, _ in writes}
        self.keys = {k: v for k, v in self.keys.items() if k in written or v[1] + TTL > now}
        for key, value in writes:
            if value:
                self.keys[key] = (value, now)
            else:
                self.keys.pop(key, None)

    def live(self, now: float) -> dict[str, int]:
        return {k: value for k, (value, at) in self.keys.items() if at + TTL > now}


def ttl_driver(state_dir: Path, changelogs: MemoryChangelogs | None, now: float,
               memory: bool, ttl: float | Ttl = TTL) -> ProcessorDriver:
    """A driver of ``Apply`` on table "t" (memory or RocksDB) with ``ttl``, its wall
    clock at ``now``."""
    config = Config(name="p", bootstrap_servers="unused:9092", input_topics=["in"],
                    value_serde="str", state_dir=str(state_dir))
    table = MemoryTable("t", ttl=ttl) if memory else RocksDBTable("t", ttl=ttl)
    return ProcessorDriver(Apply, config=config, stores=[table], changelogs=changelogs,
                           wall_clock_start=now)


def _check(steps: list[tuple[str, str, int]], memory: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        now, restarts, model = START, 0, _Model()
        driver = ttl_driver(Path(folder) / "0", None, now, memory)
        batch: list[tuple[str, int]] = []
        for op, key, number in [*steps, ("cut", "", 0)]:
            if op in ("write", "delete"):
                batch.append((key, number))
            elif op == "advance":
                driver.advance_wall_clock(number)
                now += number
            elif op == "cut" or (op == "restart" and memory):
                driver.process([make_message("in", f"{k}={v or ''}") for k, v in batch])
                model.turn(batch, now)
                batch = []
                assert dict(driver.store("t").items()) == model.live(now)
            else:  # a restart on another machine; the unflushed batch is lost
                batch = []
                driver.close()
                restarts += 1
                driver = ttl_driver(Path(folder) / str(restarts), driver.changelogs, now, memory)
                assert dict(driver.store("t").items()) == model.live(now)
        driver.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_a_rocksdb_table_holds_exactly_the_keys_younger_than_its_ttl(
        steps: list[tuple[str, str, int]]) -> None:
    """RocksDB, with restores from the changelog at random points."""
    _check(steps, memory=False)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_a_memory_table_holds_exactly_the_keys_younger_than_its_ttl(
        steps: list[tuple[str, str, int]]) -> None:
    """The memory table, same model (a restart is a plain cut: its state is the dict)."""
    _check(steps, memory=True)
