"""Each GPU path of vidql against its CPU path, on one machine, in one run; JSON out.

    python scripts/gpu_check.py --clip CLIP --model YOLOX.onnx --out gpu_check.json

Checks: DALI decoding against PyAV (the clip, and an HD long-GOP clip made from it), the
ONNX oracle on CUDA against the CPU, the triplet embedder on CUDA against the CPU, FAISS on
the GPU against the CPU, the placement the runtime picks, and a whole session (LOAD, CREATE
INDEX, an exact and a sampled query) with the GPU against one with it hidden. A check that
fails records its error and the others still run; a path the machine lacks says why.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

CHECKS = {}


def check(fn):
    """Register a check; its exceptions become {"error": ...} in the report."""
    def run(*args, **kwargs):
        start = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:  # a report, not a crash: the other checks still run
            out = {"error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=6)[-2000:]}
        out["check_seconds"] = round(time.perf_counter() - start, 2)
        return out
    CHECKS[fn.__name__] = run
    return run


def hide_gpu() -> None:
    """Make this process see no GPU: torch, ONNX Runtime and FAISS take their CPU paths."""
    import onnxruntime as ort
    import torch

    torch.cuda.is_available = lambda: False
    cpu_only = [p for p in ort.get_available_providers() if p == "CPUExecutionProvider"]
    ort.get_available_providers = lambda: cpu_only
    import faiss

    faiss.get_num_gpus = lambda: 0


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


@check
def environment() -> dict:
    import torch

    out = {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "cuda": torch.cuda.is_available()}
    if out["cuda"]:
        out["gpu"] = torch.cuda.get_device_name(0)
    for name, probe in (("onnxruntime", lambda m: m.get_available_providers()),
                        ("nvidia.dali", lambda m: None), ("faiss", lambda m: m.get_num_gpus()),
                        ("av", lambda m: None), ("duckdb", lambda m: None)):
        try:
            module = __import__(name, fromlist=["_"])
            out[name] = {"version": getattr(module, "__version__", "?"), "detail": probe(module)}
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def cpu_batches(clip: Path, size=None):
    from vidql.preprocess import frame_batches

    return frame_batches(clip, size=size, batch_size=64)


def dali_batches(clip: Path, size=None):
    from vidql.preprocess.gpu import dali_frame_batches

    yield from dali_frame_batches(clip, size=size, batch_size=64)  # torch CUDA tensors
    sync()


def _decode(batches, keep: int) -> dict:
    """One pass: frames, seconds (and to the first batch: a DALI pipeline's build, NVDEC's
    start), the first `keep` frames and every frame number."""
    start, kept, numbers, first = time.perf_counter(), [], [], None
    for indices, batch in batches:
        if first is None:
            first, first_count = time.perf_counter() - start, len(indices)
        numbers.append(np.asarray(indices))
        if sum(len(k) for k in kept) < keep:
            kept.append(batch.cpu().numpy() if hasattr(batch, "cpu") else np.asarray(batch))
    seconds = time.perf_counter() - start
    numbers = np.concatenate(numbers)
    steady = (len(numbers) - first_count) / max(seconds - first, 1e-9)
    return {"frames": len(numbers), "fps": round(len(numbers) / seconds, 1),
            "fps_after_first_batch": round(steady, 1), "first_batch_seconds": round(first, 3),
            "kept": np.concatenate(kept)[:keep], "numbers": numbers}


@check
def decode(clip: Path, size=None) -> dict:
    """Full decode of `clip` (at `size` if given) by PyAV and by DALI: rate and agreement."""
    from vidql.preprocess import dali_available

    cpu = _decode(cpu_batches(clip, size), 16)
    out = {"clip": clip.name, "size": size, "frames": cpu["frames"], "cpu_fps": cpu["fps"]}
    if not dali_available():
        return out | {"dali": "unavailable (nvidia.dali not importable or no CUDA)"}
    gpu = _decode(dali_batches(clip, size), 16)
    a, b = cpu["kept"], gpu["kept"]
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)) if a.shape == b.shape else None
    return out | {"dali_frames": gpu["frames"], "dali_fps": gpu["fps"],
                  "dali_fps_after_first_batch": gpu["fps_after_first_batch"],
                  "dali_first_batch_seconds": gpu["first_batch_seconds"],
                  "dali_vs_cpu": round(gpu["fps"] / cpu["fps"], 2),
                  "same_frame_numbers": bool(np.array_equal(cpu["numbers"], gpu["numbers"])),
                  "first16_mean_abs_diff": None if diff is None else round(float(diff.mean()), 3),
                  "first16_p99_abs_diff": None if diff is None else float(np.percentile(diff, 99))}


def read_frames(clip: Path, n: int) -> np.ndarray:
    from vidql.preprocess import frame_batches

    return np.concatenate([b for _, b in frame_batches(clip, frames=np.arange(n), batch_size=64)])


def _detect_all(oracle, frames: np.ndarray) -> tuple[dict, dict]:
    """Seconds to detect every frame after a warm-up batch (in all, in `prepare`, and of the
    network alone run as often on one prepared batch) and per-frame label counts."""
    import pandas as pd

    step = oracle.batch_size
    oracle.detect(oracle.prepare(frames[:step]), np.arange(step))  # warm-up, thread choice
    start, rows, prepare = time.perf_counter(), [], 0.0
    for s in range(0, len(frames), step):
        t0 = time.perf_counter()
        ready = oracle.prepare(frames[s:s + step])
        prepare += time.perf_counter() - t0
        rows.append(oracle.detect(ready, np.arange(s, s + len(ready.frames))))
    total = time.perf_counter() - start
    unit = oracle.fixed_batch or step  # a model exported with batch 1 runs a frame at a time
    blobs = oracle.prepare(frames[:step]).blobs[:unit].copy()
    start = time.perf_counter()
    for _ in range(0, len(frames), unit):
        oracle.session.run(None, {oracle.input_name: blobs})
    network = time.perf_counter() - start
    n = len(frames)
    times = {"ms_per_frame": round(1000 * total / n, 3), "prepare_ms_per_frame": round(1000 * prepare / n, 3),
             "network_ms_per_frame": round(1000 * network / n, 3)}
    return times, pd.concat(rows).groupby(["frame", "label"]).size().to_dict()


@check
def onnx_oracle(clip: Path, model: Path, n: int) -> dict:
    """YOLOX-Nano on `n` frames with the CUDA provider and with the CPU's: ms a frame, and
    how often both give the same count of every class."""
    import onnxruntime as ort

    from vidql.engine.labels.oracle_models import OnnxDetector

    frames = read_frames(clip, n)
    out = {"frames": len(frames), "providers_available": ort.get_available_providers()}
    results = {}
    for batch in (8, 32):
        gpu = OnnxDetector("yolox", model, batch_size=batch)
        name = f"session_batch{batch}"
        out[f"{name}_providers"] = gpu.session.get_providers()
        out[f"{name}_input_batch"] = gpu.session.get_inputs()[0].shape[0]  # "batch": made free
        times, results[name] = _detect_all(gpu, frames)
        out |= {f"{name}_{k}": v for k, v in times.items()}
    if "CUDAExecutionProvider" not in out["session_batch8_providers"] and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # the CUDA and cuDNN libraries of the nvidia-* wheels
        out["after_preload_dlls_providers"] = OnnxDetector("yolox", model).session.get_providers()
    available = ort.get_available_providers
    ort.get_available_providers = lambda: ["CPUExecutionProvider"]
    try:
        cpu = OnnxDetector("yolox", model, batch_size=8)
    finally:
        ort.get_available_providers = available
    times, results["cpu"] = _detect_all(cpu, frames)
    out |= {f"cpu_{k}": v for k, v in times.items()}
    out["cpu_vs_session_batch8"] = round(out["cpu_ms_per_frame"] / out["session_batch8_ms_per_frame"], 2)
    out["cpu_vs_session_batch32"] = round(out["cpu_ms_per_frame"] / out["session_batch32_ms_per_frame"], 2)
    out["model_fixed_batch"] = cpu.fixed_batch
    for name in ("session_batch8", "session_batch32"):
        keys = set(results["cpu"]) | set(results[name])
        same = sum(results["cpu"].get(k) == results[name].get(k) for k in keys)
        out[f"{name}_same_class_counts_as_cpu"] = round(same / max(len(keys), 1), 4)
        out[f"{name}_detections"] = sum(results[name].values())
    out["cpu_detections"] = sum(results["cpu"].values())
    return out


@check
def onnx_any_batch(clip: Path, model: Path, batch: int = 32) -> dict:
    """The network alone, as vidql runs it on the GPU (its batch made free: `free_batch`), a
    batch at a time against a frame at a time: ms a frame, and the outputs' gap."""
    import onnxruntime as ort

    from vidql.engine.labels.oracle_models import OnnxDetector
    from vidql.engine.labels.onnx_batch import free_batch

    free = free_batch(model)
    if free is None:
        return {"error": "free_batch refused the model (or the onnx package is missing)"}
    blobs = OnnxDetector("yolox", model).prepare(read_frames(clip, batch)).blobs.copy()
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    session = ort.InferenceSession(free, providers=providers)
    name = session.get_inputs()[0].name
    out = {"providers": session.get_providers(), "batch": batch}
    for label, parts in (("one_frame_runs", [blobs[i:i + 1] for i in range(batch)]), ("batch_run", [blobs])):
        result = np.concatenate([session.run(None, {name: p})[0] for p in parts])  # warm-up
        sync()
        start = time.perf_counter()
        for _ in range(5):
            for p in parts:
                session.run(None, {name: p})
        out[f"{label}_ms_per_frame"] = round(1000 * (time.perf_counter() - start) / (5 * batch), 3)
        out[f"{label}_output"] = result
    out["max_abs_output_diff"] = float(np.abs(out.pop("one_frame_runs_output") - out.pop("batch_run_output")).max())
    return out


