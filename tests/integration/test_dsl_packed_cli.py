"""Packed repartition records on the real broker, run as users run an app (``kasper
run``): a word count's repartition written plain (as a version before packing wrote it,
and by hand, as a user may), then packed by the upgraded app, which reads both: every
count exact, the topic's records plain then packed, every offset committed; and a packed
word count under exactly-once, killed with SIGKILL and restarted, exact."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import kasper_command  # isort: skip
from test_dsl_examples import app_module, internal_topics, kasper_run, run_env  # isort: skip  # noqa: F401 - a fixture
from test_dsl_exactly_once import kill_randomly, sample_lines  # isort: skip

from kasper_py.dsl.packed import PACKED, PACKED_KEY, unpack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

APP = '''
import sys

import kasper_py
from kasper_py.dsl import Builder

print("kasper_py from", kasper_py.__file__, file=sys.stderr)


def build(lines, out, **options):
    b = Builder("packed", cache=False, **options)
    (b.stream(lines).flat_map(lambda _doc, line: [(w, 1) for w in line.split()])
        .repartition(name="by-word").group_by_key().count("counts").to_stream().to(out))
    return b.build()


def eos(lines, out, name):
    b = Builder(name)
    (b.stream(lines).flat_map_values(str.split).group_by(lambda _k, word: word)
        .count("counts").to_stream().map_values(str).to(out))
    return b.build()
'''
"""A word count through a repartition (``build``: any ``Builder`` options, none for
a version that had none, saying which kasper_py it runs on), and one combined per word
(``eos``), both packed by default."""


def word_count_run(tmp_path: Path, bootstrap: str, new_topic: Callable[..., str],
                   unique_name: Callable[[str], str], prefix: str
                   ) -> tuple[str, str, str, dict[str, str], tuple[str, ...]]:
    """``APP``'s word count made ready for ``kasper run`` in ``tmp_path``: its input and
    output topics, app name, environment (JSON serdes) and flags."""
    lines, out = new_topic(f"{prefix}-lines"), unique_name(f"{prefix}-counts")
    name = unique_name(prefix)
    (tmp_path / "packed_app.py").write_text(APP)
    env = run_env(bootstrap, tmp_path / "state", key_serde="json", value_serde="json")
    return lines, out, name, env, ("--name", name, "--create-topics", "--output-topics", out)


def test_an_app_upgraded_to_packed_records_reads_the_plain_ones_left(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Run 1 writes plain records; a user adds two plain records to the repartition; run
    2, packed, counts them and its own lines: each word's last count is its total, the
    repartition holds run 1's records plain (one a word) then run 2's packed (one a
    turn), and the group committed every record of both topics."""
    lines, out, name, env, flags = word_count_run(tmp_path, bootstrap, new_topic,
                                                  unique_name, "packed")
    repartition = f"{name}-by-word-repartition"
    first = ["a b a", "c a"]
    kafka.produce(lines, [(b'"d1"', json.dumps(line).encode()) for line in first])
    unpacked = f"build({lines!r}, {out!r}, pack_repartitions=False)"
    kasper_run(app_module(tmp_path, "packed_app", unpacked), env, *flags)
    kafka.produce(repartition, [(b'"b"', b"1"), (b'"z"', b"1")])
    second = ["b c", "a z z"]
    kafka.produce(lines, [(b'"d2"', json.dumps(line).encode()) for line in second])
    kasper_run(app_module(tmp_path, "packed_app", f"build({lines!r}, {out!r})"), env,
               *flags)

    last = {json.loads(m.key()): json.loads(m.value()) for m in kafka.read_all(out)}
    assert last == Counter(" ".join([*first, *second, "b z"]).split())
    written = kafka.read_all(repartition)
    plain = [(m.key(), m.value()) for m in written if not m.headers()]
    assert plain == [(b'"a"', b"1"), (b'"b"', b"1"), (b'"a"', b"1"), (b'"c"', b"1"),
                     (b'"a"', b"1"), (b'"b"', b"1"), (b'"z"', b"1")]
    packed = [m for m in written if m.headers()]
    assert [m.headers()[0][0] for m in packed] == [PACKED] * len(packed)
    assert all(m.key() == PACKED_KEY and m.value() is None for m in packed)
    assert [k for m in packed for k, *_ in unpack(m.headers()[0][1])] == [
        b'"b"', b'"c"', b'"a"', b'"z"', b'"z"']
    assert kafka.committed(name, repartition) == {0: len(written)}
    assert kafka.committed(name, lines) == {0: 4}


def test_sigkill_of_a_packed_count_under_exactly_once_loses_and_repeats_nothing(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """2,000 lines (each batch's words combined per word, then packed), exactly-once,
    ``kasper run`` killed twice at random moments after some progress, then run
    to the end: the input committed to its end, the repartition holding packed records
    only, and a read_committed reader sees each word's counts rising, each once, the
    last one exact."""
    partitions, text = 2, sample_lines(2_000, seed=34)
    lines, out = new_topic("packed-eos-lines", partitions=partitions), unique_name("packed-eos")
    name = unique_name("packed-eos")
    repartition = f"{name}-counts-by-key-repartition"
    for partition in range(partitions):
        kafka.produce(lines, [line.encode() for line in text[partition::partitions]],
                      partition=partition)
    (tmp_path / "packed_app.py").write_text(APP)
    app_dir = app_module(tmp_path, "packed_app", f"eos({lines!r}, {out!r}, {name!r})")
    env = run_env(bootstrap, tmp_path / "state", key_serde="str", value_serde="str",
                  processing_guarantee="exactly_once", batch_size="200")
    command = [*kasper_command(), "run", "dsl_app:app", "--app-dir", app_dir,
               "--create-topics", "--output-topics", out]

    def committed() -> tuple[int, int]:
        return (sum(o or 0 for o in kafka.committed(name, lines, partitions).values()),
                sum(o or 0 for o in kafka.committed(name, repartition, partitions).values()))

    at_kill = kill_randomly(command, env, 2, committed)
    done = subprocess.run([*command, "--until-caught-up"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    progress = [sum(pair) for pair in at_kill]
    assert all(later > earlier or earlier == sum(committed())
               for earlier, later in itertools.pairwise(progress)), at_kill
    assert kafka.committed(name, lines, partitions) == {
        p: len(text[p::partitions]) for p in range(partitions)}
    written = kafka.read_all(repartition)
    assert written and all(m.headers()[0][0] == PACKED for m in written)
    expected = Counter(word for line in text for word in line.split())
    assert {k.decode() for m in written for k, *_ in unpack(m.headers()[0][1])
            if k is not None} == set(expected)
    sent: dict[str, list[int]] = {}
    for message in kafka.read_all(out):
        sent.setdefault(message.key().decode(), []).append(int(message.value()))
    assert {word: counts[-1] for word, counts in sent.items()} == dict(expected)
    assert [counts for counts in sent.values() if counts != sorted(set(counts))] == []
