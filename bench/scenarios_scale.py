"""Scenario `scale`: vidql at growing N on synthetic traffic, its truth as a LABELS oracle.

For each N (10k and 100k with --quick, also 1M otherwise; VIDQL_SCALE_SIZES="2000,5000"
overrides) it reports `LOAD VIDEO` seconds, `CREATE INDEX` seconds, the peak RSS of each
(every step runs in a fresh spawned process, so the figure is that step's own), the index
size on disk, and for each approximate query kind of docs/sql.md its latency, oracle calls,
`engine_overhead` = SQL wall time / (the same operator on arrays with the same seed + the
oracle's time), and `label_path_overhead` = the operator's own time inside the SQL query
(through the label cache, journal and oracle) / that same sum. The operator on arrays is
the planner's own call (`run_operator`) on the index's proxy as it is just before the
query (propagated then, and kept by the index, so neither side pays for it) and the truth
from the label file, so the overhead is what the engine adds: parsing, binding, the label
cache, reading the labels cracking needs (the crack itself runs after the answer;
`cracking_seconds` has its time); the label path's is what the label cache alone adds
(the first target of the speed issue). Each query runs QUERY_REPEATS times, each time on a
fresh copy of the database, and reports its median run.

The build options are dicts (LOAD_OPTIONS, INDEX_OPTIONS; VIDQL_SCALE_LOAD and
VIDQL_SCALE_INDEX override them with JSON) so the build can be tuned without code changes.
"""
from __future__ import annotations

import copy
import json
import os
import resource
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from vidql.engine.sql.sqlnames import sql_name
import vidql
from vidql.base.errors import ParameterError
from vidql.database import artifacts_dir_for
from vidql.datasets import ensure_traffic, read_labels
from vidql.engine import planner
from vidql.engine.sql.dialect import parse
from vidql.engine.sql.framestat import evaluate

from .plots import figure, save
from .registry import BenchContext, ScenarioResult, scenario
from .scenarios_queries import most_separated

SIZES_QUICK = (10_000, 100_000)
SIZES_FULL = (10_000, 100_000, 1_000_000)
TINY_INDEX_OPTIONS = {"train": 20, "reps": 40, "triplets": 100}  # BenchContext.tiny
LOAD_OPTIONS: dict = {}  # LOAD VIDEO ... WITH (...); {} = no rendition
INDEX_OPTIONS: dict = {}  # CREATE INDEX ... WITH (...); {} = the engine's defaults
TRAFFIC_SEED = 1  # seed 1 has a bus episode within the first 4000 frames
VIDEO, ORACLE, INDEX = "traffic", "truth", "traffic_idx"
# runs of each query (fresh copies); the figures are the median run's (with 3 runs, that
# median moved by 0.05-0.2 between bench runs at 10k and 100k)
QUERY_REPEATS = 5
RARE_RATE = 0.01  # the crowded-frame predicate of LIMIT and FIND RARE holds on <= 1% of frames
LIMIT_GAP = 10  # crowded frames come in a few episodes
# one query per approximate kind of docs/sql.md; {crowd}: the <= 1% car-count threshold;
# {limit}: 10, or fewer where a scan in any order could not find 10 frames LIMIT_GAP apart
QUERIES = {
    "error_within": "SELECT AVG(objects('car')) FROM {video} ERROR WITHIN 0.1 CONFIDENCE 95%",
    "count_predicate": "SELECT COUNT(*) FROM {video} WHERE objects('car') >= 5 "
                       "ERROR WITHIN 5% CONFIDENCE 95%",
    "budget": "SELECT AVG(objects('car')) FROM {video} WHERE contains('bus') "
              "ORACLE BUDGET 2000 CONFIDENCE 95%",
    "limit_gap": "SELECT frame FROM {video} WHERE objects('car') >= {crowd} "
                 f"LIMIT {{limit}} GAP {LIMIT_GAP}",
    "recall_target": "SELECT frame FROM {video} WHERE contains('bus') RECALL TARGET 90% "
                     "CONFIDENCE 95% ORACLE BUDGET 1000",
    "precision_target": "SELECT frame FROM {video} WHERE contains('bus') PRECISION TARGET 95% "
                        "CONFIDENCE 95% ORACLE BUDGET 1000",
    "find_rare": "SELECT frame FROM {video} WHERE objects('car') >= {crowd} "
                 "FIND RARE ORACLE BUDGET 500",
}
QUERY_FIGURES = ("sql", "seconds", "oracle_calls", "cache_hits", "labels_used", "oracle_seconds",
                 "cracking_seconds", "operator_seconds", "fsync_seconds", "array_seconds",
                 "array_seconds_hot", "array_oracle_calls", "engine_overhead", "label_path_overhead",
                 "label_path_overhead_hot", "same_answer", "answer",
                 "label_path_overhead_runs", "engine_overhead_runs")


