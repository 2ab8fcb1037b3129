"""A packed repartition record read by a kasper_py older than packing, on the real
broker: the older ``kasper run`` (the last commit before packing, from git history) stops
on it, naming it, and commits nothing of it; the upgraded app then reads it, exactly.
This is what makes packing safe as the default in a rolling upgrade or a roll-back: an
older reader fails loudly instead of skipping the record as one with no key."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_clients import Producer

sys.path.insert(0, str(Path(__file__).parent))
from test_dsl_examples import app_module, internal_topics, kasper_run  # isort: skip  # noqa: F401 - a fixture
from test_dsl_packed_cli import word_count_run  # isort: skip

from kasper_py.dsl._packing import Packer
from kasper_py.dsl.packed import PACKED, PACKED_KEY

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

BEFORE_PACKING = "d904843aecb63af198eae3fc4d66373cef90351a"
"""The last commit before packed repartition records (06801c0 introduced them)."""
REPO = Path(__file__).resolve().parents[2]


def older_kasper_py(folder: Path) -> Path:
    """The kasper_py of ``BEFORE_PACKING`` extracted into ``folder``; the test is skipped
    where the history does not hold it (a shallow clone)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_PACKING, "kasper_py"],
                             capture_output=True, check=False, timeout=60)
    if archive.returncode != 0:
        pytest.skip(f"git history without {BEFORE_PACKING[:7]}: {archive.stderr[-300:]!r}")
    folder.mkdir()
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True,
                   timeout=60)
    return folder


def produce_packed(bootstrap: str, topic: str, words: list[str]) -> None:
    """``words`` (each counted once) packed into one record of ``topic``'s partition 0,
    as the upgraded app's stage writes it."""
    keys = [json.dumps(word).encode() for word in words]
    (record,) = Packer().pack(topic, keys, [b"1"] * len(keys), [1_700_000_000_000] * len(keys),
                              None, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(*record)
    assert producer.flush(30) == 0


def test_an_older_reader_stops_on_a_packed_record_and_commits_nothing(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Run 1 (this version, plain) counts "a b a" and commits its 3 repartition records;
    a packed record of "c a" is then in the repartition. The version before packing
    fails on it (exit code not 0, the record's topic, partition and offset named), its
    output and committed offsets unchanged. The upgraded app reads it: every count exact,
    every offset committed."""
    older = older_kasper_py(tmp_path / "older")
    lines, out, name, env, flags = word_count_run(tmp_path, bootstrap, new_topic,
                                                  unique_name, "older")
    repartition = f"{name}-by-word-repartition"
    kafka.produce(lines, [(b'"d1"', json.dumps("a b a").encode())])
    unpacked = f"build({lines!r}, {out!r}, pack_repartitions=False)"
    kasper_run(app_module(tmp_path, "packed_app", unpacked), env, *flags)
    produce_packed(bootstrap, repartition, ["c", "a"])
    sent = len(kafka.read_all(out))
    app_dir = app_module(tmp_path, "packed_app", f"build({lines!r}, {out!r})")  # defaults

    old_env = {**env, "PYTHONPATH": f"{older}:{env['PYTHONPATH']}",
               "KASPER_INPUT_TOPICS": lines}  # the older CLI does not find them in the app
    done = subprocess.run([sys.executable, "-m", "kasper_py", "run", "dsl_app:app",
                           "--app-dir", app_dir, "--until-caught-up", *flags], env=old_env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)  # not this checkout's folder: -m imports from there
    assert f"kasper_py from {older}/kasper_py/__init__.py" in done.stderr, done.stderr[-3000:]
    assert done.returncode != 0, done.stderr[-6000:]
    assert f"cannot decode {repartition}[0] offset 3: json serde" in done.stderr, (
        done.stderr[-3000:])
    assert kafka.committed(name, repartition) == {0: 3}
    assert len(kafka.read_all(out)) == sent

    kasper_run(app_dir, env, *flags)
    last = {json.loads(m.key()): json.loads(m.value()) for m in kafka.read_all(out)}
    assert last == Counter(["a", "b", "a", "c", "a"])
    (packed,) = kafka.read_all(repartition)[3:]
    assert packed.key() == PACKED_KEY and packed.headers()[0][0] == PACKED
    assert kafka.committed(name, repartition) == {0: 4}
