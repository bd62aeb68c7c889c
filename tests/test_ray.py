"""The Ray executor gives the same answers as the local one: exact queries, CREATE INDEX,
every approximate kind, and a query during which an oracle actor is killed."""
from __future__ import annotations

import shutil
import textwrap

import numpy as np
import pandas as pd
import pytest

import vidql

ray = pytest.importorskip("ray", reason="the Ray executor tests need ray: pip install 'vidql[ray]'")

ORACLE = '''
import time

class Bright:
    """One 'car' per 48 levels of mean brightness; `delay` seconds a batch; `fail`: raises."""
    version = "1"

    def __init__(self, delay=0.0, fail=False):
        self.delay, self.fail = delay, fail

    def detect(self, frames):
        if self.fail:
            raise RuntimeError("model crashed")
        time.sleep(self.delay)
        return [[("car", 0.9, 1.0 + i, 2.0, 10.0 + i, 12.0) for i in range(int(f.mean() // 48))]
                for f in frames]
'''


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    """One small local Ray cluster for the module (starting one takes seconds)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def oracle_dir(tmp_path_factory):
    """A folder with module `vq_ray_oracle` (a PYTHON oracle that needs pixels), put on the
    driver's sys.path; the actors find it from the oracle's source path."""
    folder = tmp_path_factory.mktemp("oracle")
    (folder / "vq_ray_oracle.py").write_text(textwrap.dedent(ORACLE))
    return folder


@pytest.fixture()
def python_path(oracle_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(oracle_dir))
    return oracle_dir


def _setup(db, video, labels, delay: float = 0.0):
    db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
           f"CREATE ORACLE bright FROM PYTHON 'vq_ray_oracle:Bright' WITH (batch_size = 8, "
           f"delay = {delay}); SET ORACLE t = truth")


def _labelled_once(db) -> tuple[int, int]:
    return db.con.execute("SELECT count(*), count(DISTINCT (oracle, frame)) "
                          "FROM vidql.labelled").fetchall()[0]


def _answers(executor, video, labels, queries):
    with vidql.connect(progress=False) as db:
        db.sql(f"SET EXECUTOR = '{executor}'")
        _setup(db, video, labels)
        out = [db.sql(q).df() for q in queries]
        assert _labelled_once(db)[0] == _labelled_once(db)[1]
        return out, {o: db.labels("t", o).oracle.describe() for o in ("truth", "bright")}


def test_exact_queries_match_local(small_traffic, python_path):
    video, labels = small_traffic
    queries = ["SELECT count(*), sum(objects('car')), sum(frame * objects('bus')) FROM t",
               "SELECT frame, objects('car') AS n FROM t ORDER BY frame USING ORACLE bright"]
    local, _ = _answers("local", video, labels, queries)
    remote, described = _answers("ray", video, labels, queries)
    assert described["bright"].endswith("on 2 actors")
    for a, b in zip(local, remote, strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert local[1]["n"].nunique() > 1  # the pixels reached the actors' oracle


def _copy_db(src, dst):
    shutil.copy(src, dst)
    shutil.copytree(f"{src}.artifacts", f"{dst}.artifacts")
    return dst


@pytest.mark.slow  # two builds, the Ray one starting task workers: ~30 s on a loaded machine
def test_create_index_matches_local(small_traffic, python_path, tmp_path):
    video, labels = small_traffic
    built = {}
    for executor in ("local", "ray"):
        with vidql.connect(tmp_path / f"{executor}.db", progress=False, executor=executor) as db:
            _setup(db, video, labels)
            db.sql("CREATE INDEX i ON t USING TASTI WITH (embedder = 'pixel', reps = 60, seed = 4)")
            index = db.indexes.get("i")
            built[executor] = (np.array(index.embeddings), index.rep_frames.copy(),
                               db.proxy("t", "objects('car')"))
            assert not (tmp_path / f"{executor}.db.artifacts" / "indexes" / "i" / "chunks").exists()
    (emb_a, reps_a, proxy_a), (emb_b, reps_b, proxy_b) = built["local"], built["ray"]
    np.testing.assert_allclose(emb_a, emb_b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(reps_a, reps_b)
    np.testing.assert_allclose(proxy_a, proxy_b, rtol=1e-6)


APPROXIMATE = [
    "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 CONFIDENCE 90% SEED 1",
    "SELECT AVG(objects('car')) FROM t WHERE contains('bus') ORACLE BUDGET 60 SEED 2",
    "SELECT frame FROM t WHERE objects('car') >= 9 LIMIT 3 SEED 7",
    "SELECT frame FROM t WHERE contains('bus') RECALL TARGET 80% ORACLE BUDGET 60 SEED 3",
    "SELECT frame FROM t WHERE contains('bus') PRECISION TARGET 80% ORACLE BUDGET 60 SEED 4",
    "SELECT frame FROM t WHERE contains('bus') FIND RARE ORACLE BUDGET 40 SEED 5",
    "SELECT AVG(objects('car')) FROM t USING ORACLE bright ERROR WITHIN 0.5 SEED 6",
]


def test_every_approximate_kind_matches_local(small_traffic, python_path, tmp_path):
    """One database with an index, copied: the same queries under each executor."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "base.db", progress=False) as db:
        _setup(db, video, labels)
        db.sql("CREATE INDEX i ON t USING TASTI WITH (embedder = 'pixel', reps = 60, seed = 1)")
        db.create_index("j", "t", oracle="bright", embedder="pixel", reps=40, seed=1)
    answers, calls = {}, {}
    for executor in ("local", "ray"):
        with vidql.connect(_copy_db(tmp_path / "base.db", tmp_path / f"{executor}.db"),
                           progress=False, executor=executor) as db:
            answers[executor] = [db.sql(q).df() for q in APPROXIMATE]
            calls[executor] = db.last_report.oracle_calls
            assert _labelled_once(db)[0] == _labelled_once(db)[1]
    assert calls["ray"] == calls["local"] > 0
    for q, a, b in zip(APPROXIMATE, answers["local"], answers["ray"], strict=True):
        pd.testing.assert_frame_equal(a, b, obj=q)


