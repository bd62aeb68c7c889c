"""Collections: one video table over many clips (LOAD VIDEO glob / list / INTO, SHOW CLIPS,
ALTER VIDEO SET START), labels keyed by clip, exact and approximate queries across clips."""
from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

import vidql
from vidql.datasets import ensure_traffic, read_labels, write_labels

SEEDS = (1, 2, 3)
FRAMES = 240


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Three synthetic traffic clips in one folder, and a labels file for all of them with
    a `clip` column (the clip names LOAD VIDEO gives: the file names without suffix)."""
    folder = tmp_path_factory.mktemp("cams")
    cache = tmp_path_factory.mktemp("cache")
    tables = []
    for k, seed in enumerate(SEEDS):
        video, labels = ensure_traffic(cache, FRAMES, seed=seed, width=160, height=90)
        shutil.copy(video, folder / f"cam{k}.mp4")
        tables.append(read_labels(labels).assign(clip=f"cam{k}"))
    truth = pd.concat(tables, ignore_index=True)
    write_labels(truth, folder.parent / "cams.labels.parquet")
    return folder, folder.parent / "cams.labels.parquet", truth


def _car_counts(truth: pd.DataFrame, clip: str) -> np.ndarray:
    rows = truth[(truth["clip"] == clip) & (truth["label"] == "car")]
    return np.bincount(rows["frame"].to_numpy(), minlength=FRAMES)


@pytest.fixture()
def cams(clips):
    folder, labels, _ = clips
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}/*.mp4' AS cams; CREATE ORACLE truth FROM LABELS "
               f"'{labels}'; SET ORACLE cams = truth")
        yield db


def test_glob_loads_one_table_over_every_clip(cams):
    videos = cams.sql("SHOW VIDEOS").df()
    assert videos[["name", "clips", "frame_count"]].values.tolist() == [["cams", 3, 3 * FRAMES]]
    shown = cams.sql("SHOW CLIPS cams").df()
    assert shown["clip"].tolist() == ["cam0", "cam1", "cam2"]
    assert shown["first_frame"].tolist() == [0, FRAMES, 2 * FRAMES]
    table = cams.sql("SELECT clip, min(frame) AS lo, max(frame) AS hi, count(*) AS n "
                     "FROM cams GROUP BY clip ORDER BY clip").df()
    assert table[["lo", "hi", "n"]].values.tolist() == [[0, FRAMES - 1, FRAMES]] * 3
    assert list(cams.sql("SELECT * FROM cams LIMIT 1").df().columns) == [
        "clip", "frame", "ts", "start_ts"]


def test_exact_query_and_objects_are_per_clip(cams, clips):
    _, _, truth = clips
    got = cams.sql("SELECT clip, sum(objects('car')) AS cars FROM cams GROUP BY clip "
                   "ORDER BY clip").df()
    want = [int(_car_counts(truth, c).sum()) for c in ("cam0", "cam1", "cam2")]
    assert got["cars"].astype(int).tolist() == want
    assert len(set(want)) > 1  # the clips differ, so a mix-up would show
    objects = cams.sql("SELECT clip, count(*) AS n FROM cams.objects WHERE label = 'car' "
                       "GROUP BY clip ORDER BY clip").df()
    assert objects["n"].tolist() == want
    # one frame of one clip, addressed by (clip, frame)
    one = cams.sql("SELECT objects('car') AS c FROM cams WHERE clip = 'cam1' AND frame = 7").df()
    assert int(one["c"].iloc[0]) == int(_car_counts(truth, "cam1")[7])


def test_a_frame_bound_labels_those_frames_of_every_clip(cams, clips):
    """An exact query's `frame` bound holds in each clip: EXPLAIN estimates the frames the
    query then labels (it estimated global positions, one clip's worth)."""
    _, _, truth = clips
    sql = "SELECT sum(objects('car')) AS cars FROM cams WHERE frame < 10"
    assert cams.sql("EXPLAIN " + sql).df()["estimated_oracle_calls"][0] == 30
    got = cams.sql(sql).df()["cars"][0]
    assert cams.last_report.oracle_calls == 30
    assert got == sum(int(_car_counts(truth, c)[:10].sum()) for c in ("cam0", "cam1", "cam2"))


def test_a_clip_restriction_labels_that_clip_alone(cams, clips):
    """An exact query's WHERE without frame functions (`clip = ...`, an alias, any SQL over
    the video table's columns) bounds the frames it labels, and EXPLAIN counts the same."""
    _, _, truth = clips
    sql = ("SELECT sum(objects('car')) AS cars FROM cams AS c "
           "WHERE c.clip = 'cam1' AND (frame < 5 OR frame % 10 = 0)")
    kept = [f for f in range(FRAMES) if f < 5 or f % 10 == 0]
    assert cams.sql("EXPLAIN " + sql).df()["estimated_oracle_calls"][0] == len(kept)
    assert cams.sql(sql).df()["cars"][0] == int(_car_counts(truth, "cam1")[kept].sum())
    assert cams.last_report.oracle_calls == len(kept)
    # on the detections, a part naming their columns leaves the others to bound the frames
    got = cams.sql("SELECT count(*) AS n FROM cams.objects WHERE label = 'car' AND frame < 10 "
                   "AND clip = 'cam2'").df()["n"][0]
    assert got == int(_car_counts(truth, "cam2")[:10].sum())
    assert cams.last_report.oracle_calls == 10


def test_labels_without_clip_column_refuse_a_collection(clips, tmp_path):
    folder, _, truth = clips
    flat = tmp_path / "flat.labels.parquet"
    write_labels(truth.drop(columns="clip"), flat)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}/*.mp4' AS cams; CREATE ORACLE flat FROM LABELS '{flat}'")
        with pytest.raises(vidql.OracleError, match="no 'clip' column"):
            db.sql("SELECT sum(objects('car')) FROM cams USING ORACLE flat")


def test_approximate_aggregate_over_all_clips_and_a_restriction(cams, clips):
    _, _, truth = clips
    two = np.concatenate([_car_counts(truth, c) for c in ("cam0", "cam2")])
    r = cams.sql("SELECT AVG(objects('car')) FROM cams WHERE clip IN ('cam0', 'cam2') "
                 "ERROR WITHIN 0.5 SEED 3").df()
    assert r["ci_low"].iloc[0] <= two.mean() <= r["ci_high"].iloc[0]
    labelled = cams.sql("SELECT DISTINCT clip FROM vidql.labelled").df()["clip"]
    assert set(labelled) == {"cam0", "cam2"}  # nothing outside the restriction
    every = np.concatenate([_car_counts(truth, c) for c in ("cam0", "cam1", "cam2")])
    r = cams.sql("SELECT AVG(objects('car')) FROM cams ERROR WITHIN 0.5 SEED 3").df()
    assert r["ci_low"].iloc[0] <= every.mean() <= r["ci_high"].iloc[0]
    assert r["oracle_calls"].iloc[0] < len(every)


def test_selections_carry_the_clip_and_gap_applies_within_a_clip(cams, clips):
    _, _, truth = clips
    r = cams.sql("SELECT clip, frame, ts FROM cams WHERE objects('car') >= 1 LIMIT 12 GAP 100 "
                 "SEED 1").df()
    assert list(r.columns[:3]) == ["clip", "frame", "ts"]
    for clip, frames in r.groupby("clip")["frame"]:
        assert (_car_counts(truth, clip)[frames.to_numpy()] >= 1).all()
        assert (np.diff(np.sort(frames.to_numpy())) >= 100).all()
    assert r["clip"].nunique() == 3


def test_selection_rows_carry_each_frames_own_ts_under_a_restriction(cams):
    # the answer's ts comes from the statement that finds the restricted population
    r = cams.sql("SELECT clip, frame, ts FROM cams WHERE objects('car') >= 1 AND clip <> 'cam1' "
                 "AND ts >= 2 LIMIT 8 GAP 20 SEED 3").df()
    table = cams.sql("SELECT clip, frame, ts FROM cams").df()
    got = r.merge(table, on=["clip", "frame"], suffixes=("", "_table"))
    assert len(r) == 8 and len(got) == len(r)
    assert (got["ts"] == got["ts_table"]).all() and (got["ts"] >= 2).all()
    assert set(r["clip"]) <= {"cam0", "cam2"}

def test_limit_gap_coordinates_keep_clips_apart():
    from vidql.engine.labels.clips import ClipMap
    from vidql.queries import limit_query

    clip_map = ClipMap(("a", "b"), np.array([0, 5]), np.array([5, 5]))
    positions = np.arange(10)
    coords = clip_map.gap_coordinates(positions, 3)
    truth = np.zeros(10, dtype=bool)
    truth[[4, 5]] = True  # last frame of a, first of b: 1 apart globally, not in a clip
    proxy = truth.astype(float)
    r = limit_query(proxy, lambda f: truth[f], k=2, gap=3, coordinates=coords)
    assert sorted(r.frames.tolist()) == [4, 5]
    r = limit_query(proxy, lambda f: truth[f], k=2, gap=3)  # one clip: they suppress each other
    assert len(r.frames) == 1


def test_append_into_keeps_labels_and_adds_the_clip(clips, tmp_path):
    folder, labels, truth = clips
    path = tmp_path / "cams.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO ('{folder}/cam0.mp4', '{folder}/cam1.mp4') AS cams; "
               f"CREATE ORACLE truth FROM LABELS '{labels}'; SET ORACLE cams = truth")
        db.sql("SELECT sum(objects('car')) FROM cams")
        assert db.last_report.oracle_calls == 2 * FRAMES
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}/cam2.mp4' INTO cams")
        assert db.sql("SHOW CLIPS cams").df()["clip"].tolist() == ["cam0", "cam1", "cam2"]
        got = db.sql("SELECT clip, sum(objects('car')) AS cars FROM cams GROUP BY clip "
                     "ORDER BY clip").df()
        assert db.last_report.oracle_calls == FRAMES  # only the new clip
        assert got["cars"].astype(int).tolist() == [
            int(_car_counts(truth, c).sum()) for c in ("cam0", "cam1", "cam2")]
        with pytest.raises(vidql.VidqlError, match="already"):
            db.sql(f"LOAD VIDEO '{folder}/cam2.mp4' AS cams")


def test_a_bad_file_in_a_glob_fails_the_load_and_changes_nothing(clips, tmp_path):
    folder, _, _ = clips
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    (mixed / "broken.mp4").write_bytes((mixed / "cam0.mp4").read_bytes()[:3000])
    (mixed / "notes.mp4").write_text("not a video")
    with vidql.connect(progress=False) as db:
        with pytest.raises(vidql.VideoError) as err:
            db.sql(f"LOAD VIDEO '{mixed}/*.mp4' AS cams")
        assert "broken.mp4" in str(err.value) and "notes.mp4" in str(err.value)
        assert db.sql("SHOW VIDEOS").df().empty
        assert db.sql("SELECT count(*) FROM information_schema.tables WHERE table_name = "
                      "'cams'").fetchall()[0][0] == 0
        r = db.sql(f"LOAD VIDEO '{mixed}' AS cams WITH (skip_bad = true)").df()
        assert r["clips"].iloc[0] == 3
        assert "broken.mp4" in r["skipped"].iloc[0] and "notes.mp4" in r["skipped"].iloc[0]


def test_clip_start_times_give_wall_clock_restrictions_and_groups(cams):
    assert cams.sql("SELECT count(*) FROM cams WHERE start_ts IS NOT NULL").fetchall()[0][0] == 0
    cams.sql("ALTER VIDEO cams SET START 'cam1' = TIMESTAMP '2026-11-02 08:00:00'")
    shown = cams.sql("SHOW CLIPS cams").df().set_index("clip")["start_ts"]
    assert str(shown["cam1"]) == "2026-11-02 08:00:00" and pd.isna(shown["cam0"])
    n = cams.sql("SELECT count(*) FROM cams WHERE hour(start_ts + to_seconds(ts)) = 8"
                 ).fetchall()[0][0]
    assert n == FRAMES
    with pytest.raises(vidql.CatalogError, match="no clip 'cam9'"):
        cams.sql("ALTER VIDEO cams SET START 'cam9' = TIMESTAMP '2026-11-02 08:00:00'")


def test_one_index_over_the_collection(cams, clips):
    _, _, truth = clips
    cams.sql("CREATE INDEX cams_idx ON cams USING TASTI WITH (embedder = 'pixel', reps = 60, "
             "seed = 0)")
    every = np.concatenate([_car_counts(truth, c) for c in ("cam0", "cam1", "cam2")])
    proxy = cams.proxy("cams", "objects('car')")
    assert len(proxy) == len(every)
    assert np.corrcoef(proxy, every)[0, 1] > 0.5
    r = cams.sql("SELECT AVG(objects('car')) FROM cams ERROR WITHIN 0.5 SEED 4").df()
    assert r["ci_low"].iloc[0] <= every.mean() <= r["ci_high"].iloc[0]
    r = cams.sql("SELECT clip, frame FROM cams WHERE objects('car') >= 2 "
                 "RECALL TARGET 80% ORACLE BUDGET 200 SEED 1").df()
    assert set(r["clip"]) <= {"cam0", "cam1", "cam2"}


def test_catalog_from_before_collections_is_upgraded_and_keeps_its_labels(clips, tmp_path):
    """A catalog written before collections (table `frame, ts`, labels keyed by frame, no
    clip table) opens as a collection of one clip, with its labels."""
    folder, labels, _ = clips
    path = tmp_path / "old.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}/cam1.mp4' AS v; CREATE ORACLE truth FROM LABELS "
               f"'{labels}'; SET ORACLE v = truth")
        cars = db.sql("SELECT sum(objects('car')) FROM v").fetchall()[0][0]
        con = db.catalog.con
        for sql in ["DELETE FROM vidql.clips",
                    "CREATE TABLE main.old AS SELECT frame, ts FROM main.v",
                    "DROP TABLE main.v", "ALTER TABLE main.old RENAME TO v",
                    "CREATE TABLE vidql.l2 AS SELECT video, oracle, frame, label, score, x1, y1, "
                    "x2, y2 FROM vidql.labels", "DROP TABLE vidql.labels",
                    "ALTER TABLE vidql.l2 RENAME TO labels",
                    "CREATE TABLE vidql.d2 (video VARCHAR, oracle VARCHAR, frame BIGINT, "
                    "detections INTEGER, PRIMARY KEY (video, oracle, frame))",
                    "INSERT INTO vidql.d2 SELECT video, oracle, frame, detections FROM "
                    "vidql.labelled", "DROP TABLE vidql.labelled",
                    "ALTER TABLE vidql.d2 RENAME TO labelled",
                    "CREATE OR REPLACE VIEW v.objects AS SELECT frame, label FROM vidql.labels"]:
            con.execute(sql)
    with vidql.connect(path, progress=False) as db:
        assert db.sql("SHOW CLIPS v").df()["clip"].tolist() == ["cam1"]
        assert db.sql("SELECT sum(objects('car')) FROM v").fetchall()[0][0] == cars
        assert db.last_report.oracle_calls == 0
        assert list(db.sql("SELECT * FROM v LIMIT 1").df().columns) == [
            "clip", "frame", "ts", "start_ts"]
        assert db.sql("SELECT count(*) FROM v.objects WHERE clip = 'cam1' AND label = 'car'"
                      ).fetchall()[0][0] == cars


@pytest.mark.slow
def test_real_clips_as_one_collection_with_one_index(tmp_path):
    """Three of ../shared/data's real clips (two MP4, one AVI; three sizes) loaded as one
    table, a LABELS oracle from their label files with a clip column, one
    TASTI index over all of them, and an AVG across clips within its error bound."""
    from tests.conftest import shared_path

    data = shared_path("data")
    names = ["highway", "indoor_people", "ua_detrac"]
    files = ", ".join(f"'{data / f}'" for f in ("highway.avi", "indoor_people.mp4", "ua_detrac.mp4"))
    truth = pd.concat([read_labels(data / f"{n}.labels.csv").assign(clip=n) for n in names],
                      ignore_index=True)
    write_labels(truth, tmp_path / "all.labels.parquet")
    with vidql.connect(tmp_path / "real.db", progress=False) as db:
        db.sql(f"LOAD VIDEO ({files}) AS cams; CREATE ORACLE truth FROM LABELS "
               f"'{tmp_path / 'all.labels.parquet'}'; SET ORACLE cams = truth")
        clips = db.sql("SHOW CLIPS cams").df()
        assert clips["clip"].tolist() == names
        exact = db.sql("SELECT avg(objects('car')) FROM cams").fetchall()[0][0]
        n = int(clips["frame_count"].sum())
        per_clip = db.sql("SELECT clip, avg(objects('car')) AS a FROM cams GROUP BY clip "
                          "ORDER BY clip").df()["a"].tolist()
        assert per_clip[0] > 2 and per_clip[1] == 0 and per_clip[2] > 8  # the clips differ
    with vidql.connect(tmp_path / "fresh.db", progress=False) as db:
        db.sql(f"LOAD VIDEO ({files}) AS cams; CREATE ORACLE truth FROM LABELS "
               f"'{tmp_path / 'all.labels.parquet'}'; SET ORACLE cams = truth")
        db.sql("CREATE INDEX cams_idx ON cams USING TASTI WITH (seed = 0)")
        r = db.sql("SELECT AVG(objects('car')) FROM cams ERROR WITHIN 0.3 SEED 2").df()
        assert abs(r["estimate"].iloc[0] - exact) <= 0.3
        assert r["ci_low"].iloc[0] <= exact <= r["ci_high"].iloc[0]
        assert db.last_report.index == "cams_idx" and r["oracle_calls"].iloc[0] < n


def test_labels_of_another_clip_name_are_an_error_not_zeros(clips, tmp_path):
    folder, labels, _ = clips
    other = tmp_path / "renamed.mp4"
    shutil.copy(folder / "cam0.mp4", other)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{other}' AS v; CREATE ORACLE truth FROM LABELS '{labels}'")
        with pytest.raises(vidql.OracleError, match="names none of the video's clips"):
            db.sql("SELECT sum(objects('car')) FROM v")


def test_a_clip_missing_from_the_label_file_is_an_error_naming_it(clips, tmp_path):
    """A clip the file has no row for was not labelled: exact and approximate queries
    refuse it, naming the clip, instead of counting it as zero detections."""
    folder, _, truth = clips
    labels = tmp_path / "no_cam1.labels.parquet"
    write_labels(truth[truth["clip"] != "cam1"], labels)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}' AS cams; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE cams = truth")
        for sql in ("SELECT clip, sum(objects('car')) AS cars FROM cams GROUP BY clip",
                    "SELECT AVG(objects('car')) FROM cams ERROR WITHIN 0.5 SEED 1"):
            with pytest.raises(vidql.OracleError, match="no rows for clip.s. cam1 .*empty label"):
                db.sql(sql)


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_a_clip_labelled_with_nothing_found_counts_zero(clips, tmp_path, suffix):
    """A clip of an empty street is named by a row with an empty label: its frames have no
    detections."""
    folder, _, truth = clips
    labels = tmp_path / f"empty_cam1.labels.{suffix}"
    write_labels(truth[truth["clip"] != "cam1"], labels, clips=["cam0", "cam1", "cam2"])
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}' AS cams; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE cams = truth")
        got = db.sql("SELECT clip, sum(objects('car')) AS cars, count(*) AS n FROM cams "
                     "GROUP BY clip ORDER BY clip").df()
        assert got["cars"].astype(int).tolist() == [
            int(_car_counts(truth, "cam0").sum()), 0, int(_car_counts(truth, "cam2").sum())]
        assert got["n"].tolist() == [FRAMES] * 3
        assert db.sql("SELECT count(*) FROM cams.objects WHERE clip = 'cam1'").fetchall() == [(0,)]


def test_frames_without_rows_in_a_single_clip_file_count_zero(clips, tmp_path):
    """A file without a clip column labels its one clip: frames with no row have no
    detections (that is how a frame without detections is written)."""
    folder, _, truth = clips
    rows = truth[(truth["clip"] == "cam0") & (truth["frame"] >= 100)].drop(columns="clip")
    labels = tmp_path / "cam0_late.labels.csv"
    write_labels(rows, labels)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder / 'cam0.mp4'}' AS v; CREATE ORACLE truth FROM LABELS "
               f"'{labels}'; SET ORACLE v = truth")
        got = db.sql("SELECT frame >= 100 AS late, sum(objects('car')) AS cars FROM v "
                     "GROUP BY late ORDER BY late").df()
        assert got["cars"].astype(int).tolist() == [
            0, int(_car_counts(truth, "cam0")[100:].sum())]


def test_python_api_loads_a_glob_and_restricts_to_clips(clips):
    folder, labels, truth = clips
    with vidql.connect(progress=False) as db:
        row = db.load_video(f"{folder}/*.mp4", "cams")
        assert row["frame_count"] == 3 * FRAMES and row["skipped"] == []
        db.create_oracle("truth", "LABELS", str(labels))
        db.set_oracle("cams", "truth")
        q = db.video("cams").where(vidql.clip_in("cam1")).using(seed=2)
        r = q.aggregate("avg", vidql.objects("car"), error=0.5).df()
        mean = _car_counts(truth, "cam1").mean()
        assert r["ci_low"].iloc[0] <= mean <= r["ci_high"].iloc[0]
        with pytest.raises(vidql.ParameterError, match="name the video"):
            db.load_video(f"{folder}/*.mp4")


def test_cli_loads_a_glob(clips, tmp_path, capsys):
    from vidql.cli import main

    folder, _, _ = clips
    db = str(tmp_path / "c.db")
    assert main(["load", f"{folder}/*.mp4", "--name", "cams", "--db", db]) == 0
    assert "cams: 3 clips, 720 frames" in capsys.readouterr().out
    assert main(["load", f"{folder}/cam0.mp4", "--name", "cams", "--into", "--db", db]) == 0
    out = capsys.readouterr().out  # loaded already: no second copy
    assert "3 clips" in out and "already loaded as clip 'cam0'" in out


def test_group_by_clip_error_within_holds_for_every_clip(cams, clips):
    _, _, truth = clips
    r = cams.sql("SELECT clip, AVG(objects('car')) FROM cams GROUP BY clip ERROR WITHIN 0.5 "
                 "CONFIDENCE 95% SEED 5").df()
    assert r["clip"].tolist() == ["cam0", "cam1", "cam2"]
    for clip, low, high in zip(r["clip"], r["ci_low"], r["ci_high"], strict=True):
        assert low <= _car_counts(truth, clip).mean() <= high
    assert "3 groups" in cams.last_report.guarantee
    cams.sql("ALTER VIDEO cams SET START 'cam0' = TIMESTAMP '2026-11-02 08:00:00'; "
             "ALTER VIDEO cams SET START 'cam1' = TIMESTAMP '2026-11-02 09:00:00'; "
             "ALTER VIDEO cams SET START 'cam2' = TIMESTAMP '2026-11-02 09:30:00'")
    r = cams.sql("SELECT hour(start_ts + to_seconds(ts)) AS h, AVG(objects('car')) FROM cams "
                 "GROUP BY h ORACLE BUDGET 300 SEED 5").df()
    assert r["h"].tolist() == [8, 9]
    nine = np.concatenate([_car_counts(truth, "cam1"), _car_counts(truth, "cam2")]).mean()
    assert r["ci_low"].iloc[1] <= nine <= r["ci_high"].iloc[1]
    assert r["oracle_calls"].sum() <= 300
    api = cams.video("cams").group_by("clip").using(seed=5).aggregate(
        "avg", vidql.objects("car"), error=0.5).df()
    assert api["clip"].tolist() == ["cam0", "cam1", "cam2"]


@pytest.mark.slow
def test_group_by_clip_intervals_cover_every_clip_at_once_in_200_trials(clips):
    """The operator the planner runs for `GROUP BY clip ... ERROR WITHIN`, on the synthetic
    collection's clips and its index's proxy: all three 95% intervals cover their clip's
    truth together in >= 93% of 200 seeded trials."""
    from vidql.queries import grouped_error_bound

    folder, labels, truth = clips
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{folder}/*.mp4' AS cams; CREATE ORACLE truth FROM LABELS "
               f"'{labels}'; SET ORACLE cams = truth; CREATE INDEX ci ON cams WITH "
               f"(embedder = 'pixel', reps = 60, seed = 0)")
        proxy = np.asarray(db.proxy("cams", "objects('car')"))
        groups = np.repeat(db.sql("SHOW CLIPS cams").df()["clip"].to_numpy(), FRAMES)
    values = np.concatenate([_car_counts(truth, c) for c in ("cam0", "cam1", "cam2")]).astype(float)
    means = {c: values[groups == c].mean() for c in ("cam0", "cam1", "cam2")}
    covered = 0
    for seed in range(200):
        r = grouped_error_bound(groups, lambda p: values[p], proxy=proxy, error=0.5,
                                confidence=0.95, seed=seed, bound="betting")
        covered += all(res.ci_low <= means[k] <= res.ci_high
                       for k, res in zip(r.keys, r.results, strict=True))
    assert covered >= 186, f"joint coverage {covered}/200"


def _index_two_clips(db, folder, labels) -> None:
    """cam0 and cam1 as collection `cams`, labelled by `labels`, with a pixel index `ci`."""
    db.sql(f"LOAD VIDEO ('{folder}/cam0.mp4', '{folder}/cam1.mp4') AS cams; CREATE ORACLE "
           f"truth FROM LABELS '{labels}'; SET ORACLE cams = truth; CREATE INDEX ci ON cams "
           f"WITH (embedder = 'pixel', reps = 40, seed = 0)")


def test_appending_to_an_indexed_collection_extends_the_index(clips, tmp_path):
    """INTO an indexed collection: only the new clip is embedded and only representatives
    among its frames are labelled; the index then covers every frame, after a reopen too."""
    folder, labels, truth = clips
    path = tmp_path / "idx.db"
    with vidql.connect(path, progress=False) as db:
        _index_two_clips(db, folder, labels)
        before = db.sql("SELECT clip, frame FROM vidql.labelled").df()
        r = db.sql(f"LOAD VIDEO '{folder}/cam2.mp4' INTO cams").df()
        new = db.sql("SELECT clip, frame FROM vidql.labelled").df()
        assert len(new) > len(before)
        assert set(new["clip"][~new.set_index(["clip", "frame"]).index.isin(
            before.set_index(["clip", "frame"]).index)]) == {"cam2"}
        assert "ci: 240 frames added" in r["indexes"].iloc[0]
    with vidql.connect(path, progress=False) as db:
        proxy = db.proxy("cams", "objects('car')")
        assert len(proxy) == 3 * FRAMES
        every = np.concatenate([_car_counts(truth, c) for c in ("cam0", "cam1", "cam2")])
        r = db.sql("SELECT AVG(objects('car')) FROM cams ERROR WITHIN 0.5 USING INDEX ci "
                   "SEED 1").df()
        assert r["ci_low"].iloc[0] <= every.mean() <= r["ci_high"].iloc[0]
        db.sql("REFRESH INDEX ci")
        assert len(db.proxy("cams", "objects('car')")) == 3 * FRAMES


KILLED_BEFORE_EXTENDING = """
import os, signal, vidql
from vidql.engine.catalog.indexstore import IndexStore

db = vidql.connect({db!r}, progress=False)
IndexStore.extend_for_video = lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL)
db.sql("LOAD VIDEO '{clip}' INTO cams")
"""


def test_a_kill_between_append_and_index_extension_is_finished_on_open(clips, tmp_path):
    """SIGKILL after LOAD VIDEO ... INTO committed the clip and before its indexes were
    extended: the next open extends them, so approximate queries work without REFRESH."""
    import subprocess
    import sys

    folder, labels, truth = clips
    path = tmp_path / "killed.db"
    with vidql.connect(path, progress=False) as db:
        _index_two_clips(db, folder, labels)
    script = KILLED_BEFORE_EXTENDING.format(db=str(path), clip=f"{folder}/cam2.mp4")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    with pytest.warns(RuntimeWarning, match="finished extending the indexes of video 'cams'.*"
                                            "ci: 240 frames added"):
        db = vidql.connect(path, progress=False)
    with db:
        assert db.sql("SHOW CLIPS cams").df()["clip"].tolist() == ["cam0", "cam1", "cam2"]
        assert len(db.proxy("cams", "objects('car')")) == 3 * FRAMES
        every = np.concatenate([_car_counts(truth, c) for c in ("cam0", "cam1", "cam2")])
        r = db.sql("SELECT AVG(objects('car')) FROM cams ERROR WITHIN 0.5 USING INDEX ci "
                   "SEED 1").df()
        assert r["ci_low"].iloc[0] <= every.mean() <= r["ci_high"].iloc[0]
        assert db.con.execute("SELECT count(*) FROM vidql.index_extensions").fetchall() == [(0,)]
        # killed after extending, before the note was deleted: nothing is extended twice
        db.con.execute("INSERT INTO vidql.index_extensions VALUES ('cams', ?)", [2 * FRAMES])
    with pytest.warns(RuntimeWarning, match="ci: 0 frames added"):
        db = vidql.connect(path, progress=False)
    with db:
        assert len(db.proxy("cams", "objects('car')")) == 3 * FRAMES


def test_loading_a_clip_into_a_collection_again_is_a_no_op_with_a_note(clips, tmp_path):
    """The same content again (the same file, or a copy under another name) is no new clip:
    it is left out with a note, and the index is left as it is."""
    folder, labels, _ = clips
    copy = tmp_path / "camB.mp4"
    shutil.copy(folder / "cam1.mp4", copy)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO ('{folder}/cam0.mp4', '{folder}/cam1.mp4') AS cams; CREATE ORACLE "
               f"truth FROM LABELS '{labels}'; SET ORACLE cams = truth")
        for again in (f"{folder}/cam1.mp4", str(copy)):
            r = db.sql(f"LOAD VIDEO '{again}' INTO cams").df()
            assert "already loaded as clip 'cam1'" in r["skipped"].iloc[0]
        assert db.sql("SHOW CLIPS cams").df()["clip"].tolist() == ["cam0", "cam1"]
        r = db.sql(f"LOAD VIDEO ('{folder}/cam2.mp4', '{copy}') INTO cams").df()
        assert db.sql("SHOW CLIPS cams").df()["clip"].tolist() == ["cam0", "cam1", "cam2"]
        assert r["frame_count"].iloc[0] == 3 * FRAMES and "camB.mp4" in r["skipped"].iloc[0]


def test_labels_oracle_finds_every_row_of_a_clip_and_frame(tmp_path):
    """The LABELS oracle's binary search (rows sorted by clip and frame) returns exactly the
    rows a plain filter returns, in the file's order within a frame, for ids in any order."""
    from vidql.engine.labels.oracle_kinds import LabelsOracle

    rng = np.random.default_rng(0)
    n = 5000
    table = pd.DataFrame({"clip": rng.choice(["b", "a", "c"], n), "frame": rng.integers(0, 300, n),
                          "label": rng.choice(["car", "bus"], n), "score": rng.random(n),
                          "x1": rng.random(n), "y1": rng.random(n), "x2": rng.random(n),
                          "y2": rng.random(n)})
    write_labels(table, tmp_path / "t.labels.parquet")
    oracle = LabelsOracle("t", tmp_path / "t.labels.parquet")
    ids = np.array([250, 3, 77, 3000, 0, 299])
    for clip in ("a", "b", "c", "absent"):
        got = oracle.detect_in_clip(None, ids, clip, False).to_frame()
        want = pd.concat([table[(table["clip"] == clip) & (table["frame"] == f)] for f in ids])
        np.testing.assert_array_equal(got["frame"], want["frame"])
        np.testing.assert_array_equal(got["score"], want["score"])
        assert got["label"].tolist() == want["label"].tolist()


def test_an_empty_selection_keeps_its_column_types(cams):
    r = cams.sql("SELECT clip, frame FROM cams WHERE objects('car') >= 1000 LIMIT 3 SEED 1")
    assert r.df().empty
    assert [str(t) for t in r.types[:3]] == ["VARCHAR", "BIGINT", "DOUBLE"]


def test_appending_without_an_index_loads_no_torch(clips):
    """LOAD VIDEO ... INTO extends indexes; with none to extend it stays light."""
    import subprocess
    import sys

    folder, _, _ = clips
    code = ("import sys, vidql\n"
            "with vidql.connect(progress=False) as db:\n"
            f"    db.sql(\"LOAD VIDEO '{folder}/cam0.mp4' AS cams\")\n"
            f"    db.sql(\"LOAD VIDEO '{folder}/cam1.mp4' INTO cams\")\n"
            "print('torch' in sys.modules, 'faiss' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_show_videos_gives_a_collections_mixed_sizes_and_rate_range(tmp_path):
    from vidql.preprocess.testclip import write_counter_video

    write_counter_video(tmp_path / "small.mp4", 24, 160, 96, fps=25)
    write_counter_video(tmp_path / "large.mp4", 24, 320, 240, fps=30)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO ('{tmp_path / 'small.mp4'}', '{tmp_path / 'large.mp4'}') AS mix; "
               f"LOAD VIDEO '{tmp_path / 'large.mp4'}' AS one")
        shown = db.sql("SHOW VIDEOS").df().set_index("name")
    assert shown.loc["mix", ["clips", "codec", "size", "fps"]].tolist() == [
        2, "h264", "mixed: 160x96, 320x240", "25-30"]
    assert shown.loc["one", ["clips", "codec", "size", "fps"]].tolist() == [1, "h264", "320x240", "30"]