@check
def embedder(clip: Path, n: int) -> dict:
    """The TASTI embedder's network (64×36 frames): inference and training steps a second on
    CUDA and on the CPU, and how far their embeddings differ."""
    import torch

    from vidql.indexes.network import CompactCNN, to_tensor

    frames = np.concatenate([b for _, b in cpu_batches(clip, (64, 36))])[:n]
    torch.manual_seed(0)
    reference = CompactCNN(out_dim=128).eval()
    out, embeddings = {"frames": len(frames)}, {}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        model = CompactCNN(out_dim=128).to(device).eval()
        model.load_state_dict(reference.state_dict())
        with torch.inference_mode():
            model(to_tensor(frames[:256], device))
            sync()
            start = time.perf_counter()
            parts = [model(to_tensor(frames[s:s + 512], device)).cpu() for s in range(0, len(frames), 512)]
            sync()
        out[f"{device}_embed_fps"] = round(len(frames) / (time.perf_counter() - start), 1)
        embeddings[device] = torch.cat(parts).numpy()
        out[f"{device}_train_steps_per_s"] = _train_rate(model.train(), frames, device)
    if "cuda" in embeddings:
        out["cuda_vs_cpu_embed"] = round(out["cuda_embed_fps"] / out["cpu_embed_fps"], 2)
        out["cuda_vs_cpu_train"] = round(out["cuda_train_steps_per_s"] / out["cpu_train_steps_per_s"], 2)
        out["embedding_max_abs_diff"] = float(np.abs(embeddings["cuda"] - embeddings["cpu"]).max())
    else:
        out["cuda"] = "unavailable"
    return out


