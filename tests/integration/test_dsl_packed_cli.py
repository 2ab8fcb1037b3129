"""Packed repartition records on the real broker, run as users run an app (``kasper run
--until-caught-up``): a word count's repartition written plain (``pack_repartitions=
False``, as a version before packing wrote it, and by hand, as a user may), then packed
by the upgraded app, which reads both: every count exact, the topic's records plain then
packed, every offset committed."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_dsl_examples import app_module, internal_topics, kasper_run, run_env  # isort: skip  # noqa: F401 - a fixture

from kasper_py.dsl.packed import PACKED, unpack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

APP = '''
from kasper_py.dsl import Builder


def build(lines, out, pack):
    b = Builder("packed", cache=False, pack_repartitions=pack)
    (b.stream(lines).flat_map(lambda _doc, line: [(w, 1) for w in line.split()])
        .repartition(name="by-word").group_by_key().count("counts").to_stream().to(out))
    return b.build()
'''


def test_an_app_upgraded_to_packed_records_reads_the_plain_ones_left(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Run 1 writes plain records; a user adds two plain records to the repartition; run
    2, packed, counts them and its own lines: each word's last count is its total, the
    repartition holds run 1's records plain (one a word) then run 2's packed (one a
    turn), and the group committed every record of both topics."""
    lines, out = new_topic("packed-lines"), unique_name("packed-counts")
    name = unique_name("packed")
    repartition = f"{name}-by-word-repartition"
    (tmp_path / "packed_app.py").write_text(APP)
    env = run_env(bootstrap, tmp_path / "state", key_serde="json", value_serde="json")
    flags = ("--name", name, "--create-topics", "--output-topics", out)
    first = ["a b a", "c a"]
    kafka.produce(lines, [(b'"d1"', json.dumps(line).encode()) for line in first])
    kasper_run(app_module(tmp_path, "packed_app", f"build({lines!r}, {out!r}, False)"), env,
               *flags)
    kafka.produce(repartition, [(b'"b"', b"1"), (b'"z"', b"1")])
    second = ["b c", "a z z"]
    kafka.produce(lines, [(b'"d2"', json.dumps(line).encode()) for line in second])
    kasper_run(app_module(tmp_path, "packed_app", f"build({lines!r}, {out!r}, True)"), env,
               *flags)

    last = {json.loads(m.key()): json.loads(m.value()) for m in kafka.read_all(out)}
    assert last == Counter(" ".join([*first, *second, "b z"]).split())
    written = kafka.read_all(repartition)
    plain = [(m.key(), m.value()) for m in written if not m.headers()]
    assert plain == [(b'"a"', b"1"), (b'"b"', b"1"), (b'"a"', b"1"), (b'"c"', b"1"),
                     (b'"a"', b"1"), (b'"b"', b"1"), (b'"z"', b"1")]
    packed = [m for m in written if m.headers()]
    assert [m.headers()[0][0] for m in packed] == [PACKED] * len(packed)
    assert all(m.key() is None and m.value() is None for m in packed)
    assert [k for m in packed for k, *_ in unpack(m.headers()[0][1])] == [
        b'"b"', b'"c"', b'"a"', b'"z"', b'"z"']
    assert kafka.committed(name, repartition) == {0: len(written)}
    assert kafka.committed(name, lines) == {0: 4}
