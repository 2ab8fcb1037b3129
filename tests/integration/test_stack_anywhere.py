"""`kasper stack` from any folder: a stack started in a project is found from elsewhere
(the project's folder, then the one `up` recorded for the user), through the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kasper_py._support.ports import free_ports
from kasper_py.stack._settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).parents[2]


def kasper_stack(*args: str, cwd: Path,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m kasper_py stack ARGS`` run in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "kasper_py", "stack", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, check=False, timeout=120)


def line_of(component: str, output: str) -> list[str]:
    """The words of ``component``'s line in a ``status`` output."""
    return next(line.split() for line in output.splitlines()
                if line.split()[0] == component)


@pytest.fixture
def own_user(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a user with no stack yet: a fresh per-user state folder, no
    $KASPER_STACK_DIR, Redis on a free port; the Redis started in it stopped at the end."""
    env = {k: v for k, v in os.environ.items() if k != "KASPER_STACK_DIR"}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), KASPER_REDIS_PORT=str(free_ports()))
    (tmp_path / "project").mkdir()
    (tmp_path / "elsewhere").mkdir()
    yield env
    kasper_stack("--stack-dir", str(tmp_path / "project" / ".kasper-stack"), "down", "redis",
                 cwd=tmp_path, env=env)


def test_a_project_stack_is_found_from_another_folder(own_user: dict[str, str],
                                                      tmp_path: Path) -> None:
    """`up redis` in a project, then `status` and `down` from an unrelated folder act on
    that very Redis: the pid and address `up` printed are the ones `status` shows."""
    port = own_user["KASPER_REDIS_PORT"]
    started = kasper_stack("up", "redis", cwd=tmp_path / "project", env=own_user)
    assert started.returncode == 0, started.stderr
    match = re.fullmatch(rf"redis: started at 127\.0\.0\.1:{port} \(pid (\d+)\) in .*\n",
                         started.stdout)
    assert match, started.stdout
    assert (tmp_path / "state" / "kasper-py" / "stack-dir").read_text() == (
        f"{tmp_path / 'project' / '.kasper-stack'}\n")

    status = kasper_stack("status", cwd=tmp_path / "elsewhere", env=own_user)
    assert status.returncode == 0, status.stderr
    assert line_of("redis", status.stdout) == [
        "redis", "running", "pid", match[1], f"127.0.0.1:{port}"]

    stopped = kasper_stack("down", "redis", cwd=tmp_path / "elsewhere", env=own_user)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"redis: stopped (pid {match[1]}) in ")
    after = kasper_stack("status", cwd=tmp_path / "elsewhere", env=own_user)
    assert line_of("redis", after.stdout) == ["redis", "stopped", f"127.0.0.1:{port}"]


def test_an_unknown_component_is_refused_from_anywhere(own_user: dict[str, str],
                                                       tmp_path: Path) -> None:
    """A misspelt component exits 1 naming the known ones, and records nothing."""
    result = kasper_stack("up", "kafak", cwd=tmp_path / "elsewhere", env=own_user)
    assert result.returncode == 1
    assert result.stderr == (
        "error: unknown stack component 'kafak' (known: spark, kafka, schema-registry, "
        "redis, cassandra, prometheus, spark-master, spark-worker-1, spark-worker-2, "
        "jaeger, opensearch, postgres, podman, all)\n")
    assert not (tmp_path / "state" / "kasper-py" / "stack-dir").exists()


def test_status_from_another_folder_shows_the_running_kafka(tmp_path: Path) -> None:
    """Read-only, against the running stack (`make test` started it, so recorded it):
    `status` from a folder outside the project prints what it prints in the project,
    Kafka running on the stack's port."""
    in_project = kasper_stack("status", cwd=ROOT)
    elsewhere = kasper_stack("status", cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout == in_project.stdout
    kafka = line_of("kafka", elsewhere.stdout)
    assert kafka[:3] == ["kafka", "running", "pid"]
    assert kafka[4] == f"127.0.0.1:{Settings.load().kafka_port}"
