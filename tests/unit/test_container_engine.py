"""The container engine's configuration, the image recipes, and what a machine without
an engine is told (no engine needed here)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from string import Template

import pytest

from kasper_py.stack._engine import current_ulimits, engine_conf
from kasper_py.stack._image_build import debian_sources
from kasper_py.stack._images import (
    IMAGES,
    base_image,
    cassandra_version,
    image_name,
    kafka_version,
    opensearch_version,
    postgres_version,
)
from kasper_py.stack._install import template
from kasper_py.testing.containers import (
    INSTALL_HINT,
    ContainerEngineError,
    docker_client,
)

ROOT = Path(__file__).resolve().parents[2]


def test_engine_conf_sets_runc_cgroupfs_host_network_and_no_higher_rlimits() -> None:
    """The quirks of this machine kind are in the engine's configuration file."""
    conf = engine_conf()
    assert 'runtime = "runc"' in conf
    assert 'cgroup_manager = "cgroupfs"' in conf
    assert 'netns = "host"' in conf
    for ulimit, limit in zip(current_ulimits(), (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC),
                             strict=True):
        assert f'"{ulimit}"' in conf
        soft = resource.getrlimit(limit)[0]
        value = int(ulimit.split("=")[1].split(":")[0])
        assert soft == resource.RLIM_INFINITY or value <= soft


def test_image_sources_have_the_release_its_updates_and_security() -> None:
    """A package pinned to the host's version (a security update) is found in the image."""
    lines = debian_sources("bookworm").splitlines()
    assert [line.split()[2] for line in lines] == [
        "bookworm", "bookworm-updates", "bookworm-security"]
    assert all(line.startswith("deb http") and line.endswith(" main") for line in lines)


def test_image_recipes_fill_every_placeholder() -> None:
    """Each Containerfile names its base and version; nothing is left unfilled."""
    kafka = Template(template("kafka-Containerfile")).substitute(base="B", version="4.0")
    redis = Template(template("redis-Containerfile")).substitute(base="B", version="7", pin="=1")
    assert kafka.splitlines()[2] == "FROM B" and redis.splitlines()[2] == "FROM B"
    assert "redis-server=1" in redis
    for make in IMAGES.values():
        image = make()
        text = image.containerfile_text()
        assert f"FROM {base_image()}" in text and "${" not in text.replace("$${", "")
        assert f'image.version="{image.version}"' in text


def test_an_image_is_tagged_by_its_version_and_content() -> None:
    """``<version>-<12 hex>``; an edited Containerfile value, file or pin is a new tag, and
    the same inputs the same tag (so a built image is found again)."""
    kafka = IMAGES["kafka"]()
    assert image_name("kafka") == kafka.name
    version, digest = kafka.name.rsplit(":", 1)[1].rsplit("-", 1)
    assert version == kafka_version() and len(digest) == 12
    assert int(digest, 16) >= 0 and kafka.name == IMAGES["kafka"]().name
    edited = [replace(kafka, files={**kafka.files, "kafka-image.sh": "#!/bin/sh\n"}),
              replace(kafka, values={"version": "9.9"}),
              replace(kafka, pinned_by=("cassandra-pom.xml",))]
    names = {kafka.name, *(image.name for image in edited)}
    assert len(names) == 4
    assert {name.rsplit("-", 1)[0] for name in names} == {
        f"localhost/kasper-py/kafka:{kafka_version()}"}


def test_images_are_named_after_the_stack_versions() -> None:
    """Cassandra, PostgreSQL and OpenSearch images run the stack's pinned versions."""
    assert image_name("cassandra").startswith(
        f"localhost/kasper-py/cassandra:{cassandra_version()}-")
    assert image_name("opensearch").startswith(
        f"localhost/kasper-py/opensearch:{opensearch_version()}-")
    assert image_name("postgres").startswith(f"localhost/kasper-py/postgres:{postgres_version()}-")
    assert cassandra_version() == "5.0.9" and opensearch_version().startswith("2.19.")


def test_the_images_command_refuses_an_unknown_image_naming_the_known(
        tmp_path: Path) -> None:
    """``stack images nosuch``: exit 1, the error names the images there are."""
    result = subprocess.run([sys.executable, "-m", "kasper_py.stack", "--stack-dir",
                             str(tmp_path), "images", "nosuch"], capture_output=True,
                            text=True, check=False, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: no image for nosuch; images: kafka, redis, schema-registry, cassandra, "
        "postgres, opensearch")


def test_no_engine_is_an_error_naming_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """A DOCKER_HOST nobody serves: the error says where it looked and what to install."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(ContainerEngineError) as error:
        docker_client()
    assert f"{tmp_path}/none.sock" in str(error.value)
    assert INSTALL_HINT in str(error.value)
    assert "python -m kasper_py.stack up podman" in INSTALL_HINT


def test_fixtures_skip_with_the_install_hint_when_no_engine_answers(tmp_path: Path) -> None:
    """A user's test on the Kafka fixture is skipped, not failed, and says why."""
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["kasper_py.testing.container_fixtures"]\n')
    (tmp_path / "test_user.py").write_text(
        "def test_uses_kafka(kafka_bootstrap):\n    assert kafka_bootstrap\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_user.py"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "no container engine answers" in result.stdout
    assert "podman" in result.stdout
