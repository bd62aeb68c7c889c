"""The executor setting: its values, where it is read from, and the error without ray."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import vidql
from vidql.engine.sql.dialect import SetExecutor, parse
from vidql.engine.catalog.ray_executor import executor_name


def test_set_executor_parses_and_checks_its_value():
    assert parse("SET EXECUTOR = 'ray'") == SetExecutor("ray")
    assert parse("set executor to 'ray://head:10001'") == SetExecutor("ray://head:10001")
    with pytest.raises(vidql.QueryError, match="unknown executor 'spark'"):
        parse("SET EXECUTOR = 'spark'")
    with pytest.raises(vidql.QueryError, match="expected '='"):
        parse("SET EXECUTOR 'ray'")


def test_executor_comes_from_the_argument_else_the_environment(monkeypatch):
    monkeypatch.delenv("VIDQL_EXECUTOR", raising=False)
    assert executor_name(None) == "local"
    monkeypatch.setenv("VIDQL_EXECUTOR", "ray://head:10001")
    assert executor_name(None) == "ray://head:10001"
    assert executor_name("local") == "local"
    monkeypatch.setenv("VIDQL_EXECUTOR", "dask")
    with pytest.raises(vidql.ParameterError, match="'local', 'ray' or 'ray://host:port', got 'dask'"):
        vidql.connect()


def test_ray_without_ray_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.delenv("VIDQL_EXECUTOR", raising=False)
    with pytest.raises(vidql.VidqlError, match=r"pip install 'vidql\[ray\]'"):
        vidql.connect(executor="ray")
    with vidql.connect(progress=False) as db:
        assert db.executor == "local"
        with pytest.raises(vidql.VidqlError, match=r"pip install 'vidql\[ray\]'"):
            db.sql("SET EXECUTOR = 'ray'")
        assert db.executor == "local"
        db.sql("SET EXECUTOR = 'local'")


def test_embedding_chunks_cover_the_video_on_the_batch_grid_after_keyframes():
    from vidql.engine.catalog.ray_executor import chunk_ranges

    keyframes = np.arange(0, 10_000, 250) + 3  # GOPs of 250 frames, starting at 3
    ranges = chunk_ranges(10_000, 64, 8, keyframes)
    starts = np.array([a for a, _ in ranges])
    assert ranges[0][0] == 0 and ranges[-1][1] == 10_000 and len(ranges) == 8
    assert all(b == c for (_, b), (c, _) in zip(ranges[:-1], ranges[1:], strict=True))  # contiguous
    assert (starts % 64 == 0).all()
    after = starts[1:] - keyframes[np.searchsorted(keyframes, starts[1:], side="right") - 1]
    assert ((after >= 0) & (after < 64)).all()  # each decodes less than a batch before its start
    assert chunk_ranges(100, 256, 8, keyframes) == [(0, 100)]
