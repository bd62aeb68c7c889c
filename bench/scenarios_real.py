"""Real video with the real detector: each approximate query kind against the exact scan of
the same clip, with YOLOX-Nano (ONNX) as the oracle, on the shared real clips and on an HD
long-GOP clip made from one (what surveillance cameras record: 1080p, a keyframe every
120 frames), loaded with the defaults (its 'auto' oracle rendition: short GOPs at the
detector's input size, written by the query whose file reads reach its cost), with that
rendition written at LOAD (oracle_rendition = 416: what 'auto' reads once written), and
read from its file (oracle_rendition = 'none'). Per query: wall seconds, oracle calls, the
decoder wait, EXPLAIN's forecast, and the physical limit (the labels' detector time plus
one in-order decode of the GOPs they touch)."""
from __future__ import annotations

import re
import shutil
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.frame import PictureType

import vidql
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import probe_video
from vidql.preprocess.rendition import ORACLE_GOP

from .plots import comparison_plot
from .registry import BenchContext, ScenarioResult, scenario

HD_GOP = 120
# (clip, the predicate it has in 3-30% of its frames)
CLIPS = (("hangzhou_junction_720p.mp4", "truck"), ("residential_street.mp4", "truck"))
HD_SOURCE = "residential_street.mp4"
# LOAD's oracle_rendition for the HD clip's other runs: YOLOX-Nano's input side, and none
WRITTEN, FILE_ONLY = 416, "none"
NEEDS_SHARED = "needs ../shared (yolox_nano.onnx, real clips)"


def queries(n: int, thing: str) -> list[tuple[str, str]]:
    """(kind, SQL) of each approximate kind over a clip `v` of `n` frames."""
    return [
        ("ERROR WITHIN", "SELECT AVG(objects('car')) FROM v ERROR WITHIN 0.5 SEED 1"),
        ("ORACLE BUDGET 5%", f"SELECT AVG(objects('car')) FROM v ORACLE BUDGET {max(n // 20, 10)} SEED 1"),
        ("LIMIT", f"SELECT frame FROM v WHERE objects('{thing}') >= 1 LIMIT 5 GAP 30 SEED 1"),
        ("RECALL TARGET", f"SELECT frame FROM v WHERE contains('{thing}') RECALL TARGET 90% "
                          f"ORACLE BUDGET {max(n // 10, 20)} SEED 1"),
        ("FIND RARE", f"SELECT frame FROM v WHERE contains('{thing}') FIND RARE "
                      f"ORACLE BUDGET {max(n // 20, 10)} SEED 1"),
    ]


def hd_long_gop(source: Path, cache: Path, frames: int, size: tuple[int, int]) -> Path:
    """`source`'s first `frames` frames upscaled to `size` as H.264 with a HD_GOP-frame GOP
    (B-frames as cameras use them), written once into `cache`."""
    out = cache / f"{source.stem}_{size[1]}p_gop{HD_GOP}_{frames}.mp4"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part.mp4")
    with FrameReader(source) as reader, av.open(str(tmp), "w") as container:
        rate = round(reader.info.fps) or 25
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "20",
                          "x264-params": f"keyint={HD_GOP}:min-keyint={HD_GOP}:scenecut=0:bframes=2"}
        for i, frame in reader.iter_range(0, min(frames, reader.info.frame_count)):
            big = frame.reformat(width=size[0], height=size[1], format="yuv420p")
            big.pict_type = PictureType.NONE  # the encoder places keyframes, not the source's
            big.pts, big.time_base = i, Fraction(1, rate)  # evenly, whatever the source's were
            container.mux(stream.encode(big))
        container.mux(stream.encode())
    tmp.rename(out)
    return out


def real_inputs(ctx: BenchContext) -> tuple[Path, Path, Path] | None:
    """(the YOLOX-Nano model, the shared data folder, the HD long-GOP clip made from
    HD_SOURCE) of the scenarios on real video; None without ../shared."""
    model = ctx.shared_dir / "models" / "yolox_nano.onnx" if ctx.shared_dir else None
    if model is None or not model.is_file():
        return None
    data = ctx.shared_dir / "data"
    hd = hd_long_gop(data / HD_SOURCE, ctx.cache_dir, ctx.size(905, 905, tiny=60),
                     ctx.size((1920, 1080), (1920, 1080), tiny=(640, 360)))
    return model, data, hd


def indexed_database(work: Path, clip: Path, model: Path, rendition: int | str | None) -> Path:
    """A database at work/base.db with `clip` as `v` (LOAD's oracle_rendition option
    `rendition`, if given), YOLOX-Nano as its oracle and a default TASTI index (whose build
    labels a few frames and times the oracle, and may write the clip's 'auto' rendition)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    path = work / "base.db"
    with vidql.connect(path, progress=False) as db:
        options = f" WITH (oracle_rendition = {rendition!r})" if rendition else ""
        db.sql(f"LOAD VIDEO '{clip}' AS v{options}; CREATE ORACLE yolox FROM ONNX '{model}'; "
               "SET ORACLE v = yolox; CREATE INDEX v_idx ON v USING TASTI")
    return path


def fresh_copy(base: Path, name: str) -> Path:
    """A copy of the database `base` (and its artifacts) under `name`, so that every query
    starts from the labels the index build left, none of another query's."""
    copy = base.with_name(f"{name}.db")
    shutil.rmtree(copy.with_name(copy.name + ".artifacts"), ignore_errors=True)
    shutil.copyfile(base, copy)
    shutil.copytree(base.with_name(base.name + ".artifacts"), copy.with_name(copy.name + ".artifacts"))
    return copy


