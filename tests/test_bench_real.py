"""The `real` bench scenario end to end at its tiny size: the detector on an HD long-GOP clip
made from a shared real clip, loaded with the defaults, with an oracle rendition and read
from its file, every
approximate kind beside the exact scan."""
from __future__ import annotations

import pytest

from vidql.bench.scenarios_real import real
from vidql.preprocess.probe import probe_video

pytestmark = [pytest.mark.slow, pytest.mark.shared]


def test_real_scenario_measures_every_kind_beside_the_scan(tiny_real_bench):
    result = real(tiny_real_bench)
    kinds = ["exact scan", "ERROR WITHIN", "ORACLE BUDGET 5%", "LIMIT", "RECALL TARGET", "FIND RARE"]
    clips = list(dict.fromkeys(r["clip"] for r in result.table))
    assert len(clips) == 3 and clips[1].endswith("(oracle_rendition 416)")
    assert clips[2].endswith("(oracle_rendition none)")
    for clip in clips:
        assert [r["kind"] for r in result.table if r["clip"] == clip] == kinds
    [hd] = list(tiny_real_bench.cache_dir.glob("*gop120*.mp4"))
    info = probe_video(hd)
    assert list(info.keyframes) == [0] and info.frame_count == 60  # one 120-frame GOP
    for row in result.table:  # a LIMIT the index's labelled frames answer calls nothing
        assert row["seconds"] > 0
        if row["oracle_calls"]:
            assert row["physical_limit"] > 0 and row["explain_seconds"] > 0
    # a 640x360 copy would not pay: 'auto' reads the file
    assert {row["reads"] for row in result.table if row["clip"] == clips[0]} == {"file"}
    assert {row["reads"] for row in result.table if row["clip"] == clips[1]} == {"oracle rendition"}
    assert all(row["operator"] for row in result.table)  # the planner's choice, scan or sampling
    scan = result.table[0]
    assert scan["oracle_calls"] == scan["explain_calls"]  # the scan's forecast is exact
    assert result.plots and (tiny_real_bench.out_dir / "real.png").exists()
