"""The lag the streaming driver reads from Spark's progress events (``source_lag``),
in the shapes PySpark 3 and PySpark 4 hand them over."""

from __future__ import annotations

import json

import pytest

from kasper_py.stream._metrics import source_lag

SOURCE = {"description": "KafkaV2[Subscribe[t]]", "numInputRows": 7,
          "startOffset": {"t": {"0": 1, "1": 2}}, "endOffset": {"t": {"0": 5, "1": 6}},
          "latestOffset": {"t": {"0": 9, "1": 6}},
          "inputRowsPerSecond": 1.0, "processedRowsPerSecond": 1.0}


def test_lag_from_pyspark_4s_source_progress() -> None:
    """PySpark 4's SourceProgress holds its offsets as str() of a dict (single quotes):
    the lag is still latest - end per partition (4 + 0), not a JSON error."""
    listener = pytest.importorskip("pyspark.sql.streaming.listener")
    progress = listener.SourceProgress.fromJson(SOURCE)
    assert source_lag(progress) == 4


def test_lag_from_json_text_and_dicts() -> None:
    """PySpark 3's progress: offsets as dicts, or as JSON text; no offsets means no lag."""
    as_text = {**SOURCE, "endOffset": json.dumps(SOURCE["endOffset"]),
               "latestOffset": json.dumps(SOURCE["latestOffset"])}
    assert source_lag(SOURCE) == 4
    assert source_lag(as_text) == 4
    assert source_lag({"endOffset": None, "latestOffset": None}) == 0


def test_a_partition_past_latest_counts_no_lag() -> None:
    """latest read before the batch ended can be below its end: 0, never negative."""
    assert source_lag({"endOffset": "{'t': {'0': 9}}", "latestOffset": "{'t': {'0': 8}}"}) == 0
    assert source_lag({"endOffset": "not offsets", "latestOffset": "{}"}) == 0
