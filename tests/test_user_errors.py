"""Raw exceptions a user could cause become VidqlErrors that name the allowed range or the
remedy (issue 30, item 8)."""
from __future__ import annotations

import numpy as np
import pytest

import vidql
from vidql.base.ranges import MAX_COUNT


def test_a_tiny_precision_target_is_refused_with_its_range(traffic_con):
    """1e-320 made SUPG's candidate prefix infinite (OverflowError)."""
    with pytest.raises(vidql.QueryError, match=r"PRECISION TARGET 1e-320 is outside \[0\.0001%, 100%\)"):
        traffic_con.sql("SELECT frame FROM v WHERE contains('car') PRECISION TARGET 1e-320 "
                        "ORACLE BUDGET 20")


def test_a_start_time_that_is_no_time_is_a_parameter_error(traffic_con):
    """pandas' DateParseError escaped before."""
    clip = traffic_con.sql("SHOW CLIPS v").df()["clip"].iloc[0]
    with pytest.raises(vidql.ParameterError, match="SET START 'x' is not a time.*TIMESTAMP '2026"):
        traffic_con.sql(f"ALTER VIDEO v SET START '{clip}' = TIMESTAMP 'x'")


def test_set_path_to_an_unreadable_file_is_a_video_error(traffic_con):
    """/proc/self/mem is a file whose read fails with EIO (a raw OSError before)."""
    with pytest.raises(vidql.VideoError, match="cannot read it .*moved video file"):
        traffic_con.sql("ALTER VIDEO v SET PATH '/proc/self/mem'")


@pytest.mark.parametrize("call", ["budget", "error", "limit"])
def test_a_huge_builder_number_is_refused_with_its_range(traffic_con, call):
    """10**400 is beyond any float: OverflowError before."""
    q = traffic_con.video("v")
    run = {"budget": lambda: q.aggregate("avg", "objects('car')", budget=10**400),
           "error": lambda: q.aggregate("avg", "objects('car')", error=10**400),
           "limit": lambda: q.where("objects('car') >= 1").limit(10**400)}[call]
    whole = f"a whole number in \\[0, {MAX_COUNT}\\]"
    expected = {"budget": f"budget must be {whole}", "error": "error must be a finite number",
                "limit": f"n must be {whole}"}[call]
    with pytest.raises(vidql.ParameterError, match=expected + r"; got 1000.*\(401 characters\)"):
        run()


def test_an_oracle_kind_that_is_no_string_is_an_oracle_error(traffic_con, small_traffic):
    """create_oracle('o', None, path) raised AttributeError ('NoneType' has no 'upper')."""
    with pytest.raises(vidql.OracleError, match="kind as a string, got None; kinds: ONNX"):
        traffic_con.create_oracle("o", None, small_traffic[1])


def test_a_uint64_budget_is_refused_as_no_whole_number_in_range(traffic_con):
    """2**64-1 is whole, but beyond every budget: the message gives the range."""
    with pytest.raises(vidql.ParameterError,
                       match=rf"budget must be a whole number in \[0, {MAX_COUNT}\]; got np.uint64"):
        traffic_con.video("v").aggregate("avg", "objects('car')", budget=np.uint64(2**64 - 1))


def test_a_huge_gap_in_sql_is_refused_with_its_range(traffic_con):
    """GAP 10**26 overflowed a C long inside the LIMIT operator."""
    with pytest.raises(vidql.QueryError, match=rf"GAP 1{'0' * 26} is above 1000000000000000: GAP takes a "
                                               rf"whole number in \[0, {MAX_COUNT}\]"):
        traffic_con.sql(f"SELECT frame FROM v WHERE objects('car') >= 1 LIMIT 2 GAP 1{'0' * 26}")