def _train_rate(model, frames: np.ndarray, device: str, steps: int = 20, batch: int = 128) -> float:
    import torch

    from vidql.indexes.network import to_tensor

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = to_tensor(frames[:batch], device)
    for i in range(steps + 2):
        if i == 2:
            sync()
            start = time.perf_counter()
        loss = model(x).square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    sync()
    return round(steps / (time.perf_counter() - start), 1)


@check
def faiss_knn(n_queries: int, n_base: int) -> dict:
    """vidql's k-NN (`nearest`) as installed against FAISS's CPU index, on random vectors."""
    import faiss

    from vidql.indexes.neighbours import nearest

    rng = np.random.default_rng(0)
    queries = rng.standard_normal((n_queries, 128), dtype=np.float32)
    base = rng.standard_normal((n_base, 128), dtype=np.float32)
    gpus = faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0
    nearest(queries[:1000], base, 8)  # warm-up (GPU resources)
    start = time.perf_counter()
    dist, pos = nearest(queries, base, 8)
    vidql_seconds = time.perf_counter() - start
    index = faiss.IndexFlatL2(128)
    index.add(base)
    start = time.perf_counter()
    _, cpu_pos = index.search(queries, 8)
    cpu_seconds = time.perf_counter() - start
    return {"faiss_gpus": gpus, "queries": n_queries, "base": n_base,
            "vidql_nearest_seconds": round(vidql_seconds, 3), "faiss_cpu_seconds": round(cpu_seconds, 3),
            "cpu_vs_vidql": round(cpu_seconds / vidql_seconds, 2),
            "same_first_neighbour_share": round(float((pos[:, 0] == cpu_pos[:, 0]).mean()), 4)}


