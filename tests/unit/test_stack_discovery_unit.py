"""Where the stack is found from any folder, and the Prometheus target files `kasper run`
writes for the stack's Prometheus, without starting anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kasper_py import stack
from kasper_py.stack._components import Kafka
from kasper_py.stack._settings import Settings, record_file, resolve_stack_dir


@pytest.fixture
def user_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh per-user state folder, no $KASPER_STACK_DIR, the cwd a folder with no stack."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("KASPER_STACK_DIR", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return tmp_path / "state"


def test_nothing_found_is_the_cwd_stack(user_state: Path, tmp_path: Path) -> None:
    """With no project stack above the cwd and none recorded: ./.kasper-stack, as before."""
    assert resolve_stack_dir() == tmp_path / "elsewhere" / ".kasper-stack"


def test_a_project_stack_above_the_cwd_is_found(user_state: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """From a subfolder of a project, the project's .kasper-stack."""
    (tmp_path / "project" / ".kasper-stack").mkdir(parents=True)
    (tmp_path / "project" / "src" / "pkg").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project" / "src" / "pkg")
    assert resolve_stack_dir() == tmp_path / "project" / ".kasper-stack"


def test_the_recorded_stack_is_found_from_another_folder(user_state: Path,
                                                         tmp_path: Path) -> None:
    """A stack `up` recorded is found from a folder outside the project, while its folder
    exists; a recorded folder since deleted is ignored."""
    recorded = tmp_path / "project" / ".kasper-stack"
    recorded.mkdir(parents=True)
    record_file().parent.mkdir(parents=True)
    record_file().write_text(f"{recorded}\n")
    assert record_file() == user_state / "kasper-py" / "stack-dir"
    assert resolve_stack_dir() == recorded
    recorded.rmdir()
    assert resolve_stack_dir() == tmp_path / "elsewhere" / ".kasper-stack"


def test_the_environment_and_the_argument_win(user_state: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """$KASPER_STACK_DIR beats a project stack in the cwd; an explicit folder beats both.
    Only a found stack is one `up` records."""
    (tmp_path / "elsewhere" / ".kasper-stack").mkdir()
    assert Settings.load().found
    monkeypatch.setenv("KASPER_STACK_DIR", str(tmp_path / "from-env"))
    assert Settings.load().stack_dir == tmp_path / "from-env"
    assert not Settings.load().found
    assert Settings.load(tmp_path / "given").stack_dir == tmp_path / "given"


def test_up_records_a_found_stack_and_not_a_given_one(user_state: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` of an unknown component fails before recording; `up` with --stack-dir does not
    record (a test's or a one-off stack must not capture the user's)."""
    assert stack.main(["--stack-dir", str(tmp_path / "given"), "up", "nope"]) == 1
    assert not record_file().exists()
    assert stack.main(["up", "nope"]) == 1
    assert not record_file().exists()


def test_status_from_another_folder_reads_the_recorded_stack(user_state: Path,
                                                             tmp_path: Path) -> None:
    """`kasper stack status` run from an unrelated folder shows the recorded stack's
    component as running (a live process's pid file) with its address."""
    recorded = tmp_path / "project" / ".kasper-stack"
    (recorded / "redis").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        start = Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (recorded / "redis" / "redis.pid").write_text(f"{sleeper.pid}\n{start}\n")
        record_file().parent.mkdir(parents=True)
        record_file().write_text(f"{recorded}\n")
        result = subprocess.run([sys.executable, "-m", "kasper_py", "stack", "status"],
                                capture_output=True, text=True,
                                check=False, env={**os.environ, "KASPER_REDIS_PORT": "36379"})
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == 0, result.stderr
    redis = next(line for line in result.stdout.splitlines() if line.startswith("redis "))
    assert redis.split() == ["redis", "running", "pid", str(sleeper.pid), "127.0.0.1:36379"]


def test_a_processor_is_a_target_while_it_runs(user_state: Path, tmp_path: Path) -> None:
    """With the stack's Prometheus folder present, a target file naming the metrics
    address (a wildcard host scraped through the loopback) exists inside the block and
    is gone after it; a dead process's file is removed on the next registration."""
    stack_dir = tmp_path / "stack"
    (stack_dir / "prometheus" / "targets").mkdir(parents=True)
    stale = stack_dir / "prometheus" / "targets" / "4999999-old.json"
    stale.write_text("[]")
    with stack.prometheus_target("orders/v2", ("0.0.0.0", 9401), stack_dir) as target:
        assert target == stack_dir / "prometheus" / "targets" / f"{os.getpid()}-orders_v2.json"
        assert json.loads(target.read_text()) == [{"targets": ["127.0.0.1:9401"]}]
        assert not stale.exists()
    assert not target.exists()


def test_no_stack_prometheus_no_target(user_state: Path, tmp_path: Path) -> None:
    """On a machine whose stack has no Prometheus folder nothing is written; without a
    metrics server there is nothing to register."""
    with stack.prometheus_target("orders", ("127.0.0.1", 9401), tmp_path / "stack") as target:
        assert target is None
    assert not (tmp_path / "stack").exists()
    (tmp_path / "stack" / "prometheus").mkdir(parents=True)
    with stack.prometheus_target("orders", None, tmp_path / "stack") as target:
        assert target is None


def test_set_prometheus_targets_writes_the_hand_set_file(tmp_path: Path) -> None:
    """The hand-set targets go to targets.json, read beside the processors' files."""
    stack.set_prometheus_targets(["127.0.0.1:9500"], tmp_path)
    written = json.loads((tmp_path / "prometheus" / "targets.json").read_text())
    assert written == [{"targets": ["127.0.0.1:9500"]}]
    assert [p.name for p in (tmp_path / "prometheus").iterdir()] == ["targets.json"]


def test_jars_live_in_the_user_cache_one_folder_per_recipe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jars are cached outside the stack (a fresh clone reuses them), under
    $KASPER_STACK_CACHE else $XDG_CACHE_HOME/kasper-py/stack; a changed pom gets a
    folder of its own instead of replacing the one a running server reads."""
    monkeypatch.delenv("KASPER_STACK_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    settings = Settings.load(tmp_path / "clone-1" / ".kasper-stack")
    kafka_jars = Kafka(settings).lib_dir
    assert kafka_jars.parent == tmp_path / "xdg" / "kasper-py" / "stack" / "lib"
    assert kafka_jars.name.startswith("kafka-")
    assert Kafka(Settings.load(tmp_path / "clone-2" / ".kasper-stack")).lib_dir == kafka_jars
    assert settings.lib_dir("kafka", "another pom") != kafka_jars
    monkeypatch.setenv("KASPER_STACK_CACHE", str(tmp_path / "cache"))
    assert Kafka(Settings.load(tmp_path)).lib_dir.parent == tmp_path / "cache" / "lib"


def test_an_unwritable_targets_folder_leaves_the_processor_unscraped(tmp_path: Path) -> None:
    """When the targets folder cannot be made (a file stands in its place), the processor
    runs on, unregistered, rather than failing at start."""
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "prometheus" / "targets").write_text("not a folder")
    with stack.prometheus_target("orders", ("127.0.0.1", 9401), tmp_path) as target:
        assert target is None
    assert (tmp_path / "prometheus" / "targets").read_text() == "not a folder"
