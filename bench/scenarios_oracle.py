"""The oracle path near its limit: an exact YOLOX-Nano scan through vidql against a tight
raw CPU loop over the same frames (decode, letterbox, `session.run`), side by side, for each
onnxruntime setting (intra-op threads, and one-thread runs on several frames at once)."""
from __future__ import annotations

import importlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

import vidql
from vidql.datasets import ensure_traffic
from vidql.preprocess.frames import FrameReader

from .registry import BenchContext, ScenarioResult, scenario

BATCH = 8
# (onnxruntime intra-op threads, 0: its default; runs at once, 0: one per core)
SETTINGS = ((1, 1), (2, 1), (0, 1), (1, 0))
ROUNDS = 2  # every path runs once per round, in turn; each keeps its fastest round


def _letterbox(frame: np.ndarray, out: np.ndarray) -> None:
    """YOLOX input into `out` (float32 3×H×W): BGR at the top-left of a 114-padded canvas;
    resized first, channels reordered while writing (as the engine's ONNX oracle does)."""
    import cv2

    h, w = frame.shape[:2]
    r = min(out.shape[1] / h, out.shape[2] / w)
    resized = cv2.resize(frame, (int(w * r), int(h * r)), interpolation=cv2.INTER_LINEAR)
    out.fill(114)
    out[:, :resized.shape[0], :resized.shape[1]] = resized.transpose(2, 0, 1)[::-1]


