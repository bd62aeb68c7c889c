"""Scenario `collection`: one table over many short clips (issue 11).

N synthetic traffic clips (CLIP_FRAMES frames each, seeds SEED_BASE + k, so each clip has
its own traffic) are loaded as one collection `cams`, with their truth as one LABELS oracle
(a `clip` column). For each N (200 clips with --quick, 200 and 1000 otherwise) it reports:

- LOAD VIDEO of a glob (seconds per clip) and, into a second database, the same clips
  appended one at a time with `LOAD VIDEO ... INTO` (the seconds of each append: the first
  10% against the last 10% shows whether an append grows with the collection);
- CREATE INDEX over the collection (the engine's defaults);
- an ERROR WITHIN aggregate over every clip and over single clips (`WHERE clip = ...`), and
  with `GROUP BY clip` where the engine accepts it, each against the exact value computed
  from the label files: labels used against the frames an exact answer labels, and whether
  each interval covers the exact value;
- the peak RSS of each step (each runs in a fresh spawned process) and the catalog's size
  on disk (database file + artifacts folder).

The real clips of ../shared/data (*.mp4, *.avi) are loaded the same way, as one
collection from their folder, with one LABELS oracle from their `<stem>.labels.csv` files.
A tiny run (the test suite's) loads 4 clips of 60 frames, builds a pixel index and runs its
steps in this process.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

import vidql
from vidql.base.errors import VidqlError
from vidql.database import artifacts_dir_for
from vidql.datasets import ensure_traffic, read_labels, write_labels
from vidql.engine.sql.framestat import evaluate

from .plots import figure, save
from .registry import BenchContext, ScenarioResult, scenario
from .scenarios_scale import (directory_bytes, in_child, index_step,
                              on_fresh_copies, peak_rss_mb, remove_database)

CLIP_FRAMES = 150
CLIP_SIZE = (160, 90)
SEED_BASE = 1000  # clip k is synthetic traffic with seed SEED_BASE + k
SIZES_QUICK, SIZES_FULL = (200,), (200, 1000)
TINY_CLIPS, TINY_FRAMES = 4, 60
TINY_INDEX_OPTIONS = {"embedder": "pixel", "reps": 20}  # BenchContext.tiny: no training
INDEX_OPTIONS: dict = {}  # {} = the engine's defaults
COLLECTION, ORACLE, INDEX = "cams", "truth", "cams_idx"
STAT = "objects('car')"
ERROR_ALL, ERROR_CLIP = 0.1, 0.5  # ERROR WITHIN over every clip, and over one clip
PER_CLIP = 5  # clips queried one by one (evenly spread over the load order)
EDGE = 0.1  # the first and last 10% of the appends


# ---- the clips and their truth --------------------------------------------------------------

def synthetic_clips(ctx: BenchContext, n_clips: int, frames: int) -> tuple[Path, Path]:
    """(folder of `n_clips` clips cam0000.mp4 ..., their labels with a `clip` column), built
    once under the cache: the clips are generated once and hard-linked into a folder per N."""
    cache = Path(ctx.cache_dir) / "collection"
    folder = cache / f"clips-{n_clips}x{frames}"
    labels = cache / f"clips-{n_clips}x{frames}.labels.parquet"
    if labels.is_file() and len(list(folder.glob("*.mp4"))) == n_clips:
        return folder, labels
    folder.mkdir(parents=True, exist_ok=True)
    tables = []
    for k in range(n_clips):
        video, truth = ensure_traffic(cache / "traffic", frames, seed=SEED_BASE + k,
                                      width=CLIP_SIZE[0], height=CLIP_SIZE[1])
        link = folder / f"cam{k:04d}.mp4"
        if not link.exists():
            try:
                os.link(video, link)
            except OSError:  # another file system: copy
                link.write_bytes(video.read_bytes())
        tables.append(read_labels(truth).assign(clip=link.stem))
    write_labels(pd.concat(tables, ignore_index=True), labels)
    return folder, labels


def real_clips(ctx: BenchContext) -> tuple[Path, Path] | None:
    """(../shared/data, a labels file of its clips with a `clip` column), or None when it
    holds no *.mp4 or *.avi or one of them has no `<stem>.labels.csv`."""
    data = Path(ctx.shared_dir) / "data" if ctx.shared_dir else None
    if data is None or not data.is_dir():
        return None
    videos = sorted(p for p in data.iterdir() if p.suffix.lower() in (".mp4", ".avi"))
    tables = [read_labels(data / f"{p.stem}.labels.csv").assign(clip=p.stem) for p in videos
              if (data / f"{p.stem}.labels.csv").is_file()]
    if not tables or len(tables) < len(videos):
        return None
    labels = Path(ctx.out_dir).resolve() / "collection-real.labels.parquet"
    write_labels(pd.concat(tables, ignore_index=True), labels)
    return data, labels


def exact_means(labels: Path, clip_frames: dict[str, int]) -> dict[str, float]:
    """The exact AVG of STAT per clip and over all clips ('*'), from the label file."""
    truth = read_labels(labels)
    sums = {}
    for clip, n in clip_frames.items():
        sums[clip] = float(evaluate(STAT, truth[truth["clip"] == clip], np.arange(n)).sum())
    means = {clip: sums[clip] / n for clip, n in clip_frames.items()}
    means["*"] = sum(sums.values()) / sum(clip_frames.values())
    return means


def catalog_bytes(db_path: Path) -> int:
    """The database file (and WAL) with its artifacts folder."""
    files = sum(Path(f"{db_path}{s}").stat().st_size for s in ("", ".wal")
                if Path(f"{db_path}{s}").exists())
    return files + directory_bytes(artifacts_dir_for(db_path))


# ---- steps, each in its own spawned process -------------------------------------------------

def load_step(db_path: str, source: str, labels: str) -> dict:
    """One LOAD VIDEO of `source` (timed), then the LABELS oracle; the clips' frame counts."""
    before = peak_rss_mb()
    with vidql.connect(db_path, progress=False) as db:
        t0 = time.perf_counter()
        db.sql(f"LOAD VIDEO '{source}' AS {COLLECTION}")
        seconds = time.perf_counter() - t0
        peak = peak_rss_mb()
        db.sql(f"CREATE ORACLE {ORACLE} FROM LABELS '{labels}'; "
               f"SET ORACLE {COLLECTION} = {ORACLE}")
        clips = db.sql(f"SHOW CLIPS {COLLECTION}").df()
    return {"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": peak,
            "clip_frames": dict(zip(clips["clip"], clips["frame_count"].astype(int).tolist(),
                                    strict=True))}