def warm_up(db) -> None:
    """Load the detector (its one-time set-up) on a blank frame, as a long-lived process has
    it, so that no query pays for it."""
    oracle = db.labels("v").oracle
    info = db.catalog.clip_info("v", 0)
    oracle.detect(oracle.prepare(np.zeros((1, info.height, info.width, 3), np.uint8)), np.zeros(1, np.int64))


def measure(path: Path, sql: str) -> dict:
    """EXPLAIN, then the query, on the database at `path`: wall seconds, oracle calls, the
    decoder wait, the forecast, and the physical limit of the frames it labelled."""
    with vidql.connect(path, progress=False) as db:
        warm_up(db)
        plan = db.sql(f"EXPLAIN {sql}").df().iloc[0]
        before = db.labels("v").labelled_frames.copy()
        t0 = time.perf_counter()
        db.sql(sql).df()
        wall = time.perf_counter() - t0
        report = db.last_report
        new = np.setdiff1d(db.labels("v").labelled_frames, before)
        [cost] = db.catalog.read_costs("v", db.labels("v").oracle)
        ms = db.catalog.measured_ms_per_frame(db.labels("v").oracle.identity) or 0.0
    limit = len(new) * ms / 1000 + cost.seconds(cost.decoded_in_order(new), len(new))
    return {"operator": report.operator, "seconds": wall, "oracle_calls": int(report.oracle_calls),
            "decode_wait": float(report.seconds.get("decode", 0.0)),
            "oracle_seconds": float(report.oracle_seconds),
            "explain_seconds": float(plan["estimated_seconds"] or np.nan),
            "explain_decode_seconds": float(plan["estimated_decode_seconds"] or 0.0),
            "explain_calls": int(plan["estimated_oracle_calls"]),
            "explain_scan_seconds": float(plan["exact_scan_seconds"] or np.nan),
            "physical_limit": limit, "per_label": wall / max(int(report.oracle_calls), 1),
            "reads": "oracle rendition" if cost.keyframes.size > 1 and cost.keyframes[1] == ORACLE_GOP
                     else "file"}


def clip_rows(ctx: BenchContext, clip: Path, thing: str, model: Path,
              rendition: int | str | None = None) -> list[dict]:
    """The exact scan and every approximate kind on one clip, each on a fresh copy."""
    name = clip.stem + (f" (oracle_rendition {rendition})" if rendition else "")
    base = indexed_database(ctx.out_dir / "real" / name.replace(" ", "_"), clip, model, rendition)
    info = probe_video(clip)
    exact = measure(fresh_copy(base, "exact"), "SELECT AVG(objects('car')) FROM v")
    rows = [{"clip": name, "frames": info.frame_count, "size": f"{info.width}x{info.height}",
             "kind": "exact scan", **exact, "of_scan": 1.0, "label_cost_vs_scan": 1.0}]
    for i, (kind, sql) in enumerate(queries(info.frame_count, thing)):
        m = measure(fresh_copy(base, f"q{i}"), sql)
        rows.append({"clip": name, "frames": info.frame_count,
                     "size": f"{info.width}x{info.height}", "kind": kind, **m,
                     "of_scan": m["seconds"] / exact["seconds"],
                     "label_cost_vs_scan": m["per_label"] / exact["per_label"]})
    return rows


def plot(rows: list[dict], out: Path) -> list[str]:
    """Per clip: each kind's wall time beside EXPLAIN's forecast and the physical limit, as a
    share of the exact scan's wall time."""
    panels = {}
    for clip in dict.fromkeys(r["clip"] for r in rows):
        mine = [r for r in rows if r["clip"] == clip and r["kind"] != "exact scan"]
        scan = next(r["seconds"] for r in rows if r["clip"] == clip and r["kind"] == "exact scan")
        title = re.sub(r"^\w+?_(\d+p)_gop(\d+)_\d+", r"\1 GOP-\2 clip", clip)
        panels[f"{title}\n({mine[0]['size']}, {mine[0]['frames']} frames)"] = {
            label: {r["kind"]: [r[key] / scan] for r in mine}
            for key, label in (("seconds", "measured"), ("explain_seconds", "EXPLAIN"),
                               ("physical_limit", "physical limit"))}
    return comparison_plot(out, "real", "Approximate queries with YOLOX-Nano: wall seconds ÷ "
                           "the exact scan's", "wall seconds, query ÷ exact scan", panels,
                           reference_label="= exact scan", targets={"target 0.25": 0.25})


@scenario("real", "real clips and an HD long-GOP clip with the YOLOX-Nano detector: every "
                  "approximate kind's wall time, oracle calls, decoder wait and EXPLAIN forecast "
                  "beside the exact scan, and the physical limit")
def real(ctx: BenchContext) -> ScenarioResult:
    inputs = real_inputs(ctx)
    if inputs is None:
        return ScenarioResult(figures={"skipped": NEEDS_SHARED})
    model, data, hd = inputs
    clips = [(hd, "truck", None), (hd, "truck", WRITTEN), (hd, "truck", FILE_ONLY)]
    clips += [(data / c, t, None) for c, t in ctx.size(CLIPS, CLIPS, tiny=())]
    rows = [row for clip, thing, rendition in clips
            for row in clip_rows(ctx, clip, thing, model, rendition)]
    sampled = [r for r in rows if r["kind"] != "exact scan"]
    notes = [f"{r['clip']}: {r['kind']} {r['seconds']:.1f} s ({r['of_scan']:.2f} of the scan), "
             f"a label {r['label_cost_vs_scan']:.1f}x a scanned frame (reading its {r['reads']}), EXPLAIN "
             f"{r['explain_seconds'] / r['seconds']:.2f}x the wall time" for r in sampled]
    return ScenarioResult(figures={"rows": rows}, table=rows, plots=plot(rows, ctx.out_dir), notes=notes)