def raw_loop(model, clip, n: int, threads: int, runs: int = 1) -> dict:
    """Decode frames 0..n-1 in order, letterbox and run the model (BATCH frames a call, or
    one when the model's batch is fixed at 1), `runs` calls at once (threads; 0: one per
    core)."""
    import onnxruntime as ort


    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    hw = (inp.shape[2], inp.shape[3])
    per_call = 1 if inp.shape[0] == 1 else BATCH  # a model exported for batch 1 runs a frame a call
    runs = runs or os.cpu_count() or 1
    per_call = per_call if runs == 1 else -(-BATCH // runs) if per_call == BATCH else 1
    blobs = np.empty((BATCH, 3, *hw), dtype=np.float32)
    run = lambda part: session.run(None, {inp.name: part})  # noqa: E731
    wall, cpu = time.perf_counter(), time.process_time()
    with FrameReader(clip) as reader, ThreadPoolExecutor(runs) as pool:
        for _, frames in reader.iter_batches(BATCH, 0, n):
            for frame, blob in zip(frames, blobs, strict=False):
                _letterbox(frame, blob)
            list(pool.map(run, [blobs[start:start + per_call]
                                for start in range(0, len(frames), per_call)]))
    return _rates(n, time.perf_counter() - wall, time.process_time() - cpu)


def engine_scan(ctx: BenchContext, model, clip, n: int) -> dict:
    """The exact query `objects('car')` over frames 0..n-1 with an ONNX oracle, nothing of
    them cached; the model is loaded before (on the video's last frame) as the raw loop's is."""
    with _onnx_database(ctx.out_dir / "oracle-bench.db", clip, model) as db:
        wall, cpu = time.perf_counter(), time.process_time()
        db.sql(f"SELECT sum(objects('car')) FROM clip WHERE frame < {n}").df()
        out = _rates(n, time.perf_counter() - wall, time.process_time() - cpu)
        out["oracle_seconds"] = db.last_report.oracle_seconds
    return out


def sampled_query(ctx: BenchContext, model, n: int, budget: int) -> dict:
    """An ORACLE BUDGET aggregate (frames sampled across the video, no index) over `n`
    frames of synthetic traffic with the ONNX oracle: wall seconds against the detector's
    own (letterbox, inference, NMS); the model is loaded before, as in `engine_scan`."""
    video, _ = ensure_traffic(ctx.cache_dir, n, seed=1)
    with _onnx_database(ctx.out_dir / "oracle-sampled.db", video, model) as db:
        importlib.import_module("vidql.queries")  # loaded, as a long-lived process has it
        t0 = time.perf_counter()
        db.sql(f"SELECT AVG(objects('car')) FROM clip ORACLE BUDGET {budget} SEED {ctx.seed}")
        wall = time.perf_counter() - t0
        report = db.last_report
    return {"frames": n, "oracle_calls": int(report.oracle_calls), "seconds": wall,
            "detector_seconds": report.oracle_seconds,
            "outside_detector": 1 - report.oracle_seconds / wall}


@contextmanager
def _onnx_database(path, video, model):
    """A fresh database at `path` (removed after) with `video` as table `clip`, labelled by
    YOLOX-Nano, the model loaded (on the video's last frame)."""
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    try:
        with vidql.connect(path, progress=False) as db:
            db.sql(f"LOAD VIDEO '{video}' AS clip; CREATE ORACLE y FROM ONNX '{model}' "
                   f"WITH (score = 0.3, batch_size = {BATCH}); SET ORACLE clip = y")
            last = db.catalog.video_info("clip").frame_count - 1
            db.sql(f"SELECT objects('car') FROM clip WHERE frame = {last}")
            yield db
    finally:
        shutil.rmtree(path.with_name(path.name + ".artifacts"), ignore_errors=True)
        path.unlink(missing_ok=True)


def _setting_name(setting: tuple[int, int]) -> str:
    threads, runs = setting
    return (f"{threads or 'default'} onnxruntime thread{'s' if threads != 1 else ''}, "
            f"{runs or 'one per core'} run{'s' if runs != 1 else ''} at once")


def _rates(n: int, wall: float, cpu: float) -> dict:
    return {"frames": n, "seconds": wall, "fps": n / wall, "cpu_ms_per_frame": 1000 * cpu / n}


@scenario("oracle", "exact YOLOX-Nano scan through vidql against a tight decode + letterbox + "
                    "session.run loop (per onnxruntime thread setting), throughput ratio")
def oracle(ctx: BenchContext) -> ScenarioResult:
    model = ctx.shared_dir / "models" / "yolox_nano.onnx" if ctx.shared_dir else None
    clip = ctx.shared_dir / "data" / "ua_detrac.mp4" if ctx.shared_dir else None
    if model is None or not (model.is_file() and clip.is_file()):
        return ScenarioResult(figures={"skipped": "needs ../shared (yolox_nano.onnx, ua_detrac.mp4)"})
    n = ctx.size(96, 240, tiny=16)
    raw, engine = {}, None
    fastest = lambda a, b: b if a is None or b["fps"] > a["fps"] else a  # noqa: E731
    rounds = ctx.size(ROUNDS, ROUNDS, tiny=1)
    for _ in range(rounds):  # side by side: a load spike hits every path
        for setting in SETTINGS:
            raw[setting] = fastest(raw.get(setting), raw_loop(model, clip, n, *setting))
        engine = fastest(engine, engine_scan(ctx, model, clip, n))
    sampled = sampled_query(ctx, model, ctx.size(200_000, 200_000, tiny=1500),
                            ctx.size(300, 600, tiny=16))
    best = max(raw, key=lambda t: raw[t]["fps"])
    ratio = engine["fps"] / raw[best]["fps"]
    rows = [{"path": f"raw loop, {_setting_name(s)}", **raw[s]} for s in SETTINGS]
    rows.append({"path": "vidql exact scan", **{k: engine[k] for k in rows[0] if k != "path"}})
    figures = {"raw": {_setting_name(s): raw[s] for s in SETTINGS},
               "best_raw": _setting_name(best),
               "engine": engine, "engine_over_best_raw": ratio, "sampled_query": sampled}
    return ScenarioResult(figures=figures, table=rows, notes=[
        f"vidql's exact scan runs at {ratio:.2f} of the best raw loop "
        f"({_setting_name(best)}), target >= 0.85",
        f"each path ran {rounds} times, in turn; its fastest run is shown",
        f"ORACLE BUDGET {sampled['oracle_calls']} aggregate over {sampled['frames']} traffic "
        f"frames (no index): {sampled['seconds']:.2f} s, of which "
        f"{sampled['outside_detector']:.0%} outside the detector, target <= 20%"])