def append_step(db_path: str, videos: list[str]) -> dict:
    """The first clip with LOAD VIDEO ... AS, every other one with LOAD VIDEO ... INTO (each
    timed), into one database kept open as a user would."""
    before = peak_rss_mb()
    seconds, cpu = [], []
    with vidql.connect(db_path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{videos[0]}' AS {COLLECTION}")
        for video in videos[1:]:
            t0, c0 = time.perf_counter(), time.process_time()
            db.sql(f"LOAD VIDEO '{video}' INTO {COLLECTION}")
            seconds.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        clips = len(db.sql(f"SHOW CLIPS {COLLECTION}").df())
    return {"append_seconds": seconds, "append_cpu_seconds": cpu, "clips": clips,
            "rss_before_mb": before, "peak_rss_mb": peak_rss_mb()}


def query_step(db_path: str, sqls: dict) -> dict:
    """Each query on a fresh copy of the indexed database (its label cache holds only the
    index's labels): its rows, oracle calls, cache hits, seconds and the frames labelled per
    clip afterwards (the index's and the query's); or the refusal."""
    return {"queries": on_fresh_copies(db_path, sqls, query_figures),
            "peak_rss_mb": peak_rss_mb()}


def query_figures(db, sql: str) -> dict:
    """One query's figures (see query_step), or {"sql", "refused"} when vidql refuses it."""
    t0 = time.perf_counter()
    try:
        df = db.sql(sql).df()
    except VidqlError as exc:
        return {"sql": sql, "refused": str(exc)}
    seconds, report = time.perf_counter() - t0, db.last_report
    labelled = db.sql(f"SELECT clip, count(*) AS n FROM vidql.labelled WHERE "
                      f"video = '{COLLECTION}' GROUP BY clip").df()
    return {"sql": sql, "seconds": seconds, "rows": df.to_dict("records"),
            "oracle_calls": int(report.oracle_calls), "cache_hits": int(report.cache_hits),
            "labelled": dict(zip(labelled["clip"], labelled["n"].tolist(), strict=True))}


# ---- one collection: load, (append), index, query -------------------------------------------

def query_sqls(clips: list[str], seed: int) -> dict:
    """ERROR WITHIN over every clip, over each of `clips` alone, and grouped by clip."""
    tail = f"CONFIDENCE 95% SEED {seed}"
    listed = ", ".join(f"'{c}'" for c in clips)
    sqls = {"*": f"SELECT AVG({STAT}) FROM {COLLECTION} ERROR WITHIN {ERROR_ALL} {tail}"}
    sqls |= {c: f"SELECT AVG({STAT}) FROM {COLLECTION} WHERE clip = '{c}' "
                f"ERROR WITHIN {ERROR_CLIP} {tail}" for c in clips}
    sqls["group_by"] = (f"SELECT clip, AVG({STAT}) FROM {COLLECTION} WHERE clip IN ({listed}) "
                        f"GROUP BY clip ERROR WITHIN {ERROR_CLIP} {tail}")
    return sqls


def judged(query: dict, exact: float, clip_frames: dict, error: float) -> dict:
    """An ERROR WITHIN answer over the clips `clip_frames` against the exact value: covered,
    within the bound, and the frames labelled (the index's and the query's oracle calls)
    against the frames an exact answer labels."""
    row = query["rows"][0]
    frames, labelled = sum(clip_frames.values()), population_labelled(query, clip_frames)
    return {"estimate": float(row["estimate"]), "ci_low": float(row["ci_low"]),
            "ci_high": float(row["ci_high"]), "exact": exact,
            "covered": bool(row["ci_low"] <= exact <= row["ci_high"]),
            "within_error": bool(abs(row["estimate"] - exact) <= error),
            "oracle_calls": query["oracle_calls"], "cache_hits": query["cache_hits"],
            "labelled_frames": labelled, "exact_frames": frames,
            "labelled_fraction": labelled / frames, "seconds": query["seconds"]}


def population_labelled(query: dict, clip_frames: dict) -> int:
    """Frames of the clips `clip_frames` labelled after `query`."""
    return sum(query["labelled"].get(clip, 0) for clip in clip_frames)


def judge_queries(queries: dict, exact: dict, clip_frames: dict) -> dict:
    """Every query's figures against the exact values; GROUP BY per group, or its refusal."""
    out = {}
    for key, query in queries.items():
        if "refused" in query:
            out[key] = {"refused": query["refused"]}
        elif key == "group_by":
            out[key] = judged_groups(query, exact, clip_frames)
        else:
            chosen = clip_frames if key == "*" else {key: clip_frames[key]}
            out[key] = judged(query, exact[key], chosen, ERROR_ALL if key == "*" else ERROR_CLIP)
    return out


def judged_groups(query: dict, exact: dict, clip_frames: dict) -> dict:
    """A GROUP BY clip ERROR WITHIN answer, each group against its exact value (the group
    key in a `clip` or `group` column); its rows unjudged when it has other columns."""
    columns = set(query["rows"][0]) if query["rows"] else set()
    key = "clip" if "clip" in columns else "group"
    if not {key, "estimate", "ci_low", "ci_high"} <= columns:
        return {"unjudged": f"columns {sorted(columns)}", "rows": query["rows"]}
    groups = {}
    for row in query["rows"]:
        clip = str(row[key])
        groups[clip] = {"estimate": float(row["estimate"]), "exact": exact[clip],
                        "covered": bool(row["ci_low"] <= exact[clip] <= row["ci_high"])}
    chosen = {clip: clip_frames[clip] for clip in groups}
    return {"groups": groups, "oracle_calls": query["oracle_calls"],
            "labelled_frames": population_labelled(query, chosen),
            "exact_frames": sum(chosen.values()),
            "all_covered": all(g["covered"] for g in groups.values()),
            "seconds": query["seconds"]}


def measure_collection(ctx: BenchContext, tag: str, source: Path, labels: Path,
                       index_options: dict, appends: list[Path] | None = None) -> dict:
    """Load `source` as one collection, append `appends` one by one into a second database,
    index and query the first; the databases are removed afterwards. Each step runs in a
    spawned process (a tiny run too, so the test suite takes this path)."""
    db_path = Path(ctx.out_dir).resolve() / f"collection-{tag}.db"
    append_path = db_path.with_name(f"collection-{tag}-append.db")
    remove_database(db_path)
    remove_database(append_path)
    try:
        load = in_child(load_step, str(db_path), str(source), str(labels))
        clip_frames = load.pop("clip_frames")
        load.update(clips=len(clip_frames), frames=sum(clip_frames.values()),
                    seconds_per_clip=load["seconds"] / len(clip_frames),
                    catalog_bytes=catalog_bytes(db_path))
        run = {"load_video": load}
        if appends:
            run["append"] = appends_figures(in_child(append_step, str(append_path),
                                                     [str(v) for v in appends]))
            run["append"]["catalog_bytes"] = catalog_bytes(append_path)
        index = in_child(index_step, str(db_path), index_options, COLLECTION, INDEX)
        index["catalog_bytes"] = catalog_bytes(db_path)
        run["create_index"] = index
        names = list(clip_frames)
        picked = [names[i] for i in sorted(set(np.linspace(0, len(names) - 1,
                                                           min(PER_CLIP, len(names))).astype(int)))]
        queries = in_child(query_step, str(db_path), query_sqls(picked, ctx.seed))
        run["queries_peak_rss_mb"] = queries["peak_rss_mb"]
        run["queries"] = judge_queries(queries["queries"], exact_means(labels, clip_frames),
                                       clip_frames)
    finally:
        remove_database(db_path)
        remove_database(append_path)
    return run


def appends_figures(step: dict) -> dict:
    """Per-append wall and CPU seconds: the mean wall seconds of the first EDGE of the
    appends against the last EDGE, the same with the median CPU seconds (steadier on a
    shared machine), and the CPU seconds' least-squares slope per 100 clips already loaded."""
    wall, cpu = np.asarray(step["append_seconds"]), np.asarray(step["append_cpu_seconds"])
    edge = max(1, int(round(EDGE * len(wall))))
    first, last = float(wall[:edge].mean()), float(wall[-edge:].mean())
    cpu_first, cpu_last = float(np.median(cpu[:edge])), float(np.median(cpu[-edge:]))
    slope = float(np.polyfit(np.arange(len(cpu)), cpu, 1)[0]) * 100 if len(cpu) > 1 else 0.0
    return {**step, "first_mean_seconds": first, "last_mean_seconds": last,
            "last_over_first": last / first, "median_seconds": float(np.median(wall)),
            "cpu_first_median_seconds": cpu_first, "cpu_last_median_seconds": cpu_last,
            "cpu_last_over_first": cpu_last / max(cpu_first, 1e-9),
            "cpu_median_seconds": float(np.median(cpu)),
            "cpu_slope_seconds_per_100_clips": slope}


# ---- the scenario ---------------------------------------------------------------------------

@scenario("collection", "a collection of N short synthetic clips (200; 200 and 1000 in the full "
                        "run) and the real clips as one table: LOAD VIDEO of a glob and appends "
                        "one clip at a time (seconds per clip), CREATE INDEX, ERROR WITHIN over "
                        "all clips and per clip against the exact answer, peak RSS and catalog "
                        "size")
def run_collection(ctx: BenchContext) -> ScenarioResult:
    sizes = ctx.size(SIZES_QUICK, SIZES_FULL, tiny=(TINY_CLIPS,))
    frames = ctx.size(CLIP_FRAMES, CLIP_FRAMES, tiny=TINY_FRAMES)
    index_options = dict(ctx.size(INDEX_OPTIONS, INDEX_OPTIONS, tiny=TINY_INDEX_OPTIONS))
    runs = {}
    for n in sizes:
        print(f"   collection: {n} clips of {frames} frames", flush=True)
        t0 = time.perf_counter()
        folder, labels = synthetic_clips(ctx, n, frames)
        generate = time.perf_counter() - t0
        runs[str(n)] = measure_collection(ctx, str(n), folder / "*.mp4", labels, index_options,
                                          appends=sorted(folder.glob("*.mp4")))
        runs[str(n)]["generate_seconds"] = generate
    real = real_clips(ctx)
    if real is not None:
        print("   collection: the real clips of ../shared/data", flush=True)
        runs["real"] = measure_collection(ctx, "real", real[0], real[1], index_options)
    figures = {"sizes": list(sizes), "clip_frames": frames, "clip_size": list(CLIP_SIZE),
               "seed_base": SEED_BASE, "index_options": index_options or "engine defaults",
               "error_all": ERROR_ALL, "error_clip": ERROR_CLIP, "runs": runs}
    notes = [f"synthetic clips: {frames} frames of {CLIP_SIZE[0]}x{CLIP_SIZE[1]} traffic, seed "
             f"{SEED_BASE} + k for clip k; their truth is one LABELS oracle with a clip column",
             "each step runs in a fresh spawned process: peak RSS is that step's own, imports "
             "included; catalog = database file + artifacts folder",
             "append: a second database, the first clip loaded AS, each other one INTO; "
             f"last/first = the last {EDGE:.0%} of appends over the first {EDGE:.0%} (mean wall "
             "seconds; median CPU seconds of the process, steadier on a shared machine); "
             "per_clip_s = median wall seconds of an append",
             f"ERROR WITHIN {ERROR_ALL} over all clips, {ERROR_CLIP} per clip, 95%, seed "
             f"{ctx.seed}; each query on a fresh copy of the indexed database: labelled_frames = "
             "the population's frames labelled after it (the index's and its own oracle "
             "calls) against exact_frames, the frames an exact answer labels",
             f"index options: {index_options or 'engine defaults'}"]
    if real is None:
        notes.append("real clips skipped: no ../shared/data with videos and label files")
    notes += [f"{tag} clips, query {key!r} refused: {q['refused'].splitlines()[0]}"
              for tag, run in runs.items() for key, q in run["queries"].items() if "refused" in q]
    return ScenarioResult(figures=figures, table=table_rows(runs), notes=notes,
                          plots=plot(ctx, runs))


def table_rows(runs: dict) -> list[dict]:
    """Rows per collection: load, append, index, then each query."""
    rows = []
    blank = {"collection": "", "step": "", "clips": "", "seconds": "", "per_clip_s": "",
             "peak_rss_mb": "", "catalog_mb": "", "oracle_calls": "", "labelled_frames": "",
             "exact_frames": "", "estimate": "", "exact": "", "covered": ""}
    for tag, run in runs.items():
        load, index = run["load_video"], run["create_index"]
        rows.append(blank | {"collection": tag, "step": "LOAD VIDEO (one statement)",
                             "clips": load["clips"], "seconds": round(load["seconds"], 2),
                             "per_clip_s": round(load["seconds_per_clip"], 4),
                             "peak_rss_mb": round(load["peak_rss_mb"]),
                             "catalog_mb": round(load["catalog_bytes"] / 2**20, 2)})
        if "append" in run:
            a = run["append"]
            rows.append(blank | {
                "collection": tag, "step": f"INTO one at a time (last/first 10%: wall "
                                           f"{a['last_over_first']:.2f}, CPU "
                                           f"{a['cpu_last_over_first']:.2f})",
                "clips": a["clips"], "seconds": round(sum(a["append_seconds"]), 2),
                "per_clip_s": round(a["median_seconds"], 4),
                "peak_rss_mb": round(a["peak_rss_mb"]),
                "catalog_mb": round(a["catalog_bytes"] / 2**20, 2)})
        rows.append(blank | {"collection": tag, "step": "CREATE INDEX",
                             "seconds": round(index["seconds"], 2),
                             "peak_rss_mb": round(index["peak_rss_mb"]),
                             "catalog_mb": round(index["catalog_bytes"] / 2**20, 2),
                             "oracle_calls": index["oracle_calls"],
                             "labelled_frames": index["oracle_calls"],
                             "exact_frames": load["frames"]})
        for key, q in run["queries"].items():
            step = {"*": "ERROR WITHIN, all clips", "group_by": "ERROR WITHIN GROUP BY clip"
                    }.get(key, f"ERROR WITHIN, clip {key}")
            row = blank | {"collection": tag, "step": step}
            if "refused" in q or "unjudged" in q:
                row["covered"] = "refused" if "refused" in q else q["unjudged"]
            elif key == "group_by":
                row |= {"clips": len(q["groups"]), "seconds": round(q["seconds"], 2),
                        "oracle_calls": q["oracle_calls"],
                        "labelled_frames": q["labelled_frames"],
                        "exact_frames": q["exact_frames"], "covered": q["all_covered"]}
            else:
                row |= {"seconds": round(q["seconds"], 2), "oracle_calls": q["oracle_calls"],
                        "labelled_frames": q["labelled_frames"], "exact_frames": q["exact_frames"],
                        "estimate": round(q["estimate"], 3), "exact": round(q["exact"], 3),
                        "covered": q["covered"]}
            rows.append(row)
    return rows


def plot(ctx: BenchContext, runs: dict) -> list[str]:
    """Seconds of each append against the number of clips already loaded."""
    appended = {tag: run["append"] for tag, run in runs.items() if "append" in run}
    drawn = figure("LOAD VIDEO ... INTO: one clip's append time against the collection's size",
                   1 if appended else 0, width=7, height=4)
    if drawn is None:
        return []
    plt, fig, (ax,) = drawn
    for tag, a in appended.items():
        ax.plot(np.arange(1, len(a["append_cpu_seconds"]) + 1), a["append_cpu_seconds"], ".",
                markersize=3, label=f"{tag} clips")
    ax.set(xlabel="clips already in the collection", ylabel="CPU seconds")
    ax.legend()
    return save(plt, fig, ctx.out_dir, "collection")
