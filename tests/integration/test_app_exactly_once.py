"""Exactly-once through an application's repartition hop, on the real broker: the
page-view app (rekey_app_module.py: re-key by user, count per user in RocksDB) run with
``kasper run`` and SIGKILLed at random moments, then run to the end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores", "app_harness")
from app_harness import (  # isort: skip  # noqa: E402
    AppWorker, committed_totals, ends, internal_topics_deleted, kill_at_random,
    produce_views, store_counts, updates, write_config)


def test_killed_app_counts_exactly_and_updates_once(bootstrap, new_topic, kafka, unique_name,
                                                    tmp_path) -> None:
    """24,000 page views over 4 partitions, the app SIGKILLed at six random moments,
    then run with --until-caught-up: each user's count in the table is exact, a
    read_committed reader sees every (user, n) update exactly once for n = 1..count,
    and the group's committed offsets are at the end of the source and of the
    repartition topic (so every re-keyed record was counted, once)."""
    partitions, total, kills = 4, 24_000, 6
    source = new_topic("views", partitions=partitions)
    output = new_topic("user-counts", partitions=2)
    name = unique_name("app-eos")
    repartition = f"{name}-by-user-repartition"
    expected = produce_views(kafka, source, total)
    config = write_config(tmp_path / "app.toml", name=name, bootstrap_servers=bootstrap,
                          state_dir=str(tmp_path / "state"), key_serde="str",
                          value_serde="str", batch_size=200, batch_wait=0.1,
                          processing_guarantee="exactly_once")

    def start(run: int, *options: str) -> AppWorker:
        return AppWorker(config, tmp_path / f"run{run}.log", source, output, *options,
                         pause=0.03)

    with internal_topics_deleted(bootstrap, name):
        progress = committed_totals(kafka, name, [source, repartition], partitions)
        at_kill = kill_at_random(start, kills, progress, within=(0.5, 3.0))
        # the kills landed mid-run, some while re-keyed records waited to be counted
        assert any(0 < done < total for done, _ in at_kill), at_kill
        assert any(0 < counted < total for _, counted in at_kill), at_kill
        last = start(kills, "--until-caught-up")
        assert last.finish() == 0, last.text()[-3000:]

        assert kafka.committed(name, source, partitions) == ends(bootstrap, source, partitions)
        assert kafka.committed(name, repartition, partitions) == ends(
            bootstrap, repartition, partitions)
        counts = store_counts(bootstrap, name, source, tmp_path / "state",
                              partitions=partitions, users=sorted(expected),
                              guarantee="exactly_once")
        assert counts == expected
        seen = updates(kafka, output)
        assert set(seen.values()) == {1}, {u: n for u, n in seen.items() if n != 1}
        assert set(seen) == {(user, n) for user, count in expected.items()
                             for n in range(1, count + 1)}
