"""The backend extras of pyproject.toml give version ranges, not pins, so ``pip install
kasper-py[spark]`` installs beside a user's own versions, and each range holds the
version installed here (the one the tests ran with)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"
EXTRAS = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
BACKENDS = ["redis", "cassandra", "rocksdb", "prometheus", "spark", "registry", "otel", "postgres"]


@pytest.mark.parametrize("extra", BACKENDS)
def test_an_extra_gives_ranges_holding_the_tested_version(extra: str) -> None:
    """No ``==`` pin; every requirement's range holds the installed version."""
    for text in EXTRAS[extra]:
        requirement = Requirement(text)
        assert all(spec.operator != "==" for spec in requirement.specifier), text
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            continue  # an extra not installed here has no tested version to hold
        assert requirement.specifier.contains(installed, prereleases=True), (text, installed)
