"""Statement options are checked against their allowed range and type before any work, with
a ParameterError naming the value and the range (issue 9, items 12 and 13)."""
from __future__ import annotations

import pytest

import vidql
from conftest import shared_path
from vidql.base.errors import ParameterError


@pytest.fixture()
def db(tmp_path):
    with vidql.connect(tmp_path / "o.db", progress=False) as con:
        yield con


@pytest.fixture()
def labels(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("frame,label,score,x1,y1,x2,y2\n0,car,0.9,1,1,5,5\n")
    return path


@pytest.mark.parametrize("option, value, allowed", [
    ("cost_ms", "'abc'", ">= 0"), ("cost_ms", "-1", ">= 0"), ("cost_ms", "true", ">= 0"),
    ("batch_size", "0", "[1, 4096]"), ("batch_size", "2.5", "whole number"),
    ("batch_size", "'x'", "[1, 4096]"),
])
def test_labels_oracle_options(db, labels, option, value, allowed):
    with pytest.raises(ParameterError) as err:
        db.sql(f"CREATE ORACLE o FROM LABELS '{labels}' WITH ({option} = {value});")
    for word in (option, allowed, value.strip("'").title() if value == "true" else value.strip("'")):
        assert word in str(err.value)
    assert "o" not in db.sql("SHOW ORACLES;").df()["name"].tolist()


def test_labels_oracle_options_in_range_are_kept(db, labels):
    db.sql(f"CREATE ORACLE o FROM LABELS '{labels}' WITH (cost_ms = 0, batch_size = 4096);")
    assert db.catalog.oracle("o").simulated_cost_ms == 0


@pytest.mark.parametrize("options, words", [
    ("score = 2", ["score", "2", "[0, 1]"]), ("score = -1", ["score", "-1", "[0, 1]"]),
    ("nms = 5", ["nms", "5", "[0, 1]"]), ("score = 'high'", ["score", "high", "[0, 1]"]),
    ("batch_size = 0", ["batch_size", "0", "[1, 4096]"]),
])
def test_onnx_oracle_options(db, options, words):
    model = shared_path("models", "yolox_nano.onnx")
    with pytest.raises(ParameterError) as err:
        db.sql(f"CREATE ORACLE y FROM ONNX '{model}' WITH ({options});")
    for word in words:
        assert word in str(err.value)


def test_python_oracle_batch_size(db, oracle_module):
    with pytest.raises(ParameterError, match=r"batch_size.*'abc'"):
        db.sql("CREATE ORACLE p FROM PYTHON 'vq_test_oracle:BrightnessOracle' "
               "WITH (batch_size = 'abc');")


@pytest.mark.parametrize("value", ["'abc'", "8", "4000", "-3", "12.5", "true"])
def test_load_video_rendition(db, counter_clip, value):
    with pytest.raises(ParameterError, match=r"rendition.*\[16, 2160\]"):
        db.sql(f"LOAD VIDEO '{counter_clip}' AS v WITH (rendition = {value});")
    assert db.sql("SHOW VIDEOS;").df().empty
