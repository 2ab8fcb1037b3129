"""Output timestamps of a DSL app run as users run it: ``kasper run --until-caught-up``
of a count joined with a table (RocksDB stores, their changelogs on the stack's
Kafka), the output topics' record timestamps read back: the count's updates carry
the largest time counted so far, the join's the later of its two sides', also after
the state folder is lost and restored from the changelogs."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_dsl_examples import app_module, internal_topics, kasper_run, run_env  # isort: skip  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

APP = '''
from kasper_py.dsl import Builder


def build(clicks, users, counts_out, joined_out):
    b = Builder("stamps", cache=False, timestamps="latest")
    counts = b.stream(clicks).group_by_key().count("clicks-per-user")
    counts.to_stream().to(counts_out)
    named = counts.join(b.table(users), lambda n, user: {"clicks": n, "name": user})
    named.to_stream().to(joined_out)
    return b.build()
'''


def test_counts_and_table_joins_carry_kafka_streams_timestamps(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Run 1 reads a user (time 500), run 2 three clicks (times 100, 900, 300, the last
    one late): counts stamped 100, 900, 900, joined with the user at 500, 900, 900.
    The state folder is then lost; run 3 reads a late click (200) and the user renamed
    (600): the count, restored with its time from the changelogs, is stamped 900, and
    so is every joined result (the later side is the count)."""
    clicks, users = new_topic("stamp-clicks"), new_topic("stamp-users")
    counts_out, joined_out = unique_name("stamp-counts"), unique_name("stamp-joined")
    (tmp_path / "stamps_app.py").write_text(APP)
    app_dir = app_module(tmp_path, "stamps_app", f"build({clicks!r}, {users!r}, "
                                                 f"{counts_out!r}, {joined_out!r})")
    env = run_env(bootstrap, tmp_path / "state", key_serde="json", value_serde="json")
    flags = ("--name", unique_name("stamps"), "--create-topics", "--output-topics",
             f"{counts_out},{joined_out}")
    base = int(time.time() * 1000) - 60_000  # recent: retention keeps the records

    def produce(topic: str, records: list[tuple[str, Any, int]]) -> None:
        kafka.produce(topic, [(json.dumps(k).encode(), json.dumps(v).encode(), base + t)
                              for k, v, t in records])

    def sent(topic: str) -> list[tuple[Any, int]]:
        return [(json.loads(m.value()), m.timestamp()[1] - base) for m in kafka.read_all(topic)]

    produce(users, [("u1", "Ann", 500)])
    kasper_run(app_dir, env, *flags)
    produce(clicks, [("u1", "c", t) for t in (100, 900, 300)])
    kasper_run(app_dir, env, *flags)
    assert sent(counts_out) == [(1, 100), (2, 900), (3, 900)]
    assert sent(joined_out) == [({"clicks": n, "name": "Ann"}, t)
                                for n, t in ((1, 500), (2, 900), (3, 900))]

    shutil.rmtree(tmp_path / "state")
    produce(clicks, [("u1", "c", 200)])
    produce(users, [("u1", "Bo", 600)])
    kasper_run(app_dir, env, *flags)
    assert sent(counts_out)[3:] == [(4, 900)]
    joined = sent(joined_out)[3:]
    assert joined[-1] == ({"clicks": 4, "name": "Bo"}, 900)
    assert {t for _, t in joined} == {900}