def scale_sizes(quick: bool) -> tuple[int, ...]:
    """Frame counts to run: VIDQL_SCALE_SIZES (comma-separated) or the quick/full defaults."""
    text = os.environ.get("VIDQL_SCALE_SIZES", "").strip()
    if not text:
        return SIZES_QUICK if quick else SIZES_FULL
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 100:
        raise ParameterError(f"VIDQL_SCALE_SIZES={text!r}: give frame counts >= 100 separated "
                             f"by commas, e.g. '2000,5000'")
    return sizes


def build_options() -> tuple[dict, dict]:
    """(LOAD VIDEO options, CREATE INDEX options): LOAD_OPTIONS and INDEX_OPTIONS, or JSON
    objects in VIDQL_SCALE_LOAD and VIDQL_SCALE_INDEX."""
    chosen = []
    for variable, default in (("VIDQL_SCALE_LOAD", LOAD_OPTIONS),
                              ("VIDQL_SCALE_INDEX", INDEX_OPTIONS)):
        text = os.environ.get(variable, "").strip()
        try:
            options = json.loads(text) if text else dict(default)
        except json.JSONDecodeError:
            options = None
        if not isinstance(options, dict):
            raise ParameterError(f"{variable}={text!r}: give a JSON object of options, e.g. "
                                 f"'{{\"reps\": 200}}'")
        chosen.append(options)
    return chosen[0], chosen[1]


def with_clause(options: dict) -> str:
    """` WITH (a = 1, b = 'x')` for a dialect statement; empty for no options."""
    if not options:
        return ""
    value = lambda v: f"'{v}'" if isinstance(v, str) else str(v)  # noqa: E731
    return " WITH (" + ", ".join(f"{k} = {value(v)}" for k, v in options.items()) + ")"


def crowd_threshold(cars: np.ndarray, rate: float = RARE_RATE) -> int:
    """The smallest car count t with objects('car') >= t on at most `rate` of frames."""
    return next(t for t in range(1, int(cars.max()) + 2) if (cars >= t).mean() <= rate)


# ---- steps, each in its own spawned process -------------------------------------------------

def peak_rss_mb() -> float:
    """This process image's peak RSS (VmHWM; ru_maxrss would carry the forking parent's)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def in_child(fn, *args) -> dict:
    """Run `fn(*args)` in a fresh spawned process, so its peak RSS is its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def load_step(db_path: str, video: str, labels: str, options: dict) -> dict:
    """LOAD VIDEO (timed, peak RSS read before anything else runs), then register the truth
    as the video's LABELS oracle."""
    before = peak_rss_mb()
    with vidql.connect(db_path, progress=False) as db:
        t0 = time.perf_counter()
        db.sql(f"LOAD VIDEO '{video}' AS {VIDEO}{with_clause(options)}")
        figures = {"seconds": time.perf_counter() - t0, "rss_before_mb": before,
                   "peak_rss_mb": peak_rss_mb()}
        db.sql(f"CREATE ORACLE {ORACLE} FROM LABELS '{labels}'; SET ORACLE {VIDEO} = {ORACLE}")
    return figures


def index_step(db_path: str, options: dict, video: str = VIDEO, index: str = INDEX) -> dict:
    """CREATE INDEX `index` on `video` (timed) with `options`; its oracle calls and
    per-stage seconds."""
    import vidql.indexes  # noqa: F401  (torch and the index code load before rss_before_mb)

    before = peak_rss_mb()
    with vidql.connect(db_path, progress=False) as db:
        t0 = time.perf_counter()
        db.sql(f"CREATE INDEX {sql_name(index)} ON {sql_name(video)} USING TASTI{with_clause(options)}")
        seconds = time.perf_counter() - t0
        stats = db.indexes.get(index).stats
    return {"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": peak_rss_mb(),
            "oracle_calls": int(stats.get("oracle_calls", 0)),
            "stage_seconds": stats.get("seconds", {})}


