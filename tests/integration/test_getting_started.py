"""Getting-started's first loop, run as a newcomer pastes it: the page's shell block,
unchanged, in bash against the stack's broker (create topics, run the word count,
produce, consume its counts, query its table, stop, reset, delete)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import cli_env, kasper_command  # isort: skip

from docsite.blocks import ROOT, blocks

pytestmark = pytest.mark.integration

TOPICS = ("streams-plaintext-input", "streams-wordcount-output")


def first_loop() -> str:
    """The page's shell block that starts by creating topics."""
    page = ROOT / "docs" / "getting-started.md"
    return next(block.code for block in blocks(page)
                if block.lang == "sh" and "kasper topics create" in block.code)


def leftovers(env: dict[str, str], cwd: Path) -> None:
    """What an interrupted earlier run may have left: the app's topics, group, state."""
    subprocess.run([*kasper_command(), "app", "reset", "streams_word_count:app",
                    "--app-dir", "examples", "--execute"], cwd=cwd, env=env,
                   capture_output=True, timeout=90, check=False)
    subprocess.run([*kasper_command(), "topics", "delete", *TOPICS, "--yes", "--if-exists"],
                   cwd=cwd, env=env, capture_output=True, timeout=90, check=True)


def test_the_first_loop_runs_as_written(bootstrap: str, tmp_path: Path) -> None:
    """Every command of the loop succeeds; the consumer prints the word counts the
    processor sent, the table answers 2 for "kafka", and the topics are gone after."""
    if bootstrap != "127.0.0.1:19092":
        pytest.skip("the page's loop names the local stack's broker")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = cli_env(bootstrap)
    env["PATH"] = f"{Path(kasper_command()[0]).parent}{os.pathsep}{env['PATH']}"
    leftovers(env, tmp_path)
    done = subprocess.run(["bash", "-e", "-c", first_loop()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["streams-plaintext-input: created, 2 partitions",
                         "streams-wordcount-output: created, 2 partitions",
                         "2 records written to streams-plaintext-input"]
    counts = [line.split("\t") for line in lines[3:9]]
    assert all(len(pair) == 2 and pair[1].isdigit() for pair in counts), lines
    assert {word for word, _ in counts} <= {"all", "streams", "lead", "to", "kafka", "hello"}
    assert lines[9] == "2"  # the table's count of "kafka"
    assert lines[-2:] == ["streams-plaintext-input: deleted", "streams-wordcount-output: deleted"]
    assert "delete group streams-wordcount" in done.stdout
