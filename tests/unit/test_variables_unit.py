"""Unknown ``KASPER_*`` variables: found, with the closest known name; the stack's and
the Config tables' variables are known."""

from __future__ import annotations

import pytest

from kasper_py._support.variables import OTHER_VARIABLES, unknown_variables
from kasper_py.cli.base import load_config

KNOWN = ["KASPER_BATCH_SIZE", "KASPER_NAME", "KASPER_QUERY_PARTITIONER", "KASPER_CONSUMER__"]


def test_unknown_variables_with_the_closest_name() -> None:
    """Typos get the closest name (a table variable keeps its key); a name like nothing
    gets none; other programs' variables, known names and ports are left alone."""
    env = {"KASPER_BATCHSIZE": "abc", "KASPER_QUERY_PARTITONER": "crc32",
           "KASPER_CONSUMR__FETCH_MAX_BYTES": "1", "KASPER_ZZZ": "1", "KASPER_NAME": "n",
           "KASPER_CONSUMER__FETCH_MAX_BYTES": "1", "KASPER_KAFKA_PORT": "1",
           "KASPER_STACK_DIR": "/x", "KASPER_STAK_DIR": "/x", "PATH": "/bin"}
    assert unknown_variables(env, KNOWN) == [
        ("KASPER_BATCHSIZE", "KASPER_BATCH_SIZE"),
        ("KASPER_CONSUMR__FETCH_MAX_BYTES", "KASPER_CONSUMER__FETCH_MAX_BYTES"),
        ("KASPER_QUERY_PARTITONER", "KASPER_QUERY_PARTITIONER"),
        ("KASPER_STAK_DIR", "KASPER_STACK_DIR"),
        ("KASPER_ZZZ", None)]
    assert "KASPER_SPARK_MASTER" in OTHER_VARIABLES


def test_load_config_warns_once_per_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """Loading a config from an environment with a typo warns on stderr, once per process
    however many configs load; the value is ignored (the default batch size stays)."""
    env = {"KASPER_NAME": "n", "KASPER_BOOTSTRAP_SERVERS": "h:1", "KASPER_INPUT_TOPICS": "t",
           "KASPER_BATCH_WAITT": "9"}
    first = load_config(None, env)
    load_config(None, env)
    assert capsys.readouterr().err == (
        "kasper: warning: environment variable KASPER_BATCH_WAITT is not a setting kasper "
        "reads (ignored); did you mean KASPER_BATCH_WAIT?\n")
    assert first.batch_wait != 9
