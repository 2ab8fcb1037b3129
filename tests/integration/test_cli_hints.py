"""What a newcomer meets at the shell: a typo'd ``KASPER_*`` variable is warned about
with the closest name, ``kasper app describe`` runs without Kafka, enumerated flags list
their choices and refuse others, and each subcommand offers only the flags it uses."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import cli_env, kasper  # isort: skip

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
WARNING = ("kasper: warning: environment variable KASPER_BATCHSIZE is not a setting kasper "
           "reads (ignored); did you mean KASPER_BATCH_SIZE?\n")


def test_a_typoed_variable_is_warned_about_with_the_closest_name(
        bootstrap: str, new_topic: Callable[..., str]) -> None:
    """``KASPER_BATCHSIZE=abc`` beside a real command: one warning line naming
    ``KASPER_BATCH_SIZE``, the command still runs; the stack's own variables
    (``KASPER_KAFKA_PORT``, ``KASPER_STACK_DIR``) and table variables
    (``KASPER_CONSUMER__...``) are not warned about."""
    topic = new_topic("hints-in", partitions=1)
    env = cli_env(bootstrap, KASPER_BATCHSIZE="abc", KASPER_KAFKA_PORT="19092",
                  KASPER_STACK_DIR="/tmp/nowhere", KASPER_CONSUMER__FETCH_MAX_BYTES="1048576",
                  KASPER_NAME="hints", KASPER_INPUT_TOPICS=topic)
    result = kasper("offsets", "show", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == WARNING
    assert topic in result.stdout


def test_app_describe_needs_no_kafka() -> None:
    """No ``bootstrap_servers`` anywhere: ``kasper app describe`` still prints the
    topology (it never connects); a typo'd variable is warned about there too."""
    env = cli_env("unused", KASPER_BATCHSIZE="abc")
    del env["KASPER_BOOTSTRAP_SERVERS"]
    result = kasper("app", "describe", "dsl_app_module:app", "--app-dir", str(HERE), env=env)
    assert (result.returncode, result.stderr) == (0, WARNING)
    assert result.stdout.splitlines()[:2] == ["app dsl-describe (Config.name dsl-describe)",
                                              "  sources: describe-lines"]
    refused = kasper("app", "describe", "dsl_app_module:app", "--app-dir", str(HERE),
                     "--bootstrap-servers", "h:1", env=env)
    assert refused.returncode == 2
    assert refused.stderr.endswith("error: unrecognized arguments: --bootstrap-servers h:1\n")


def test_enumerated_flags_list_their_choices(bootstrap: str) -> None:
    """``kasper run -h`` lists the choices of ``--processing-guarantee`` and
    ``--assignment``; another value is a usage error (exit 2) naming them."""
    env = cli_env(bootstrap)
    help_text = kasper("run", "-h", env=env).stdout
    assert "--processing-guarantee {at_least_once,exactly_once}" in help_text
    assert "--assignment {static,group}" in help_text
    bad = kasper("run", "m:f", "--assignment", "dynamic", env=env)
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1] == (
        "kasper run: error: argument --assignment: invalid choice: 'dynamic' (choose from "
        "'static', 'group')")


@pytest.mark.parametrize(("command", "absent"), [
    (["offsets", "reset"], ["--processing-guarantee", "--batch-size", "--metrics-port",
                            "--query-port", "--assignment", "--output-topics"]),
    (["offsets", "show"], ["--processing-guarantee", "--max-latency", "--metrics-host"]),
    (["lag"], ["--batch-size", "--query-host"]),
    (["dlq", "replay"], ["--processing-guarantee", "--metrics-port"]),
    (["app", "describe"], ["--bootstrap-servers", "--connect-timeout", "--batch-size",
                           "--input-partitions", "--stores"]),
])
def test_subcommands_list_only_their_flags(bootstrap: str, command: list[str],
                                           absent: list[str]) -> None:
    """A subcommand's help offers what it uses (the group, its broker) and none of the
    loop's tuning flags."""
    help_text = kasper(*command, "-h", env=cli_env(bootstrap)).stdout
    assert "--name" in help_text and "--config" in help_text
    for flag in absent:
        assert flag not in help_text, (command, flag)


def test_kasper_run_without_stores_names_the_flag(
        bootstrap: str, kafka: Any, new_topic: Callable[..., str],
        unique_name: Callable[[str], str]) -> None:
    """A processor reading a store ``kasper run`` was not given: exit 1,
    the error naming the store, that none is declared, and ``--stores``."""
    topic = new_topic("hints-stores", partitions=1)
    kafka.produce(topic, [(b"k", b"v")])
    env = cli_env(bootstrap, KASPER_NAME=unique_name("hints-stores"),
                  KASPER_INPUT_TOPICS=topic, KASPER_KEY_SERDE="str")
    result = kasper("run", "queries_module:Count", "--app-dir", str(HERE),
                    "--until-caught-up", "--batch-wait", "0.2", env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    assert ("no store 'counts' (declared: none): declare it where the processor runs: "
            "`kasper run ... --stores MODULE:ATTR` (a sequence of StoreSpecs, e.g. "
            "[RocksDBTable('counts')]), TopicProcessor(..., stores=[...]), or an App "
            "processor's stores=") in result.stderr.splitlines()[-1]
