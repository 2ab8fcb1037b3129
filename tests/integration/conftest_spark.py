"""The Spark standalone cluster of the integration tests (loaded with ``pytest_plugins``).

``spark_master`` is the master URL drivers pass as ``--master``, session-wide: the
cluster named by ``$KASPER_SPARK_MASTER`` when set, else the stack's own when
``kasper stack up spark`` started it, else a master and two workers started here in a
temporary stack directory on free ports, stopped at the end of the session.
``own_spark_cluster`` starts such a private cluster, for tests that kill its processes.
``spark`` is a local[2] session per test module, with the test processors shipped to it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import reprocess_processors as procs

from kasper_py.reprocess import spark_session
from kasper_py.stack import _lifecycle
from kasper_py.stack._catalog import GROUPS, build
from kasper_py.stack._settings import Settings, with_free_spark_ports

SPARK = GROUPS["spark"]


@dataclass(frozen=True)
class SparkCluster:
    """A running cluster: its master URL, and its stack settings when the stack runs it."""

    master: str
    settings: Settings | None
    """None for an external cluster (``$KASPER_SPARK_MASTER``): its processes are not ours."""

    def pids(self) -> dict[str, int | None]:
        """The pid of each of the stack's Spark processes, None when it is not running."""
        assert self.settings is not None, "an external cluster has no pids here"
        return {name: _lifecycle.status_of(build(name, self.settings)).pid for name in SPARK}


def private_settings(stack_dir: Path) -> Settings:
    """Settings of a stack in ``stack_dir`` whose Spark ports are all free now."""
    return with_free_spark_ports(Settings.load(stack_dir))


def start_cluster(settings: Settings) -> SparkCluster:
    """Start the master and both workers of ``settings``'s stack; return once all answer."""
    statuses = _lifecycle.up(SPARK, settings, report=print)
    return SparkCluster(statuses[0].address, settings)


def stop_cluster(settings: Settings) -> None:
    _lifecycle.down(SPARK, settings, purge=False, report=print)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """The cluster of the session (see the module docstring)."""
    external = os.environ.get("KASPER_SPARK_MASTER")
    if external:
        yield SparkCluster(external, None)
        return
    shared = SparkCluster(build(SPARK[0], Settings.load()).address, Settings.load())
    if all(pid is not None for pid in shared.pids().values()):
        yield shared
        return
    with private_cluster(tmp_path_factory.mktemp("spark-stack")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark_master(spark_cluster: SparkCluster) -> str:
    """The master URL of the session's cluster, e.g. ``spark://127.0.0.1:17077``."""
    return spark_cluster.master


@pytest.fixture(scope="module")
def own_spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A cluster of this module's alone, which its tests may kill and stop."""
    with private_cluster(tmp_path_factory.mktemp("own-spark-stack")) as cluster:
        yield cluster


@contextlib.contextmanager
def private_cluster(stack_dir: Path) -> Iterator[SparkCluster]:
    """A master and two workers in ``stack_dir`` on free ports, stopped on exit."""
    settings = private_settings(stack_dir)
    try:
        yield start_cluster(settings)
    finally:
        stop_cluster(settings)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One local[2] session for the module, with the test processors shipped to it."""
    session = spark_session("local[2]", conf={"spark.ui.enabled": "false",
                                              "spark.ui.showConsoleProgress": "false"})
    session.sparkContext.addPyFile(procs.__file__)
    yield session
    session.stop()
