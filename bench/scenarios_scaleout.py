"""Scale-out on Ray: oracle labelling throughput and CREATE INDEX time with 1 and 2 Ray
workers against the local executor, on a local Ray cluster the scenario starts, with the
answers compared; the figure is parallel efficiency, throughput(2) / (2 × throughput(1))."""
from __future__ import annotations

import time

import numpy as np

import vidql
from vidql.datasets import ensure_traffic

from .registry import BenchContext, ScenarioResult, scenario

RAY_CPUS = 2
ORACLE = "vidql.bench.scenarios_scaleout:BusyOracle"


class BusyOracle:
    """A CPU-bound stand-in for a detector (a PYTHON oracle that needs pixels): `work`
    single-threaded numpy passes over each frame, then one 'car' per 48 levels of mean
    brightness. Its cost per frame is fixed work, so throughput scales with cores."""

    version = "1"

    def __init__(self, work: int = 10):
        self.work = work

    def detect(self, frames: np.ndarray) -> list:
        out = []
        for frame in frames:
            x = frame.astype(np.float32)
            for _ in range(self.work):
                x = np.sqrt(x * 1.0001 + 1.0)
            n = int(frame.mean() // 48) + int(x[0, 0, 0] < 0)  # x keeps the work observable
            out.append([("car", 0.9, 1.0 + i, 2.0, 10.0 + i, 12.0) for i in range(n)])
        return out


def _scan(video, labels, executor: str, workers: int | None, work: int) -> dict:
    """The exact query over every frame, nothing cached; the oracle (and its actors) is
    started first on the last frame, as a model would be loaded before a scan."""
    with vidql.connect(progress=False, executor=executor, workers=workers) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE busy FROM PYTHON '{ORACLE}' "
               f"WITH (work = {work}, batch_size = 32); SET ORACLE t = busy")
        last = db.catalog.video_info("t").frame_count - 1
        db.sql(f"SELECT objects('car') FROM t WHERE frame = {last}")
        t0 = time.perf_counter()
        counts = db.sql(f"SELECT objects('car') AS n FROM t WHERE frame < {last} "
                        "ORDER BY frame").df()["n"].to_numpy()
        seconds = time.perf_counter() - t0
    return {"frames": last, "seconds": seconds, "fps": last / seconds, "counts": counts}


def _index(video, labels, executor: str, workers: int | None, seed: int) -> dict:
    """CREATE INDEX (pixel embedder) twice in one database: the second, timed, finds the
    Ray workers started (its representatives' labels are cached by the first)."""
    with vidql.connect(progress=False, executor=executor, workers=workers) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
        options = f"embedder = 'pixel', seed = {seed}"
        db.sql(f"CREATE INDEX warm ON t USING TASTI WITH ({options})")
        t0 = time.perf_counter()
        db.sql(f"CREATE INDEX i ON t USING TASTI WITH ({options})")
        seconds = time.perf_counter() - t0
        index = db.indexes.get("i")
        return {"seconds": seconds, "embed_seconds": index.stats["seconds"]["embedding"],
                "reps": np.asarray(index.rep_frames).copy(),
                "embeddings": np.array(index.embeddings)}


@scenario("scale-out", "Ray executor on a local cluster: exact-scan oracle throughput and "
                       "CREATE INDEX time with 1 and 2 workers vs local, parallel efficiency")
def scale_out(ctx: BenchContext) -> ScenarioResult:
    try:
        import ray
    except ImportError:
        return ScenarioResult(figures={"skipped": "needs ray: pip install 'vidql[ray]'"})
    n = ctx.size(1500, 10_000, tiny=120)
    work = ctx.size(60, 60, tiny=1)
    video, labels = ensure_traffic(ctx.cache_dir, n, seed=1)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        runs = [("local", None), ("ray", 1), ("ray", 2)]
        scans = {run: _scan(video, labels, *run, work) for run in runs}
        builds = {run: _index(video, labels, *run, ctx.seed) for run in runs}
    finally:
        if started:
            ray.shutdown()
    same_scan = all(np.array_equal(s["counts"], scans[runs[0]]["counts"]) for s in scans.values())
    same_index = all(np.array_equal(b["reps"], builds[runs[0]]["reps"])
                     and np.allclose(b["embeddings"], builds[runs[0]]["embeddings"], atol=1e-5)
                     for b in builds.values())
    table = [{"executor": ex if w is None else f"{ex} ×{w}", "scan_frames": scans[(ex, w)]["frames"],
              "scan_fps": scans[(ex, w)]["fps"], "index_seconds": builds[(ex, w)]["seconds"],
              "embed_seconds": builds[(ex, w)]["embed_seconds"]} for ex, w in runs]
    one, two = scans[("ray", 1)], scans[("ray", 2)]
    figures = {
        "frames": n, "ray_cpus": RAY_CPUS, "oracle_work": work,
        "scan_parallel_efficiency": two["fps"] / (2 * one["fps"]),
        "index_parallel_efficiency": builds[("ray", 1)]["seconds"] / (2 * builds[("ray", 2)]["seconds"]),
        "ray1_vs_local_scan": one["fps"] / scans[("local", None)]["fps"],
        "scan_answers_identical": same_scan, "index_identical": same_index,
        "rows": table,
    }
    if not (same_scan and same_index):
        raise AssertionError(f"the Ray executor's answers differ from local ones: scan "
                             f"identical {same_scan}, index identical {same_index}")
    notes = [f"a local Ray cluster of {RAY_CPUS} CPUs on this machine (shared with other "
             "work): parallel efficiency = throughput with 2 workers / (2 × with 1); the "
             "oracle is a CPU-bound PYTHON oracle decoding its frames on the actors",
             "CREATE INDEX: pixel embedder, the second of two builds (Ray workers warm); "
             "index efficiency = time(1 worker) / (2 × time(2 workers))"]
    return ScenarioResult(figures=figures, table=table, notes=notes)
