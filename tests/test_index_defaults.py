"""CREATE INDEX fits its defaults to the video, checks every option before any work and
says how many frames it newly labelled."""
from __future__ import annotations

import pytest

import vidql
from vidql.datasets import ensure_traffic
from vidql.indexes.tasti import check_options, default_sizes

N_FRAMES = 600


@pytest.mark.parametrize("n_frames, reps", [(10, 2), (252, 50), (600, 50), (10_000, 200),
                                            (100_000, 2000), (10_000_000, 2000)])
def test_default_sizes_follow_the_frame_count(n_frames, reps):
    sizes = default_sizes(n_frames)
    assert sizes["reps"] == reps and sizes["train"] == reps // 2
    assert sizes["reps"] <= max(1, n_frames // 5)  # a short clip is never fully labelled
    assert 2000 <= sizes["triplets"] <= 12_000


@pytest.mark.parametrize("n_frames, options, dim", [
    (1000, {}, 25), (10_000, {}, 100), (100_000, {}, 128), (1000, {"reps": 3}, 2),
    (1000, {"dim": 64}, 64), (1000, {"embedder": "triplet"}, 128)])
def test_efficientnet_keeps_one_component_per_two_labelled_frames_by_default(n_frames, options,
                                                                             dim):
    assert check_options(n_frames, **{"embedder": "efficientnet", **options})["dim"] == dim


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    video, labels = ensure_traffic(tmp_path_factory.mktemp("cache"), N_FRAMES, seed=1)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS v; CREATE ORACLE t FROM LABELS '{labels}'; "
               "SET ORACLE v = t;")
        yield db


def labelled(db) -> int:
    return db.con.execute("SELECT count(*) FROM vidql.labelled").fetchone()[0]


@pytest.mark.parametrize("option, shown", [
    ("train = 'abc'", "train must be a whole number in [0, 600], got 'abc'"),
    ("train = 2.5", "train must be a whole number in [0, 600], got 2.5"),
    ("train = 601", "train must lie in [0, 600], got 601"),
    ("reps = 0", "reps must lie in [1, 600], got 0"),
    ("reps = 100000", "reps must lie in [1, 600], got 100000"),
    ("k = 0", "k must lie in [1, 64], got 0"),
    ("seed = -1", "seed must lie in [0, 2147483647], got -1"),
    ("dim = 0", "dim must lie in [2, 1024], got 0"),
    ("triplets = -1", "triplets must lie in [1, 1000000], got -1"),
    ("size = 100000", "size (the proxy frames' short side in pixels) must lie in [8, 180], "
                      "got 100000"),
    ("size = -3", "must lie in [8, 180], got -3"),
    ("size = true", "size (the proxy frames' short side in pixels) must be a whole number"),
    ("embedder = 'resnet'", "embedder must be one of efficientnet, triplet, pretrained, pixel, got 'resnet'"),
    ("nosuch = 1", "unknown index option(s) nosuch"),
])
def test_bad_options_raise_before_any_work(db, option, shown):
    before = labelled(db)
    with pytest.raises(vidql.ParameterError) as err:
        db.sql(f"CREATE INDEX bad ON v WITH ({option})")
    assert shown in str(err.value)
    assert labelled(db) == before and "bad" not in db.indexes.names()


def test_defaults_label_a_fraction_and_the_result_counts_new_labels(db):
    db.sql("SELECT count(*) FROM v WHERE frame < 100 AND objects('car') >= 0").fetchall()
    assert labelled(db) == 100
    message = db.sql("CREATE INDEX vi ON v").fetchall()[0][0]
    index = db.indexes.get("vi")
    reps = set(index.rep_frames.tolist())
    assert len(reps) == 50 < N_FRAMES  # default_sizes(600): 50 labelled frames, not all
    new = len(reps - set(range(100)))
    assert index.stats["newly_labelled"] == new < 50
    assert f"{new} frames newly labelled" in message and "of its 50 labels" in message
    assert labelled(db) == 100 + new