def copy_database(src: Path, dst: Path) -> None:
    """Copy a closed database file (and WAL) with its artifact folder, and flush the copy to
    disk: a query's first fsync must not also write back the copy (0.5 GB at 1M frames),
    which a database at rest does not ask of it."""
    remove_database(dst)
    for suffix in ("", ".wal"):
        if Path(f"{src}{suffix}").exists():
            shutil.copy2(f"{src}{suffix}", f"{dst}{suffix}")
    shutil.copytree(artifacts_dir_for(src), artifacts_dir_for(dst))
    os.sync()


def remove_database(path: Path) -> None:
    for suffix in ("", ".wal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(artifacts_dir_for(path), ignore_errors=True)


def on_fresh_copies(db_path: str, sqls: dict, measure) -> dict:
    """{key: measure(db, sql)} for each query of `sqls`, each run on a fresh copy of the
    database at `db_path` (so its label cache holds only what the original held)."""
    base = Path(db_path)
    work = base.with_name(base.stem + "-query.db")
    out = {}
    for key, sql in sqls.items():
        copy_database(base, work)
        try:
            with vidql.connect(work, progress=False) as db:
                out[key] = measure(db, sql)
        finally:
            remove_database(work)
    return out


def query_step(db_path: str, labels: str, sqls: dict) -> dict:
    """Each query of `sqls` through SQL and on arrays, QUERY_REPEATS times, each on a fresh
    copy of the indexed database (so its label cache holds only the index's labels);
    figures per kind from its median run (`median_run`)."""
    detections = read_labels(labels)
    runs = [on_fresh_copies(db_path, sqls, lambda db, sql: measure_query(db, sql, detections))
            for _ in range(QUERY_REPEATS)]
    return {"queries": {key: median_run([run[key] for run in runs]) for key in sqls},
            "peak_rss_mb": peak_rss_mb()}


def median_run(runs: list[dict]) -> dict:
    """The run with the median label_path_overhead (a query of a few milliseconds is moved
    by whatever else the machine does), with every run's two overheads."""
    ordered = sorted(runs, key=lambda r: r["label_path_overhead"])
    return {**ordered[(len(ordered) - 1) // 2],
            "label_path_overhead_runs": [r["label_path_overhead"] for r in runs],
            "engine_overhead_runs": [r["engine_overhead"] for r in runs]}


# ---- one query: SQL against the operator on arrays -------------------------------------------

def measure_query(db, sql: str, detections) -> dict:
    """Run the planner's operator on arrays, then `sql`, with the same seed and inputs (the
    arrays first: the SQL query cracks the index, which changes its proxy)."""
    q = parse(sql)
    array_seconds, hot_seconds, array_calls, array_df = array_operator(db, q, detections)
    t0 = time.perf_counter()
    df = db.sql(sql).df()
    seconds = time.perf_counter() - t0
    report = db.last_report
    db.indexes.settle()  # cracking runs on after the answer: its own time is reported
    baseline = max(array_seconds + report.oracle_seconds, 1e-9)
    if "estimate" in df.columns:  # NULL (an estimate the sample cannot support) as NaN
        sql_answer, answer = (float(d["estimate"].astype("float64").iloc[0]) for d in (df, array_df))
        same = bool(np.isclose(sql_answer, answer, equal_nan=True))
    else:
        sql_answer = int(len(df))
        same = set(df["frame"].tolist()) == set(array_df["frame"].tolist())
    return {"sql": sql, "seconds": seconds, "oracle_calls": int(report.oracle_calls),
            "cache_hits": int(report.cache_hits),
            "labels_used": int(report.oracle_calls + report.cache_hits),
            "oracle_seconds": report.oracle_seconds,
            "cracking_seconds": report.seconds.get("cracking", 0.0) + db.indexes.crack_seconds,
            "operator_seconds": report.seconds["total"],
            "fsync_seconds": report.seconds.get("fsync", 0.0),
            "array_seconds": array_seconds, "array_seconds_hot": hot_seconds,
            "array_oracle_calls": array_calls, "engine_overhead": seconds / baseline,
            "label_path_overhead": report.seconds["total"] / baseline,
            "label_path_overhead_hot": report.seconds["total"] / max(
                hot_seconds + report.oracle_seconds, 1e-9),
            "same_answer": same, "answer": sql_answer}


def array_operator(db, q, detections) -> tuple:
    """The planner's own operator call for `q` (engine/planner.py `run_operator`) on a copy
    of its binding whose true values come from `detections` instead of the label cache,
    with the proxy and seed the SQL query will see (it runs before that query cracks the
    index): (seconds, hot seconds, distinct frames asked, the relation). It runs three times: a
    warm-up (imports, mapped files, which the SQL query then finds warm too), then right
    after a run of its own (`hot`: caches warm for the very code it runs next), then right
    after binding the query anew, as the SQL query's operator starts (`seconds`, the
    baseline: at 10k frames a 1.7 ms operator took 2.4 ms there, the SQL query's operator
    outside its label callbacks 2.5 ms). The seconds leave out evaluating the statistics on
    `detections`, which stands in for the oracle, and propagating the proxy."""
    setup = [0.0]
    evaluated, proxies = {}, {}

    def timed_run(b):
        asked = np.zeros(b.n, dtype=bool)

        def truths(*exprs):
            t0 = time.perf_counter()
            for e in exprs:
                if e not in evaluated:
                    evaluated[e] = evaluate(e, detections, b.population)
            values = [evaluated[e] for e in exprs]
            setup[0] += time.perf_counter() - t0

            def fn(positions):
                positions = np.asarray(positions, dtype=np.int64)
                asked[positions] = True
                return tuple(v[positions] for v in values)
            return fn

        def proxy(expr):  # propagated once, kept by the index for the SQL query too
            t0 = time.perf_counter()
            if expr not in proxies:
                proxies[expr] = b.proxy(expr)
            setup[0] += time.perf_counter() - t0
            return proxies[expr]

        arrays = copy.copy(b)
        arrays.truths, arrays.proxy = truths, proxy
        setup[0] = 0.0
        t0 = time.perf_counter()
        df = planner.run_operator(arrays, q, seed, b.report(q.kind, seed))
        return time.perf_counter() - t0 - setup[0], int(asked.sum()), df

    b = planner.Binding(db, q)
    seed = b.sampling_seed(q.clauses.seed)
    timed_run(b)  # warm-up
    hot, _, _ = timed_run(b)
    seconds, calls, df = timed_run(planner.Binding(db, q))
    return seconds, hot, calls, df


# ---- the scenario ---------------------------------------------------------------------------

def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def measure_size(ctx: BenchContext, n: int, load_options: dict, index_options: dict) -> dict:
    """Generate (or reuse) N frames of traffic, then load, index and query them."""
    t0 = time.perf_counter()
    video, labels = ensure_traffic(ctx.cache_dir, n, seed=TRAFFIC_SEED)
    generate = time.perf_counter() - t0
    cars = evaluate("objects('car')", read_labels(labels), np.arange(n))
    crowd = crowd_threshold(cars)
    # any maximal GAP-separated set holds half the largest one, so every scan order reaches k
    limit = max(1, min(10, (most_separated(cars >= crowd, LIMIT_GAP) + 1) // 2))
    sqls = {kind: template.format(video=VIDEO, crowd=crowd, limit=limit) + f" SEED {ctx.seed}"
            for kind, template in QUERIES.items()}
    db_path = Path(ctx.out_dir).resolve() / f"scale-{n}.db"
    remove_database(db_path)
    try:
        load = in_child(load_step, str(db_path), str(video), str(labels), load_options)
        index = in_child(index_step, str(db_path), index_options)
        index["disk_mb"] = directory_bytes(artifacts_dir_for(db_path) / "indexes" / INDEX) / 2**20
        queries = in_child(query_step, str(db_path), str(labels), sqls)
    finally:  # a 1M-frame index is large: keep the figures, not the files
        remove_database(db_path)
    return {"frames": n, "generate_seconds": generate, "crowd_threshold": crowd, "limit": limit,
            "load_video": load, "create_index": index, **queries}


@scenario("scale", "LOAD VIDEO, CREATE INDEX (seconds, peak RSS, size on disk) and every "
                   "approximate query kind (latency, oracle calls, engine overhead over the "
                   "operator on arrays) at 10k, 100k and (full run) 1M frames")
def run_scale(ctx: BenchContext) -> ScenarioResult:
    load_options, index_options = build_options()
    sizes = ctx.size(scale_sizes(True), scale_sizes(False), tiny=(1000,))
    index_options = index_options or ctx.size({}, {}, tiny=dict(TINY_INDEX_OPTIONS))
    runs = {}
    for n in sizes:
        print(f"   scale: {n} frames", flush=True)
        runs[str(n)] = measure_size(ctx, n, load_options, index_options)
    figures = {"sizes": list(sizes), "traffic_seed": TRAFFIC_SEED, "load_options": load_options,
               "index_options": index_options, "runs": runs}
    notes = ["each step runs in a fresh spawned process: peak RSS is that step's own (its "
             "imports included; rss_before_mb is the figure after imports)",
             "oracle = the video's truth as a LABELS oracle without a stated cost, so oracle "
             "seconds are the measured lookup time",
             "engine_overhead = SQL wall time / (operator on arrays with the same seed and proxy "
             "+ oracle seconds); label_path_overhead = the operator's time inside the SQL query "
             "(label cache, journal and oracle included) / the same sum; fsync_ms = the part of "
             "the operator's time spent making its new labels durable (the journal's fsync and "
             "write-back hand-overs: the disk's wait); same_answer says the two runs agreed; "
             "each query runs QUERY_REPEATS times on fresh copies and its "
             f"figures are the run with the median label_path_overhead (of {QUERY_REPEATS})",
             f"index options: {index_options or 'engine defaults'}; load options: "
             f"{load_options or 'none'}"]
    return ScenarioResult(figures=figures, table=table_rows(runs), notes=notes,
                          plots=plot(ctx, runs))


def table_rows(runs: dict) -> list[dict]:
    """One row per frame count and step (LOAD VIDEO, CREATE INDEX, each query kind)."""
    rows = []
    for run in runs.values():
        n = run["frames"]
        for step, key in (("LOAD VIDEO", "load_video"), ("CREATE INDEX", "create_index")):
            part = run[key]
            rows.append({"frames": n, "step": step, "seconds": round(part["seconds"], 2),
                         "oracle_calls": part.get("oracle_calls", 0),
                         "peak_rss_mb": round(part["peak_rss_mb"]),
                         "disk_mb": round(part.get("disk_mb", 0.0), 1), "engine_overhead": "",
                         "label_path_overhead": "", "fsync_ms": ""})
        for kind, q in run["queries"].items():
            rows.append({"frames": n, "step": kind, "seconds": round(q["seconds"], 3),
                         "oracle_calls": q["oracle_calls"], "peak_rss_mb": "", "disk_mb": "",
                         "engine_overhead": round(q["engine_overhead"], 2),
                         "label_path_overhead": round(q["label_path_overhead"], 2),
                         "fsync_ms": round(q["fsync_seconds"] * 1e3, 2)})
    return rows


def plot(ctx: BenchContext, runs: dict) -> list[str]:
    """Seconds and peak memory against N (log-log); skipped when matplotlib is missing."""
    drawn = figure("vidql at growing N: seconds, peak memory and disk", 2, width=5.5, height=4)
    if drawn is None:
        return []
    plt, fig, (left, right) = drawn
    ns = [r["frames"] for r in runs.values()]
    for label, key in (("LOAD VIDEO", "load_video"), ("CREATE INDEX", "create_index")):
        left.plot(ns, [r[key]["seconds"] for r in runs.values()], "o-", label=label)
    for kind in QUERIES:
        left.plot(ns, [r["queries"][kind]["seconds"] for r in runs.values()], ".--", label=kind)
    left.set(xscale="log", yscale="log", xlabel="frames", ylabel="seconds",
             title="time against N")
    left.legend(fontsize=7)
    memory = {"LOAD VIDEO peak RSS": lambda r: r["load_video"]["peak_rss_mb"],
              "CREATE INDEX peak RSS": lambda r: r["create_index"]["peak_rss_mb"],
              "queries peak RSS": lambda r: r["peak_rss_mb"],
              "index on disk": lambda r: r["create_index"]["disk_mb"]}
    for label, figure_of in memory.items():
        right.plot(ns, [figure_of(r) for r in runs.values()], "o-", label=label)
    right.set(xscale="log", yscale="log", xlabel="frames", ylabel="MiB",
              title="memory and disk against N")
    right.legend(fontsize=7)
    return save(plt, fig, ctx.out_dir, "scale")
