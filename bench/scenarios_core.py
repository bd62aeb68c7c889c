"""Core throughput scenarios: sequential decode and oracle frames per second."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from vidql.datasets import ensure_traffic
from vidql.engine.labels.oracle_kinds import make_oracle
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import probe_video

from .registry import BenchContext, ScenarioResult, scenario


def bench_videos(ctx: BenchContext, n_frames: int) -> list[Path]:
    """A synthetic 320×180 traffic video plus the real clips of ../shared/data."""
    videos = [Path(ensure_traffic(ctx.cache_dir, n_frames, seed=ctx.seed)[0])]
    if ctx.shared_dir is not None:
        videos += sorted(p for p in (ctx.shared_dir / "data").glob("*")
                         if p.suffix in (".mp4", ".avi"))
    return videos


@scenario("decode-only", "sequential decode to RGB at native size (frames/s), one thread")
def decode_only(ctx: BenchContext) -> ScenarioResult:
    rows = []
    for path in bench_videos(ctx, ctx.size(2000, 20000, tiny=100)):
        info = probe_video(path)
        t0 = time.perf_counter()
        with FrameReader(path, info) as reader:
            n = sum(len(ids) for ids, _ in reader.iter_batches(64))
        dt = time.perf_counter() - t0
        rows.append({"video": path.name, "size": f"{info.width}x{info.height}", "frames": n,
                     "frames_per_s": n / dt})
    return ScenarioResult(figures={"rows": rows}, table=rows)


@scenario("oracle-throughput", "oracle throughput: YOLOX-Nano (onnxruntime) and a LABELS oracle, frames/s")
def oracle_throughput(ctx: BenchContext) -> ScenarioResult:
    rows = []
    video, labels = ensure_traffic(ctx.cache_dir, ctx.size(2000, 2000, tiny=100), seed=ctx.seed)
    n = ctx.size(64, 512, tiny=16)
    candidates = [("labels (ground truth)", make_oracle("truth", "LABELS", str(labels)), video)]
    model = ctx.shared_dir / "models" / "yolox_nano.onnx" if ctx.shared_dir else None
    if model is not None and model.is_file():
        clip = ctx.shared_dir / "data" / "ua_detrac.mp4"
        candidates.append(("yolox_nano onnx", make_oracle("yolox", "ONNX", str(model)),
                           clip if clip.is_file() else video))
    for name, oracle, path in candidates:
        ids = np.arange(n, dtype=np.int64)
        with FrameReader(path) as reader:
            frames = reader.read(ids % reader.info.frame_count) if oracle.needs_pixels else None
        t0 = time.perf_counter()
        for start in range(0, n, oracle.batch_size):
            batch = slice(start, start + oracle.batch_size)
            oracle.detect(None if frames is None else frames[batch], ids[batch])
        dt = time.perf_counter() - t0
        rows.append({"oracle": name, "input": Path(path).name, "frames": n,
                     "frames_per_s": n / dt, "ms_per_frame": 1000 * dt / n})
    return ScenarioResult(figures={"rows": rows}, table=rows)
