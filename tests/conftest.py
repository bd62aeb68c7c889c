"""Shared fixtures: generated clips, the ../shared folder, a slow counting oracle module."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test with a clear reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (the ../shared folder beside the checkout is absent)")
    return path


@pytest.fixture()
def tiny_real_bench(tmp_path):
    """A bench context for the scenarios on real video at their tiny size, with ../shared."""
    from vidql.bench.registry import BenchContext

    return BenchContext(out_dir=tmp_path / "out", quick=True, tiny=True,
                        shared_dir=shared_path("models").parent, cache_dir=tmp_path / "cache")


class CountingOracle:
    """A true-value callback over per-frame arrays that records every frame it is asked
    for: one array gives its values, several a tuple (e.g. stat, pred[, group])."""

    def __init__(self, *columns):
        self.columns = columns
        self.asked = []

    def __call__(self, frames):
        self.asked.extend(frames.tolist())
        values = tuple(column[frames] for column in self.columns)
        return values[0] if len(values) == 1 else values


@pytest.fixture(scope="session")
def counter_clip(tmp_path_factory) -> Path:
    """A 120-frame H.264 clip (GOP 12, B-frames) whose frames are all distinct."""
    from vidql.preprocess.testclip import write_counter_video

    path = tmp_path_factory.mktemp("clips") / "counter.mp4"
    write_counter_video(path, 120, 160, 96)
    return path


ORACLE_MODULE = '''
import os, sys, time
import numpy as np

CALLS = []          # frames seen in this process
FAIL_AT_CALL = None  # raise on this call number (tests set it)

class BrightnessOracle:
    """Detects one 'car' per 64 levels of mean brightness; counts calls; optionally slow, or
    blocked on stdin after $VQ_BLOCK_AFTER calls (having said "blocked" on stdout)."""
    version = "1"

    def __init__(self, delay=0.0):
        self.delay = delay

    def detect(self, frames):
        global FAIL_AT_CALL
        CALLS.append(len(frames))
        if FAIL_AT_CALL is not None and len(CALLS) >= FAIL_AT_CALL:
            raise RuntimeError("model crashed")
        if len(CALLS) > int(os.environ.get("VQ_BLOCK_AFTER", len(CALLS))):
            print("blocked", flush=True)  # tells the parent, which kills this process
            sys.stdin.readline()
        time.sleep(self.delay)
        out = []
        for f in frames:
            n = int(f.mean() // 64)
            out.append([("car", 0.9, 1.0 + i, 2.0, 10.0 + i, 12.0) for i in range(n)])
        return out
'''


@pytest.fixture()
def oracle_module(tmp_path, monkeypatch):
    """An importable module `vq_test_oracle` with BrightnessOracle (a PYTHON oracle)."""
    (tmp_path / "vq_test_oracle.py").write_text(textwrap.dedent(ORACLE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("vq_test_oracle", None)
    import vq_test_oracle

    yield vq_test_oracle
    sys.modules.pop("vq_test_oracle", None)


@pytest.fixture()
def clip_db(counter_clip, oracle_module):
    """An in-memory database with `counter_clip` as video `clip` and BrightnessOracle `bright`
    as its oracle."""
    import vidql

    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{counter_clip}' AS clip")
        db.sql("CREATE ORACLE bright FROM PYTHON 'vq_test_oracle:BrightnessOracle'; "
               "SET ORACLE clip = bright")
        yield db


@pytest.fixture(scope="session")
def small_traffic(tmp_path_factory) -> tuple[Path, Path]:
    """(video, labels) of a 300-frame synthetic traffic video (seed 1)."""
    from vidql.datasets import ensure_traffic

    return ensure_traffic(tmp_path_factory.mktemp("traffic"), 300, seed=1)


@pytest.fixture()
def traffic_con(small_traffic):
    """An in-memory database with the small traffic video `v` and its LABELS oracle `truth`
    (nearly free), nothing labelled yet."""
    import vidql

    video, labels = small_traffic
    with vidql.connect(progress=False) as con:
        con.sql(f"LOAD VIDEO '{video}' AS v; CREATE ORACLE truth FROM LABELS '{labels}'; "
                "SET ORACLE v = truth")
        yield con


@pytest.fixture()
def traffic_db(small_traffic, tmp_path) -> Path:
    """A database file with the small traffic video `t` and its LABELS oracle `truth`
    (a simulated 40 ms a frame), nothing labelled yet."""
    import vidql

    video, labels = small_traffic
    path = tmp_path / "traffic.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}' "
               "WITH (cost_ms = 40); SET ORACLE t = truth")
    return path


BLOCKING_CHILD = """
import sys, numpy as np, vidql
sys.path.insert(0, {moddir!r})
db = vidql.connect({db!r}, progress=False)
db.load_video({clip!r}, "clip")
db.create_oracle("bright", "PYTHON", "vq_test_oracle:BrightnessOracle")
db.set_oracle("clip", "bright")
{action}
print("finished")
"""


def kill_when_blocked(oracle_dir, db, clip, action: str, block_after: int) -> None:
    """In a child Python, load `clip` into database `db` with oracle `vq_test_oracle` (from
    `oracle_dir`) and run `action`; its oracle blocks in call `block_after` + 1 (saying
    "blocked"), and the child is SIGKILLed there."""
    import os
    import signal
    import subprocess

    script = BLOCKING_CHILD.format(moddir=str(oracle_dir), db=str(db), clip=str(clip),
                                   action=action)
    child = subprocess.Popen([sys.executable, "-c", script],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, VQ_BLOCK_AFTER=str(block_after)))
    try:
        line = child.stdout.readline()  # returns once the oracle blocks, or "" if the child ended
        if line.strip() != "blocked":
            pytest.fail(f"the child did not block in the oracle: {line!r} {child.communicate()[1]}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
