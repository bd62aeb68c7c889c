"""The `rendition` bench scenario at its tiny size: agreement, disk and random reads of the
oracle rendition of an HD long-GOP clip made from a shared real clip."""
from __future__ import annotations

import pytest

from vidql.bench.scenarios_rendition import rendition
from vidql.preprocess.rendition import ORACLE_GOP

pytestmark = [pytest.mark.slow, pytest.mark.shared]


def test_rendition_scenario_compares_rendition_and_original(tiny_real_bench):
    result = rendition(tiny_real_bench)
    [row] = result.table
    assert row["rendition"] == "416x234" and row["frames_compared"] == 8
    assert 0 <= row["equal_counts"] <= 1 and row["disk_ratio"] > 0
    assert row["decoded_per_read_rendition"] <= ORACLE_GOP < row["decoded_per_read_original"]
    assert row["random_read_ms_rendition"] > 0 and "lowest agreement" in result.notes[-1]
