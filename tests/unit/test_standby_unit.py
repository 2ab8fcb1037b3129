"""Standby replicas without a broker: the settings' checks, where ``kasper run
--processes N`` places the standbys, and the mark a standby leaves on its folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasper_py import Config
from kasper_py.exceptions import ConfigError, KeyNotFoundError, NotHereError
from kasper_py.loop.standby import NoStandbys, standbys_for
from kasper_py.observability.observe import NOOP_STORE_OBSERVER
from kasper_py.query import Lookup, Tables
from kasper_py.stores.localdb import LocalDB
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.stores.standby import StandbyReplicas, _Copy
from kasper_py.supervisor import standby_sets
from tests.warm_copies import Warm


def config(**fields: object) -> Config:
    return Config(name="wc", bootstrap_servers="unused:0", input_topics=["lines"],
                  **fields)  # type: ignore[arg-type]


def test_standby_partitions_are_sorted_and_never_owned() -> None:
    """A process keeps warm partitions it does not own; the list comes back sorted."""
    assert config(input_partitions=[2], standby_partitions=[1, 0]).standby_partitions == (0, 1)
    with pytest.raises(ConfigError, match=r"'standby_partitions': a partition this process "
                                          r"owns cannot be its standby too: \[1\]"):
        config(input_partitions=[1], standby_partitions=[0, 1])
    with pytest.raises(ConfigError, match="owns every partition"):
        config(standby_partitions=[0])
    with pytest.raises(ConfigError, match="'standby_partitions': invalid partition -1"):
        config(input_partitions=[1], standby_partitions=[-1])
    with pytest.raises(ConfigError, match="must be None with assignment='group'"):
        config(assignment="group", standby_partitions=[0])


def test_num_standby_replicas_is_a_count() -> None:
    assert config().num_standby_replicas == 0
    with pytest.raises(ConfigError, match=r"'num_standby_replicas': must be an int >= 0, got -1"):
        config(num_standby_replicas=-1)


def test_workers_keep_warm_the_partitions_of_the_workers_after_them() -> None:
    """Each partition is warm in min(r, N-1) other workers; none without replicas, and
    none in group mode (where the sets are None)."""
    sets = [[0, 1], [2, 3], [4]]
    assert standby_sets(sets, 1) == [[2, 3], [4], [0, 1]]
    assert standby_sets(sets, 5) == [[2, 3, 4], [0, 1, 4], [0, 1, 2, 3]]
    assert standby_sets(sets, 0) == [[], [], []]
    assert standby_sets([[0, 1]], 1) == [[]]
    assert standby_sets([None, None], 1) == [[], []]


def test_a_standby_is_chosen_only_for_tables_with_a_changelog(tmp_path: Path) -> None:
    """No standby partitions, or no local changelogged table: nothing is kept warm."""
    cfg = config(input_partitions=[1], standby_partitions=[0], state_dir=str(tmp_path))
    assert isinstance(standbys_for(cfg, [RocksDBTable("t", changelog=False)],
                                   NOOP_STORE_OBSERVER), NoStandbys)
    assert isinstance(standbys_for(config(), [RocksDBTable("t")], NOOP_STORE_OBSERVER),
                      NoStandbys)
    assert standbys_for(cfg, [RocksDBTable("t")], NOOP_STORE_OBSERVER).partitions == (0,)


def test_the_standby_mark_survives_a_reopen_until_cleared(tmp_path: Path) -> None:
    db = LocalDB(tmp_path / "0")
    assert not db.standby
    db.standby = True
    db.close()
    db = LocalDB(tmp_path / "0")
    assert db.standby
    db.standby = False
    db.standby = False
    assert not db.standby
    db.close()


def test_a_stale_lookup_is_answered_by_a_warm_copy_with_its_lag() -> None:
    """A key of a partition kept warm here: ``stale`` reads the copy and says its lag;
    without it (or for a key the copy lacks) the owner is required."""
    tables = Tables(config(), [MemoryTable("counts", key_serde="str")], dict,
                    partition_count=lambda: 1, warm=lambda: {0: {"counts": Warm()}})
    assert tables.find("counts", "alice", stale=True) == Lookup(3, None, 7)
    with pytest.raises(NotHereError):
        tables.find("counts", "alice")
    with pytest.raises(KeyNotFoundError, match="standby copy of input partition 0, 7 "
                       "changelog offsets behind its owner's") as missing:
        tables.find("counts", "bob", stale=True)
    assert missing.value.standby_lag == 7


class Changelog:
    """A changelog reader whose partitions end at offset 50, none read yet."""

    topic = "wc-counts-changelog"

    def __init__(self) -> None:
        self.positions: dict[int, int] = {}

    def watermarks(self, partition: int) -> tuple[int, int]:
        return 0, 50

    def assign(self, starts: dict[int, int]) -> None:
        self.starts = starts

    def close(self) -> None:
        pass


def keeping_zero(tmp_path: Path) -> StandbyReplicas:
    """Standbys of partition 0's "counts" table, on a ``Changelog`` ending at 50."""
    table = RocksDBTable("counts", key_serde="str")
    replicas = StandbyReplicas(config(state_dir=str(tmp_path), input_partitions=[2]),
                               [table], [0], NOOP_STORE_OBSERVER)
    replicas._copies = [_Copy(table, Changelog(), {})]  # type: ignore[arg-type]
    return replicas


def test_a_new_copy_states_what_it_has_left_to_read_and_a_kept_one_its_measured_lag(
        tmp_path: Path) -> None:
    """A copy just opened answers stale lookups with the offsets it has yet to read, not
    0; a change of what is kept leaves the kept copies' measured lag as it was."""
    replicas = keeping_zero(tmp_path)
    try:
        replicas.keep([0])
        assert replicas.queryable()[0]["counts"].lag == 50
        replicas._copies[0].warm[0].lag = 4  # measured by the thread since
        replicas.keep([0, 1])
        assert {p: w["counts"].lag for p, w in replicas.queryable().items()} == {0: 4, 1: 50}
    finally:
        replicas.close()


def test_a_partition_promoted_then_released_is_kept_warm_again(tmp_path: Path) -> None:
    """A static standby's partition promoted here stops being kept warm (its folder
    handed to the owner); released (``revoked``), it is kept warm again, from that folder,
    while one never asked for stays cold."""
    replicas = keeping_zero(tmp_path)
    try:
        replicas.keep([0])
        replicas.promote([0, 1])
        assert (replicas.partitions, list(replicas._copies[0].dbs)) == ((), [])
        replicas.revoked([0, 1])
        assert (replicas.partitions, list(replicas._copies[0].dbs)) == ((0,), [0])
    finally:
        replicas.close()


def test_a_group_member_places_its_standbys_by_the_group() -> None:
    """A group member asked for standbys keeps warm what the group placement gives it,
    none to begin with (the group is described once it runs)."""
    standbys = standbys_for(config(assignment="group", num_standby_replicas=1),
                            [RocksDBTable("t")], NOOP_STORE_OBSERVER)
    assert isinstance(standbys, StandbyReplicas)
    assert standbys.partitions == ()
    assert isinstance(standbys_for(config(assignment="group"), [RocksDBTable("t")],
                                   NOOP_STORE_OBSERVER), NoStandbys)