def test_killed_actor_batch_is_retried_and_nothing_labelled_twice(small_traffic, python_path):
    video, labels = small_traffic
    query = "SELECT frame, objects('car') AS n FROM t ORDER BY frame USING ORACLE bright"
    local, _ = _answers("local", video, labels, [query])
    with vidql.connect(progress=False, executor="ray") as db:
        _setup(db, video, labels, delay=0.02)
        oracle = db.labels("t", "bright").oracle
        stream = oracle.detect_stream

        def killing(frames, batch_size):
            for done, item in enumerate(stream(frames, batch_size)):
                if done == 3:
                    ray.kill(oracle.actors[0])  # it has batches queued
                yield item

        oracle.detect_stream = killing
        answer = db.sql(query).df()
        assert oracle.retried >= 1
        assert _labelled_once(db) == (300, 300)
        rows = db.catalog.con.execute("SELECT count(*) FROM vidql.labels WHERE oracle = ?",
                                      [oracle.identity]).fetchall()[0][0]
        assert rows == local[0]["n"].sum()  # no detection stored twice
    pd.testing.assert_frame_equal(answer, local[0])


def test_oracle_failure_on_an_actor_is_an_oracle_error(small_traffic, python_path):
    video, _ = small_traffic
    with vidql.connect(progress=False, executor="ray") as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE bad FROM PYTHON 'vq_ray_oracle:Bright' "
               "WITH (fail = true); SET ORACLE t = bad")
        with pytest.raises(vidql.OracleError, match="failed on a Ray actor"):
            db.sql("SELECT sum(objects('car')) FROM t")


CHILD = """
import os, signal, sys
import vidql
sys.path.insert(0, {moddir!r})
with vidql.connect({db!r}, progress=False, executor="ray") as db:  # joins $RAY_ADDRESS
    db.sql("LOAD VIDEO '{video}' AS t; CREATE ORACLE bright FROM PYTHON 'vq_ray_oracle:Bright' "
           "WITH (batch_size = 8, delay = 0.02); SET ORACLE t = bright")
    oracle = db.labels("t").oracle
    stream, sizes = oracle.detect_stream, []

    def dying(frames, batch_size):
        for ids, det, seconds in stream(frames, batch_size):
            if len(sizes) == 4:  # the label cache committed the four batches before this one
                print(sum(sizes), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            sizes.append(len(ids))
            yield ids, det, seconds

    oracle.detect_stream = dying
    db.sql("SELECT sum(objects('car')) FROM t")
print("finished")
"""