@check
def placement(clip: Path) -> dict:
    """The placement the runtime picks for the embedder's input, the rates it measured, and
    what it warned of."""
    import warnings

    from vidql.preprocess import Normalize, cuda_available, dali_available, plan_placement

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = plan_placement(clip, (64, 36), normalize=Normalize((0.5,) * 3, (0.25,) * 3))
    return {"clip": clip.name, "cuda": cuda_available(), "dali": dali_available(), "chosen": chosen.name,
            "predicted_fps": round(chosen.predicted_fps, 1),
            "rates_fps": {k: round(v, 1) for k, v in chosen.stage_fps.items()},
            "warnings": [str(w.message) for w in caught]}


@check
def session(clip: Path, model: Path, work: Path, hidden: bool) -> dict:
    """A whole session in a child process, with the GPU visible or hidden: seconds of each
    statement and the answers."""
    out_file = work / f"session_{'cpu' if hidden else 'gpu'}.json"
    cmd = [sys.executable, __file__, "--session", "--clip", str(clip), "--model", str(model),
           "--work", str(work), "--out", str(out_file)] + (["--hide-gpu"] if hidden else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}", "stderr": done.stderr[-3000:]}
    return json.loads(out_file.read_text())


def run_session(clip: Path, model: Path, work: Path, hidden: bool) -> dict:
    if hidden:
        hide_gpu()
    import vidql

    db_dir = Path(tempfile.mkdtemp(dir=work))
    steps = [("load", f"LOAD VIDEO '{clip}' AS v"),
             ("oracle", f"CREATE ORACLE yolox FROM ONNX '{model}'; SET ORACLE v = yolox"),
             ("create_index", "CREATE INDEX v_idx ON v USING TASTI"),
             ("error_within", "SELECT AVG(objects('car')) FROM v ERROR WITHIN 0.5 SEED 1"),
             ("exact_scan", "SELECT AVG(objects('car')) FROM v")]
    out = {"gpu_hidden": hidden}
    with vidql.connect(db_dir / "s.db", progress=False) as db:
        for name, sql in steps:
            start = time.perf_counter()
            result = db.sql(sql)
            out[f"{name}_seconds"] = round(time.perf_counter() - start, 2)
            if name in ("error_within", "exact_scan"):
                out[f"{name}_answer"] = str(result.fetchall()[0])
        out["oracle_providers"] = db.labels("v").oracle.session.get_providers()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--frames", type=int, default=512, help="frames for the oracle and embedder checks")
    ap.add_argument("--hd-frames", type=int, default=905, help="frames of the HD long-GOP clip (0: none)")
    ap.add_argument("--session", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hide-gpu", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.session:
        args.out.write_text(json.dumps(run_session(args.clip, args.model, work, args.hide_gpu)))
        return 0
    report = {}

    def record(name, value):  # written after each check: a run cut short keeps what it measured
        report[name] = value
        args.out.write_text(json.dumps(report, indent=1, default=str))
        print(name, json.dumps(value, default=str), flush=True)

    record("environment", CHECKS["environment"]())
    decodes = [CHECKS["decode"](args.clip), CHECKS["decode"](args.clip, (64, 36))]
    record("decode", decodes)
    hd = None
    if args.hd_frames:
        from vidql.bench.scenarios_real import hd_long_gop

        hd = hd_long_gop(args.clip, work, args.hd_frames, (1920, 1080))
        record("decode", decodes + [CHECKS["decode"](hd), CHECKS["decode"](hd, (64, 36))])
    record("onnx_oracle", CHECKS["onnx_oracle"](args.clip, args.model, args.frames))
    record("onnx_any_batch", CHECKS["onnx_any_batch"](args.clip, args.model))
    record("embedder", CHECKS["embedder"](args.clip, args.frames))
    record("faiss", CHECKS["faiss_knn"](200_000, 2_000))
    record("placement", [CHECKS["placement"](args.clip)] + ([CHECKS["placement"](hd)] if hd else []))
    record("session_gpu", CHECKS["session"](args.clip, args.model, work, hidden=False))
    record("session_cpu", CHECKS["session"](args.clip, args.model, work, hidden=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
