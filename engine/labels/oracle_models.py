"""Built-in pixel oracles: ONNX YOLO detectors (onnxruntime) and torchvision detectors.
torch, torchvision and cv2 load when a detector first runs, not when a cached query builds it."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vidql.base.errors import OracleError
from vidql.base.detections import DetectionArrays, detections_frame
from vidql.engine.labels.oracle_api import COCO_CLASSES, Oracle, file_digest
from vidql.engine.labels.onnx_batch import free_batch
from vidql.base.ranges import BATCH_SIZE, Bounds
from vidql.preprocess.transforms import to_images

YOLO_INPUT_PAD = 114
SCORE = Bounds(0.0, 1.0)    # minimum detection confidence kept
NMS_IOU = Bounds(0.0, 1.0)  # IoU above which class-wise NMS drops the weaker box
THREAD_TRIALS = 4  # timed trials per thread setting when choosing one


def _class_wise_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                    iou: float) -> np.ndarray:
    """Indices kept by per-class greedy non-maximum suppression, by falling score (what
    torchvision's `batched_nms` keeps): a box goes when its IoU with a kept box of its
    class exceeds `iou`, computed in float32 as torchvision does. In numpy: importing
    torch for it cost each process 1.3-3.8 s, charged to the oracle's first batch."""
    if len(boxes) == 0:
        return np.zeros(0, dtype=np.int64)
    boxes = np.asarray(boxes, dtype=np.float32)
    order = np.argsort(-np.asarray(scores, dtype=np.float32), kind="stable")
    keep = np.zeros(len(boxes), dtype=bool)
    classes = np.asarray(classes)[order]
    for cls in np.unique(classes):
        idx = order[classes == cls]  # this class's boxes, by falling score
        b = boxes[idx]
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        w = np.maximum(np.minimum(b[:, None, 2], b[None, :, 2]) -
                       np.maximum(b[:, None, 0], b[None, :, 0]), np.float32(0))
        h = np.maximum(np.minimum(b[:, None, 3], b[None, :, 3]) -
                       np.maximum(b[:, None, 1], b[None, :, 1]), np.float32(0))
        inter = w * h
        over = np.triu(inter / (area[:, None] + area[None, :] - inter) > iou, 1)
        alive = np.ones(len(idx), dtype=bool)
        for k in range(len(idx)):
            if alive[k]:
                alive &= ~over[k]
        keep[idx[alive]] = True
    return order[keep[order]]


def _yolox_grids(size: int, strides=(8, 16, 32)) -> tuple[np.ndarray, np.ndarray]:
    grids, expanded = [], []
    for s in strides:
        n = size // s
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        expanded.append(np.full((n * n, 1), s))
    return np.concatenate(grids).astype(np.float32), np.concatenate(expanded).astype(np.float32)


class OnnxDetector(Oracle):
    """A YOLOX or YOLOv8 detector exported to ONNX, with class-wise NMS.

    It reads a video's oracle rendition (`reads_scaled`): frames resized to its input, whose
    boxes it scales back to the original frame's pixels.

    YOLOX: BGR, image at the top-left of a letterbox padded with 114, no normalisation,
    raw grid outputs (N×A×(5+C)). YOLOv8: RGB /255, centred letterbox, outputs N×(4+C)×A
    with decoded centre boxes and no objectness. `layout='auto'` tells them apart by shape.
    """

    reads_scaled = True

    def __init__(self, name: str, path: str | Path, *, score: float = 0.3, nms: float = 0.45,
                 layout: str = "auto", classes: list[str] | None = None, batch_size: int = 8):
        import onnxruntime as ort

        SCORE.check("ONNX option score", score)  # as given: the value is part of the identity
        NMS_IOU.check("ONNX option nms (an IoU threshold)", nms)
        batch_size = BATCH_SIZE.check("option batch_size", batch_size)
        path = Path(path)
        if not path.is_file():
            raise OracleError(f"ONNX model '{path}' not found")
        if layout not in ("auto", "yolox", "yolov8"):
            raise OracleError(f"layout must be auto, yolox or yolov8, not {layout!r}")
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                     if p in ort.get_available_providers()]
        try:
            self.session = ort.InferenceSession(str(path), providers=providers)
        except Exception as exc:
            raise OracleError(f"cannot load ONNX model '{path}': {exc}") from None
        self.path, self.providers = path, providers
        on_gpu = "CUDAExecutionProvider" in self.session.get_providers()
        # on the CPU, intra-op threads are chosen by measurement on the first batch
        self.threads_chosen = on_gpu
        self.runs, self._pool = 1, None  # network runs at once (threads of `_pool`)
        inp = self.session.get_inputs()[0]
        if len(inp.shape) != 4 or not all(isinstance(d, int) for d in inp.shape[2:]):
            raise OracleError(f"ONNX model '{path}' must take N×3×H×W images with fixed H, W; "
                              f"its input is {inp.shape}")
        if inp.shape[0] == 1 and on_gpu:
            edited = free_batch(path)  # a GPU runs a batch for little more than a frame
            if edited is not None:
                self.session = ort.InferenceSession(edited, providers=providers)
                inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_hw = (inp.shape[2], inp.shape[3])
        self.fixed_batch = inp.shape[0] if isinstance(inp.shape[0], int) else None
        # on the GPU every run has `batch_size` frames: each new input shape makes a CUDA
        # session search its convolution algorithms again (seconds for YOLOX-Nano)
        self.padded = self.fixed_batch is None and on_gpu
        self.name, self.score, self.nms, self.layout = name, score, nms, layout
        self.classes = classes or list(COCO_CLASSES)
        self.labels = tuple(self.classes)
        self.batch_size = batch_size
        self.identity = f"onnx:{name}:{file_digest(path)}:score={score}:nms={nms}"
        self._grids = _yolox_grids(self.input_hw[0]) if self.input_hw[0] == self.input_hw[1] else None
        # network input arrays free for the next batch: `prepare` may run on the decoding
        # thread while `detect` runs the previous batch, so each batch in flight has its
        # own, returned here after its run (kept: a fresh array costs its page faults)
        self._free_inputs: list[np.ndarray] = []
        self._known_layout = None if layout == "auto" else layout  # auto: after the first run

    def prepare(self, frames: np.ndarray) -> "Letterboxed":
        """The letterboxed network input of a batch (the model's layout, or YOLOX's until
        the first run tells): pixel work that runs ahead of inference."""
        return self._letterbox(frames, self._known_layout != "yolov8")

    def prepare_scaled(self, frames: np.ndarray, source_size: tuple[int, int]) -> "Letterboxed":
        """`prepare` for frames resized from frames of `source_size` (width, height): their
        boxes come back in the source's pixels."""
        return self._letterbox(frames, self._known_layout != "yolov8", source_size)

    def shrink(self, frames: np.ndarray) -> np.ndarray:
        """Each frame resized as the letterbox resizes it (uint8 N×h×w×3, h and w those of
        `shrunk_size`): what a query keeps of a frame decoded ahead."""
        import cv2

        height, width = frames.shape[1:3]
        size = self.shrunk_size(width, height)
        return np.stack([cv2.resize(np.ascontiguousarray(frame), size,
                                    interpolation=cv2.INTER_LINEAR) for frame in frames])

    def shrunk_size(self, width: int, height: int) -> tuple[int, int]:
        r = self._fit(height, width)
        return int(width * r), int(height * r)

    def prepare_shrunk(self, small: np.ndarray, frame_size: tuple[int, int]) -> "Letterboxed":
        return self._letterbox(small, self._known_layout != "yolov8", frame_size=frame_size)

    def _fit(self, height: int, width: int) -> float:
        """The letterbox's scale for a frame of this size."""
        th, tw = self.input_hw
        return min(th / height, tw / width)

    def _letterbox(self, frames: np.ndarray, yolox: bool,
                   source_size: tuple[int, int] | None = None,
                   frame_size: tuple[int, int] | None = None) -> "Letterboxed":
        """The network input, N×3×H×W float32 (YOLOX: BGR at the top-left of a letterbox
        padded with 114; YOLOv8: RGB centred, /255), and each frame's (scale, (left, top)).
        Each frame is resized (unless `shrink` did: then `frame_size` is the (width, height)
        it had), then written into a reused array with its channels in the model's order
        (the same pixels as reordering first, on far fewer of them)."""
        import cv2

        th, tw = self.input_hw
        try:
            spare = self._free_inputs.pop()
        except IndexError:
            spare = None
        if spare is None or len(spare) < len(frames):
            spare = np.empty((len(frames), 3, th, tw), dtype=np.float32)
        blobs = spare[:len(frames)]
        blobs.fill(YOLO_INPUT_PAD)
        geometry = []
        for blob, frame in zip(blobs, frames, strict=True):  # frames are RGB
            h, w = frame.shape[:2] if frame_size is None else frame_size[::-1]
            r = self._fit(h, w)
            nh, nw = int(h * r), int(w * r)
            resized = frame if frame.shape[:2] == (nh, nw) else cv2.resize(
                np.ascontiguousarray(frame), (nw, nh), interpolation=cv2.INTER_LINEAR)
            resized = resized.transpose(2, 0, 1)
            top, left = (0, 0) if yolox else ((th - nh) // 2, (tw - nw) // 2)
            blob[:, top:top + nh, left:left + nw] = resized[::-1] if yolox else resized
            geometry.append((r, (left, top)))
        if not yolox:
            blobs /= 255.0
        return Letterboxed(frames, spare, blobs, geometry, yolox, source_size, frame_size)

    def _decode(self, out: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
        """Centre boxes (A×4, input pixels) and class scores (A×C) of one image's anchors
        (YOLOX: of those whose objectness reaches `score`, the only ones whose class score
        can when class probabilities are at most 1, as the model's sigmoids make them)."""
        if layout == "yolox":
            if self._grids is None or len(self._grids[0]) != out.shape[0]:
                raise OracleError(f"oracle {self.name!r}: YOLOX output of {out.shape[0]} anchors "
                                  f"does not match a {self.input_hw} grid")
            grids, strides = self._grids
            if out[:, 5:].max(initial=0.0) <= 1.0:  # obj × p <= obj: exactly the same result
                kept = out[:, 4] >= self.score
                out, grids, strides = out[kept], grids[kept], strides[kept]
            xy = (out[:, :2] + grids) * strides
            wh = np.exp(out[:, 2:4]) * strides
            return np.concatenate([xy, wh], 1), out[:, 4:5] * out[:, 5:]
        out = out.T  # yolov8: (4+C)×A
        return out[:, :4], out[:, 4:]

    def _layout(self, out_shape: tuple) -> str:
        if self.layout != "auto":
            return self.layout
        a, b = out_shape[-2:]
        if b == len(self.classes) + 5 and a > b:
            return "yolox"
        if a == len(self.classes) + 4 and b > a:
            return "yolov8"
        raise OracleError(f"oracle {self.name!r}: cannot tell the ONNX output layout from shape "
                          f"{out_shape}; set layout = 'yolox' or 'yolov8'")

    def _choose_threads(self, blobs: np.ndarray) -> None:
        """Keep the setting that labels frames fastest here: one-thread runs, on one frame
        at a time or on as many at once as there are cores (onnxruntime releases the GIL,
        so they overlap: on 2 cores 1.5x the frames of one run, against 1.0-1.7x for two
        intra-op threads, whose split work stalls when decoding takes a core), or one
        run with one intra-op thread per core, or onnxruntime's default. Each setting
        labels one frame per core, twice to warm up and then THREAD_TRIALS times, judged
        by its best trial; the one-thread settings go first, as the idle threads of a
        multi-threaded session slow what runs after them. Within 10% of the fastest,
        fewer threads win: extra threads cost CPU that decoding needs. One-thread runs on
        every core count as fast within 25%: in a scan, where decoding takes turns with
        them, they beat intra-op threads by more than on these frames (YOLOX-Nano on 2
        cores: 95-102 against 72-89 frames/s in a scan, 14.5 against 16-19 ms here, where
        a noisy moment had the scan run on intra-op threads at 0.75 of the best)."""
        import onnxruntime as ort

        cores = os.cpu_count() or 1
        sessions = {0: self.session}
        for threads in sorted({1, cores}):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            sessions[threads] = ort.InferenceSession(str(self.path), options,
                                                     providers=self.providers)
        settings = list(dict.fromkeys([(1, 1), (1, cores), (cores, 1), (0, 1)]))
        frames = np.repeat(blobs[:1], cores, axis=0)
        best = {}
        for threads, runs in settings:
            self.session, self.runs = sessions[threads], runs
            times = []
            for _ in range(THREAD_TRIALS + 2):
                t0 = time.perf_counter()
                self._infer(frames)
                times.append(time.perf_counter() - t0)
            best[(threads, runs)] = min(times[2:])
        fast = [setting for setting in settings
                if best[setting] <= (1.25 if setting == (1, cores) else 1.1) * min(best.values())]
        # fewest threads in all (the default counts as more than any), then fewest intra-op
        threads, self.runs = min(fast, key=lambda s: ((s[0] or cores + 1) * s[1], s[0] or cores + 1))
        self.threads, self.session = threads, sessions[threads]
        self.threads_chosen = True

    def _run(self, blobs: np.ndarray) -> np.ndarray:
        if not self.threads_chosen:  # once: set-up, not a cost per frame
            start = time.perf_counter()
            self._choose_threads(blobs)
            self.setup_seconds += time.perf_counter() - start
        return self._infer(blobs)

    def _infer(self, blobs: np.ndarray) -> np.ndarray:
        """The network's output for `blobs`: a frame a run when its batch is fixed at 1; on
        the GPU, runs of `batch_size` frames (the last padded); else `runs` parts, with
        `runs` > 1 that many at once."""
        if self.fixed_batch not in (None, 1):
            return self.session.run(None, {self.input_name: blobs})[0]
        if self.padded:
            size, outputs = self.batch_size, []
            for start in range(0, len(blobs), size):
                part = blobs[start:start + size]
                if len(part) < size:
                    part = np.concatenate([part, np.zeros((size - len(part), *part.shape[1:]), part.dtype)])
                outputs.append(self.session.run(None, {self.input_name: part})[0])
            return np.concatenate(outputs)[:len(blobs)]
        step = 1 if self.fixed_batch == 1 else -(-len(blobs) // self.runs)
        parts = [blobs[start:start + step] for start in range(0, len(blobs), step)]
        run = lambda part: self.session.run(None, {self.input_name: part})[0]  # noqa: E731
        if self.runs == 1 or len(parts) == 1:
            return np.concatenate([run(part) for part in parts])
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.runs, thread_name_prefix="vidql-onnx")
        return np.concatenate(list(self._pool.map(run, parts)))

    def detect(self, frames, frame_ids: np.ndarray) -> pd.DataFrame:
        return self.detect_in_clip(frames, frame_ids, "", True).to_frame()

    def detect_in_clip(self, frames, frame_ids: np.ndarray, clip: str,
                       only_clip: bool) -> DetectionArrays:
        batch = frames if isinstance(frames, Letterboxed) else self.prepare(frames)
        try:
            outputs = self._run(batch.blobs)
            layout = self._layout(outputs.shape)
            if (layout == "yolox") != batch.yolox:  # `auto` guessed YOLOX for the first batch
                self._free_inputs.append(batch.spare)
                batch = self._letterbox(batch.frames, layout == "yolox", batch.source_size,
                                        batch.frame_size)
                outputs = self._run(batch.blobs)
        finally:
            self._free_inputs.append(batch.spare)
        self._known_layout = layout
        found = [self._detections(out, layout, batch.frame_hw(frame), *where, batch.source_size)
                 for frame, where, out in zip(batch.frames, batch.geometry, outputs, strict=True)]
        cls, conf, boxes = (np.concatenate([f[i] for f in found]) for i in range(3))
        return DetectionArrays(np.repeat(np.asarray(frame_ids, dtype=np.int64),
                                         [len(f[0]) for f in found]),
                               cls.astype(np.int32), tuple(self.classes),
                               np.column_stack([conf, boxes]))

    def _detections(self, out: np.ndarray, layout: str, hw: tuple[int, int], r: float,
                    offset: tuple[int, int], source_size: tuple[int, int] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(classes, scores, boxes in the frame's pixels, or in those of the frame of
        `source_size` (width, height) it was resized from) kept by NMS for one image."""
        centres, scores = self._decode(np.asarray(out, dtype=np.float32), layout)
        anchor, cls = np.nonzero(scores >= self.score)
        c = centres[anchor]
        boxes = np.stack([c[:, 0] - c[:, 2] / 2, c[:, 1] - c[:, 3] / 2,
                          c[:, 0] + c[:, 2] / 2, c[:, 1] + c[:, 3] / 2], 1)
        conf = scores[anchor, cls]
        keep = _class_wise_nms(boxes, conf, cls, self.nms)
        (h, w), (left, top) = hw, offset
        boxes = (boxes[keep] - [left, top, left, top]) / r
        if source_size is not None:
            sx, sy = source_size[0] / w, source_size[1] / h
            boxes, (w, h) = boxes * [sx, sy, sx, sy], source_size
        return cls[keep], conf[keep], np.clip(boxes, 0, [w, h, w, h]).reshape(-1, 4)


@dataclass
class Letterboxed:
    """A batch made ready for an ONNX detector (`OnnxDetector.prepare`): the frames, the
    network input `blobs` (a view of `spare`, the array it borrows), each frame's (scale,
    (left, top)), whether it is laid out for YOLOX, and the (width, height) of the frames
    they were resized from (`prepare_scaled`; None: boxes in the frames' own pixels), and
    the (width, height) the frames had before `shrink` (None: not shrunk)."""

    frames: np.ndarray
    spare: np.ndarray
    blobs: np.ndarray
    geometry: list[tuple]
    yolox: bool
    source_size: tuple[int, int] | None = None
    frame_size: tuple[int, int] | None = None

    def frame_hw(self, frame: np.ndarray) -> tuple[int, int]:
        """(height, width) of one of the frames as decoded (before `shrink`)."""
        return frame.shape[:2] if self.frame_size is None else self.frame_size[::-1]


class TorchvisionDetector(Oracle):
    """A torchvision detection model with weights from a local file or the torch hub cache.

    Weights are never downloaded and never random: a missing file is an OracleError."""

    def __init__(self, name: str, model: str, *, weights: str | None = None, score: float = 0.5,
                 batch_size: int = 4, device: str | None = None):
        import torch
        import torchvision
        from torchvision.models import detection

        SCORE.check("TORCHVISION option score", score)
        batch_size = BATCH_SIZE.check("option batch_size", batch_size)
        builder = getattr(detection, model, None)
        if builder is None or not callable(builder):
            raise OracleError(f"unknown torchvision detection model {model!r}")
        try:
            enum = torchvision.models.get_model_weights(model).DEFAULT
        except Exception as exc:
            raise OracleError(f"torchvision has no weights catalogue for {model!r}: {exc}") from None
        path = Path(weights) if weights else (
            Path(torch.hub.get_dir()) / "checkpoints" / Path(enum.url).name)
        if not path.is_file():
            raise OracleError(
                f"weights for {model!r} not found at '{path}': put the checkpoint there or pass "
                f"WITH (weights = 'file.pth'); vidql never downloads weights or uses random ones")
        self.categories = [c.replace(" ", "_") for c in enum.meta["categories"]]
        self.labels = tuple(self.categories)
        net = builder(weights=None, weights_backbone=None, num_classes=len(self.categories))
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            net.load_state_dict(state)
        except Exception as exc:
            raise OracleError(f"cannot load weights '{path}' into {model!r}: {exc}") from None
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.net = net.eval().to(self.device)
        self.name, self.score, self.batch_size = name, score, batch_size
        self.identity = f"torchvision:{model}:{file_digest(path)}:score={score}"
        self.sources = (path,)

    def detect(self, frames: np.ndarray, frame_ids: np.ndarray) -> pd.DataFrame:
        import torch

        with torch.inference_mode():
            outputs = self.net(list(to_images(frames, self.device).div_(255)))
        rows = []
        for frame_id, out in zip(frame_ids, outputs, strict=True):
            keep = out["scores"] >= self.score
            for box, label, s in zip(out["boxes"][keep].cpu().numpy(),
                                     out["labels"][keep].cpu().numpy(),
                                     out["scores"][keep].cpu().numpy(), strict=True):
                rows.append((int(frame_id), self.categories[int(label)], float(s), *map(float, box)))
        return detections_frame(rows)
