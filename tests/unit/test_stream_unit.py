"""The stream's lag from Spark's progress events, as PySpark 4 hands them over
(``str()`` of a parsed dict) and as Spark's JSON text."""

from __future__ import annotations

import pytest

from kasper_py.stream._metrics import source_lag


@pytest.mark.parametrize("render", [str, lambda d: str(d).replace("'", '"')],
                         ids=["pyspark-str", "json"])
def test_source_lag_is_latest_minus_end_offsets(render) -> None:
    """Messages between the micro-batch's end offsets and the latest offsets, summed
    over partitions; a partition ahead of latest counts 0, not a negative lag."""
    source = {"endOffset": render({"t": {"0": 5, "1": 7, "2": 9}}),
              "latestOffset": render({"t": {"0": 9, "1": 7, "2": 8}})}
    assert source_lag(source) == 4


def test_source_lag_without_offsets_is_zero() -> None:
    """A first progress event has no end offsets yet: no lag, no error."""
    assert source_lag({"endOffset": None, "latestOffset": "{'t': {'0': 3}}"}) == 0
    assert source_lag({"endOffset": "not offsets", "latestOffset": "{}"}) == 0
