"""Oracle renditions on real video: how often YOLOX-Nano's per-class counts on a clip's
oracle rendition (LOAD VIDEO ... WITH (oracle_rendition = 416)) equal those on the original,
what the rendition costs on disk, what a random single-frame read costs on each, and
whether a video loaded with the default (oracle_rendition = 'auto') writes it: the cost
model's estimated read speed-up beside the measured one."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from vidql.engine.labels.oracle_models import OnnxDetector
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import probe_video
from vidql.preprocess.readcost import ReadCost, measure_decode, rendition_cost, rendition_pays
from vidql.preprocess.rendition import ORACLE_GOP, Rendition, make_oracle_rendition

from .registry import BenchContext, ScenarioResult, scenario
from .scenarios_real import NEEDS_SHARED, WRITTEN, real_inputs

CLIPS = ("ua_detrac.mp4", "highway.avi", "indoor_people.mp4", "residential_street.mp4",
         "hangzhou_junction_720p.mp4")
AGREEMENT = 0.98  # the share of frames with equal counts that a default rendition needs


def class_counts(oracle, frames: np.ndarray, source_size=None) -> np.ndarray:
    """Per-frame detection counts by class (N×classes) of `oracle` on `frames`, through the
    engine's path: `prepare` (or `prepare_scaled` for rendition frames) then detection."""
    counts = np.zeros((len(frames), len(oracle.classes)), dtype=np.int64)
    for start in range(0, len(frames), 8):
        part = frames[start:start + 8]
        batch = oracle.prepare(part) if source_size is None else oracle.prepare_scaled(part, source_size)
        found = oracle.detect_in_clip(batch, np.arange(len(part)), "", True)
        np.add.at(counts, (start + found.frame, found.codes), 1)
    return counts


def random_reads(path: Path, info, frames: np.ndarray) -> tuple[float, float]:
    """(seconds, frames decoded) per single-frame read of `frames`, one reader, in turn."""
    with FrameReader(path, info) as reader:
        reader.read([0])  # open the file and the decoder first
        decoded = reader.decoded
        start = time.perf_counter()
        for frame in frames:
            reader.read([int(frame)])
        seconds = time.perf_counter() - start
        return seconds / len(frames), (reader.decoded - decoded) / len(frames)


def oracle_rendition(clip: Path, cache: Path):
    """The clip's oracle rendition at WRITTEN (YOLOX-Nano's input side), made once into
    `cache`."""
    folder = cache / f"oracle_rendition_{clip.stem}_{WRITTEN}"
    try:
        return Rendition.load(folder)
    except Exception:  # noqa: BLE001 - absent or partial: make it
        return make_oracle_rendition(clip, folder, WRITTEN)


def clip_row(ctx: BenchContext, clip: Path, oracle) -> dict:
    """Agreement, disk and random-read figures of one clip."""
    info = probe_video(clip)
    t0 = time.perf_counter()
    rendition = oracle_rendition(clip, ctx.cache_dir)
    made = time.perf_counter() - t0
    n = info.frame_count
    sample = np.unique(np.linspace(0, n - 1, min(n, ctx.size(96, n, tiny=8))).astype(np.int64))
    with FrameReader(clip, info) as reader:
        original = class_counts(oracle, reader.read(sample))
    with rendition.open() as reader:
        small = class_counts(oracle, reader.read(sample), (info.width, info.height))
    reads = np.random.default_rng(ctx.seed).integers(0, n, ctx.size(12, 40, tiny=3))
    orig_s, orig_decoded = random_reads(clip, info, reads)
    rend_s, rend_decoded = random_reads(rendition.path, rendition.info, reads)
    orig_bytes = clip.stat().st_size / n
    rend_bytes = rendition.path.stat().st_size / n
    return {"clip": clip.stem, "size": f"{info.width}x{info.height}",
            "rendition": f"{rendition.width}x{rendition.height}", "gop": _gop(info),
            "frames_compared": len(sample),
            "equal_counts": float((original == small).all(axis=1).mean()),
            "kb_per_frame_original": orig_bytes / 1024, "kb_per_frame_rendition": rend_bytes / 1024,
            "disk_ratio": rend_bytes / orig_bytes,
            "random_read_ms_original": 1000 * orig_s, "random_read_ms_rendition": 1000 * rend_s,
            "decoded_per_read_original": orig_decoded, "decoded_per_read_rendition": rend_decoded,
            "read_speedup": orig_s / rend_s, "make_seconds": made, **auto_choice(info, oracle)}


def auto_choice(info, oracle) -> dict:
    """The cost model's estimate of the read speed-up, and whether 'auto' writes the
    rendition (from a fresh decode timing of the clip, as LOAD takes it)."""
    cost = ReadCost.of(info, measure_decode(info))
    size = (int(info.width), int(info.height))
    small = rendition_cost(cost, size, oracle.shrunk_size(*size), ORACLE_GOP)
    return {"estimated_speedup": cost.random_read_seconds() / small.random_read_seconds(),
            "auto_writes": rendition_pays(cost, small)}


def _gop(info) -> float:
    """A clip's mean GOP length in frames."""
    return info.frame_count / max(len(info.keyframes), 1)


@scenario("rendition", "oracle renditions (LOAD VIDEO ... WITH (oracle_rendition = 416): lossless "
                       "H.264 RGB, a keyframe every 8 frames) of the shared real clips and the HD "
                       "long-GOP clip: the share of frames whose YOLOX-Nano per-class counts "
                       "(score 0.3) equal the original's, disk per frame, and one random "
                       "single-frame read (FrameReader) on each")
def rendition(ctx: BenchContext) -> ScenarioResult:
    inputs = real_inputs(ctx)
    if inputs is None:
        return ScenarioResult(figures={"skipped": NEEDS_SHARED})
    model, data, hd = inputs
    clips = [hd] + [data / c for c in ctx.size(CLIPS, CLIPS, tiny=()) if (data / c).is_file()]
    oracle = OnnxDetector("yolox", model, score=0.3)
    rows = [clip_row(ctx, clip, oracle) for clip in clips]
    worst = min(r["equal_counts"] for r in rows)
    notes = [f"{r['clip']}: {100 * r['equal_counts']:.1f}% of {r['frames_compared']} frames with "
             f"equal per-class counts; {r['kb_per_frame_rendition']:.0f} KB a frame on disk, "
             f"{r['disk_ratio']:.1f}x the original's; a random read {r['random_read_ms_rendition']:.1f} "
             f"ms against {r['random_read_ms_original']:.1f} ms ({r['read_speedup']:.1f}x; the "
             f"cost model's estimate {r['estimated_speedup']:.1f}x: 'auto' "
             f"{'writes it' if r['auto_writes'] else 'reads the file'})"
             for r in rows]
    notes.append(f"lowest agreement {100 * worst:.1f}% ({'meets' if worst >= AGREEMENT else 'misses'} "
                 f"the {100 * AGREEMENT:.0f}% a default rendition needs); the rendition holds the "
                 f"letterbox's own pixels (lossless), so any disagreement is the box mapping's")
    return ScenarioResult(figures={"rows": rows, "lowest_agreement": worst}, table=rows,
                          notes=notes)
