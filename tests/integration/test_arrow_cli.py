"""`kasper run` of an ``ArrowMessageProcessor`` (arrow_module.py) against the stack's
Kafka: every event's output exact and every offset committed; a batch that raises
exits 1 with its offsets uncommitted; `kasper reprocess` on a local Spark sends what
`kasper run` sends; events read as bytes go out as JSON through an output topic declared
with the json serde."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import cli_env, kasper, write_config  # isort: skip

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent


def run_args(config: str) -> list[str]:
    return ["run", "arrow_module:Doubler", "--app-dir", str(HERE), "--config", config,
            "--until-caught-up"]


def test_columnar_processor_through_kasper_run(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """JSON events in, one doubled output per event keyed by user, all committed; then
    a negative amount fails the run uncommitted at its batch."""
    source, sink = new_topic("arrow-in"), new_topic("arrow-out")
    kafka.produce(source, [(b"u%d" % (n % 3), json.dumps({"user": f"u{n % 3}", "amount": n})
                            .encode()) for n in range(25)])
    name = unique_name("arrow-cli")
    config = write_config(tmp_path, name, source, batch_size=10, max_latency="none",
                          value_serde="json", key_serde="str")
    env = cli_env(bootstrap, ARROW_OUTPUT_TOPIC=sink)
    result = kasper(*run_args(config), env=env)
    assert result.returncode == 0, result.stderr
    outputs = sorted((m.key().decode(), m.value().decode()) for m in kafka.read_all(sink))
    compact = (",", ":")
    assert outputs == sorted(
        (f"u{n % 3}", json.dumps({"offset": n, "doubled": 2 * n}, separators=compact))
        for n in range(25))
    assert kafka.committed(name, source)[0] == 25

    kafka.produce(source, [(b"u0", json.dumps({"user": "u0", "amount": -1}).encode())])
    failed = kasper(*run_args(config), env=env)
    assert failed.returncode == 1
    assert "raised ValueError: negative amount" in failed.stderr
    assert kafka.committed(name, source)[0] == 25


@pytest.mark.spark
def test_columnar_records_through_kasper_reprocess(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """`kasper reprocess` (a local Spark) of an Arrow processor of JSON bytes, whose
    records stay columnar on Spark, sends what `kasper run` sends for the same events."""
    source, live_out, spark_out = new_topic("arrow-in"), new_topic("live"), new_topic("spark")
    kafka.produce(source, [(b"u%d" % (n % 3), json.dumps({"user": f"u{n % 3}", "amount": n})
                            .encode()) for n in range(20)])
    config = write_config(tmp_path, unique_name("arrow-re"), source, batch_size=10,
                          max_latency="none", value_serde="bytes", key_serde="str")
    target = ["arrow_module:BytesDoubler", "--app-dir", str(HERE), "--config", config]
    live = kasper("run", *target, "--until-caught-up",
                  env=cli_env(bootstrap, ARROW_OUTPUT_TOPIC=live_out))
    assert live.returncode == 0, live.stderr
    spark = kasper("reprocess", *target, env=cli_env(bootstrap, ARROW_OUTPUT_TOPIC=spark_out))
    assert spark.returncode == 0, spark.stderr

    def sent(topic: str) -> list[tuple[bytes, bytes]]:
        return sorted((m.key(), m.value()) for m in kafka.read_all(topic))

    assert sent(spark_out) == sent(live_out)
    assert len(sent(spark_out)) == 20


@pytest.mark.parametrize("declared", ["toml", "flag"])
def test_bytes_in_json_out_through_an_output_topic_of_its_own_serde(  # noqa: PLR0917
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path, declared: str) -> None:
    """Events read as bytes (Arrow parses them) and the output topic declared with
    ``value_serde = "json"`` in kasper.toml, or as ``--output-topics SINK@json``:
    `kasper run` sends send_table's rows as the json serde's bytes and commits every
    offset (on Spark: test_reprocess_columnar.py)."""
    source, sink = new_topic("arrow-in"), new_topic("arrow-json")
    kafka.produce(source, [(b"u%d" % (n % 3), json.dumps({"user": f"u{n % 3}", "amount": n})
                            .encode()) for n in range(20)])
    name = unique_name("arrow-out")
    config = write_config(tmp_path, name, source, batch_size=10, max_latency="none",
                          value_serde="bytes", key_serde="str")
    args = ["arrow_module:Doubler", "--app-dir", str(HERE), "--config", config]
    if declared == "toml":
        with open(config, "a") as toml:
            toml.write(f'[[output_topics]]\nname = "{sink}"\nvalue_serde = "json"\n')
    else:
        args += ["--output-topics", f"{sink}@json"]
    result = kasper("run", *args, "--until-caught-up", env=cli_env(bootstrap,
                                                                   ARROW_OUTPUT_TOPIC=sink))
    assert result.returncode == 0, result.stderr
    compact = (",", ":")
    assert sorted((m.key(), m.value()) for m in kafka.read_all(sink)) == sorted(
        (f"u{n % 3}".encode(), json.dumps({"offset": n, "doubled": 2 * n},
                                          separators=compact).encode()) for n in range(20))
    assert kafka.committed(name, source)[0] == 20