def test_sigkill_of_the_driver_keeps_committed_batches(small_traffic, python_path, tmp_path):
    """A driver on the cluster killed mid-scan: its committed batches are in the database,
    and a reopened database labels only the rest, with the local answer."""
    import os
    import subprocess
    import sys

    video, labels = small_traffic
    db_path = tmp_path / "kill.db"
    script = CHILD.format(moddir=str(python_path), db=str(db_path), video=str(video))
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                           text=True, env=env, timeout=240)
    assert child.returncode == -9 and child.stdout.strip().isdigit(), child.stderr[-2000:]
    committed = int(child.stdout.strip())
    with vidql.connect(db_path, progress=False) as db:
        assert _labelled_once(db) == (committed, committed)
        cache = db.labels("t")
        answer = db.sql("SELECT sum(objects('car')) AS n FROM t").df()
        assert cache.stats.oracle_calls == 300 - committed  # only the rest was labelled
        assert _labelled_once(db) == (300, 300)
    local, _ = _answers("local", video, labels, ["SELECT sum(objects('car')) AS n FROM t USING ORACLE bright"])
    pd.testing.assert_frame_equal(answer, local[0])


def test_batches_stay_within_a_clip_and_start_at_gops(small_traffic, python_path):
    video, labels = small_traffic
    with vidql.connect(progress=False, executor="ray") as db:
        _setup(db, video, labels)
        oracle = db.labels("t", "bright").oracle
        keyframes = np.asarray(db.catalog.video_info("t").keyframes)
        frames = np.sort(np.random.default_rng(0).choice(300, 150, replace=False))
        batches = oracle.batches(frames, 8)
        assert not oracle.actors  # planning a batch starts nothing
    positions = [np.asarray(pieces[0][2]) for pieces in batches]
    assert all(len(pieces) == 1 for pieces in batches)  # one clip each
    np.testing.assert_array_equal(np.concatenate(positions), frames)
    assert max(map(len, positions)) == 8 and min(map(len, positions[:-1])) < 8  # cut at GOPs
    gop = [np.unique(np.searchsorted(keyframes, p, side="right")) for p in positions]
    for p, g in zip(positions, gop, strict=True):  # a batch crosses a GOP only when under half full
        assert len(g) == 1 or len(p[np.searchsorted(keyframes, p, side="right") == g[0]]) < 4


def test_environment_variable_selects_ray(small_traffic, python_path, monkeypatch):
    video, labels = small_traffic
    monkeypatch.setenv("VIDQL_EXECUTOR", "ray")
    with vidql.connect(progress=False) as db:
        assert db.executor == "ray"
        _setup(db, video, labels)
        assert db.sql("SELECT sum(objects('car')) AS n FROM t WHERE frame < 40").df()["n"][0] > 0
        assert db.labels("t").oracle.describe().endswith("on 2 actors")


def test_a_collection_is_labelled_clip_by_clip_on_ray(tmp_path, python_path):
    """Actors label the clips of a collection (LABELS keyed by clip, and an oracle that
    decodes pixels) with the answers the local executor gives."""
    from vidql.datasets import ensure_traffic, read_labels, write_labels

    folder = tmp_path / "cams"
    folder.mkdir()
    tables = []
    for k, seed in enumerate((1, 2)):
        video, labels = ensure_traffic(tmp_path / "cache", 150, seed=seed, width=160, height=90)
        shutil.copy(video, folder / f"cam{k}.mp4")
        tables.append(read_labels(labels).assign(clip=f"cam{k}"))
    write_labels(pd.concat(tables, ignore_index=True), tmp_path / "cams.labels.parquet")
    sql = ("SELECT clip, sum(objects('car')) AS cars FROM cams GROUP BY clip ORDER BY clip")
    answers = {}
    for executor in ("local", "ray"):
        with vidql.connect(progress=False, executor=executor) as db:
            db.sql(f"LOAD VIDEO '{folder}' AS cams; CREATE ORACLE truth FROM LABELS "
                   f"'{tmp_path / 'cams.labels.parquet'}'; CREATE ORACLE bright FROM PYTHON "
                   f"'vq_ray_oracle:Bright'; SET ORACLE cams = truth")
            truth = db.sql(sql).df()
            bright = db.sql(sql + " USING ORACLE bright").df()
            answers[executor] = (truth, bright)
    pd.testing.assert_frame_equal(answers["local"][0], answers["ray"][0])
    pd.testing.assert_frame_equal(answers["local"][1], answers["ray"][1])
    assert answers["ray"][0]["cars"].nunique() == 2
