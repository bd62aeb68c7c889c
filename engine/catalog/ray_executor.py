"""The Ray executor: oracle labelling on Ray actors and index embedding in Ray tasks.

The catalog, the label cache and every statistic stay in this process (the driver). Actors
build the oracle once from its catalog entry and decode the frames they label themselves
from the video files (which must be on storage every node sees); only frame numbers go out
and detections come back. Embedding chunks run as Ray tasks that write their rows to .npy
files in a shared scratch folder. `ray` is optional: `pip install vidql[ray]`.
"""
from __future__ import annotations

import os
import sys
import time
import uuid
from collections import deque
from contextlib import closing
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from vidql.base.detections import DetectionArrays
from vidql.base.errors import OracleError, ParameterError, VidqlError
from vidql.base.ranges import Bounds
from vidql.engine.labels.oracle_api import Oracle
from vidql.engine.labels.oracle_kinds import make_oracle
from vidql.preprocess import frame_batches

EXECUTOR_ENV = "VIDQL_EXECUTOR"
INSTALL_HINT = "pip install 'vidql[ray]'"
AHEAD = 2          # batches queued on each actor, so it never waits for the driver
MAX_TRIES = 3      # attempts per batch when actors die under it
WORKERS = Bounds(1, 4096, whole=True)
NUM_GPUS = Bounds(0.0, 64.0)

# `locate(positions)` -> [(VideoInfo of a clip, local frame numbers, positions, clip name,
# whether it is the video's only clip)] for ascending positions (Catalog.locate)
Locate = Callable[[np.ndarray], list]


def executor_name(value: str | None) -> str:
    """The executor named by `value`, else by $VIDQL_EXECUTOR, else 'local'; checked."""
    name = value if value is not None else os.environ.get(EXECUTOR_ENV) or "local"
    if not isinstance(name, str) or not (name in ("local", "ray") or name.startswith("ray://")):
        raise ParameterError(f"executor must be 'local', 'ray' or 'ray://host:port', got {name!r}")
    return name


def import_ray():
    """The ray module, or a VidqlError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise VidqlError(f"the Ray executor needs the ray package, which is not installed: "
                         f"{INSTALL_HINT} (or use executor 'local')") from None
    return ray


def make_executor(value: str | None, workers: int | None = None) -> "RayExecutor | None":
    """None for the local executor, else a RayExecutor connected to its cluster."""
    name = executor_name(value)
    return None if name == "local" else RayExecutor(name, workers)


class RayExecutor:
    """Connects to (or starts) a Ray cluster; `workers` oracle actors and embedding tasks at a
    time (default: the cluster's CPUs, or its GPUs for an oracle with num_gpus)."""

    def __init__(self, name: str = "ray", workers: int | None = None):
        self.ray = import_ray()
        self.name = name
        self.workers = None if workers is None else WORKERS.check("executor workers", workers)
        if not self.ray.is_initialized():
            address = None if name == "ray" else name
            try:
                self.ray.init(address=address, include_dashboard=False, ignore_reinit_error=True,
                              log_to_driver=False)
            except Exception as exc:
                raise VidqlError(f"cannot connect to the Ray cluster {name!r}: {exc}; start one "
                                 f"with `ray start --head` or use executor 'local'") from None

    def __repr__(self) -> str:
        return f"RayExecutor({self.name!r}, workers={self.workers})"

    def slots(self, resource: str = "CPU", per_worker: float = 1.0) -> int:
        """How many workers to run: the setting, else what the cluster's resources hold."""
        if self.workers is not None:
            return self.workers
        return max(1, int(self.ray.cluster_resources().get(resource, 1) // max(per_worker, 1e-9)))

    def oracle(self, oracle: Oracle, entry: tuple, locate: Locate) -> "RayOracle":
        """`oracle` (built from catalog `entry` = (name, kind, source, options)) on actors."""
        return RayOracle(self, oracle, entry, locate)

    def embedding_map(self, source, scratch: Path):
        """A `chunk_map(fn, batch_size)` for the index's embedding passes over `source`
        (indexes.embedders.ChunkMap): about 4 chunks per worker, GOP-aligned on the batch
        grid, each a Ray task writing its rows under `scratch`."""
        keyframes = source_keyframes(source)

        def chunk_map(fn, batch_size: int):
            ranges = chunk_ranges(source.n_frames, batch_size, 4 * self.slots(), keyframes)
            return self.chunk_map(fn, ranges, scratch)

        return chunk_map

    def chunk_map(self, fn: Callable[[int, int], np.ndarray], ranges: list[tuple[int, int]],
                  scratch: Path) -> Iterator[tuple[int, int, np.ndarray]]:
        """Run `fn(start, stop)` for each range as a Ray task that saves its array under
        `scratch` (shared storage); yield (start, stop, array) in range order."""
        task = self.ray.remote(num_cpus=1)(save_chunk)
        fn_ref = self.ray.put(fn)  # sent once (it may hold a model), not once a chunk
        scratch.mkdir(parents=True, exist_ok=True)
        limit = self.slots()
        todo = deque(ranges)
        pending: dict = {}
        done: dict[int, tuple] = {}
        try:
            for start, _ in ranges:
                while todo and len(pending) < limit:
                    a, b = todo.popleft()
                    path = scratch / f"chunk-{a:012d}-{b:012d}-{uuid.uuid4().hex[:8]}.npy"
                    pending[task.remote(fn_ref, a, b, str(path))] = (a, b)
                while start not in done:
                    ready, _ = self.ray.wait(list(pending), num_returns=1)
                    a, b = pending.pop(ready[0])
                    try:
                        done[a] = (b, self.ray.get(ready[0]))
                    except self.ray.exceptions.RayTaskError as exc:
                        raise VidqlError(f"embedding frames {a}..{b - 1} failed on the Ray "
                                         f"cluster: {exc.cause!r}") from None
                b, path = done.pop(start)
                array = np.load(path)
                os.unlink(path)
                yield start, b, array
        finally:
            for ref in pending:
                self.ray.cancel(ref)


def save_chunk(fn: Callable[[int, int], np.ndarray], start: int, stop: int, path: str) -> str:
    """A Ray task's body: compute one chunk and save it (atomically) where the driver reads it."""
    array = np.asarray(fn(start, stop))
    tmp = f"{path}.tmp.npy"
    np.save(tmp, array)
    os.replace(tmp, path)
    return path


def source_keyframes(source) -> np.ndarray:
    """Keyframe positions of a frame source (LowResSource and ConcatSource have them);
    none known: empty."""
    return np.asarray(getattr(source, "keyframes", ()), dtype=np.int64)


def chunk_ranges(n_frames: int, batch_size: int, chunks: int, keyframes=()) -> list[tuple[int, int]]:
    """About `chunks` ranges covering [0, n_frames), each starting on the batch grid (so each
    chunk embeds the same batches as one pass over the video) at or just after a keyframe
    (so each decodes little before its start)."""
    starts = {0}
    keys = np.asarray(keyframes, dtype=np.int64)
    for target in np.linspace(0, n_frames, chunks + 1)[1:-1]:
        key = keys[np.abs(keys - target).argmin()] if len(keys) else int(target)
        starts.add(int(-(-key // batch_size) * batch_size))
    bounds = sorted(s for s in starts if s < n_frames) + [n_frames]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


class OracleWorker:
    """A Ray actor's state: the oracle built once from its catalog entry."""

    def __init__(self, entry: tuple, import_root: str | None):
        if import_root and import_root not in sys.path:  # a PYTHON oracle's module
            sys.path.append(import_root)  # after installed packages
        self.oracle = make_oracle(*entry)

    def identity(self) -> str:
        return self.oracle.identity

    def label(self, pieces: list, *infos) -> tuple[np.ndarray, DetectionArrays, float]:
        """Detections of the frames in `pieces` [(local frames, positions, clip name, only
        clip)] of the clips `infos` (VideoInfo each), decoded here; frames are reported by
        position. Returns (positions, detections, oracle seconds), the seconds without the
        oracle's one-time set-up (an ONNX detector's thread choice), which is no cost per
        frame."""
        found, seconds, setup = [], 0.0, self.oracle.setup_seconds
        for info, (local, positions, clip, only) in zip(infos, pieces, strict=True):
            shift = int(positions[0]) - int(local[0])  # a clip's positions are its frames + shift
            if not self.oracle.needs_pixels:
                t0 = time.perf_counter()
                det = self.oracle.detect_in_clip(None, np.asarray(local), clip, only)
                found.append(det.shifted(shift))
                seconds += time.perf_counter() - t0
                continue
            with closing(frame_batches(info, frames=np.asarray(local), batch_size=len(local))) as it:
                for ids, pixels in it:
                    t0 = time.perf_counter()
                    det = self.oracle.detect_in_clip(pixels, np.asarray(ids), clip, only)
                    found.append(det.shifted(shift))
                    seconds += time.perf_counter() - t0
        ids = np.concatenate([np.asarray(piece[1], dtype=np.int64) for piece in pieces])
        return ids, DetectionArrays.concat(found), seconds - (self.oracle.setup_seconds - setup)


def import_root(oracle: Oracle, entry: tuple) -> str | None:
    """The folder to put on an actor's sys.path so a PYTHON oracle's module imports there."""
    if entry[1].upper() != "PYTHON" or not oracle.sources:
        return None
    module = entry[2].partition(":")[0]
    source = Path(oracle.sources[0]).resolve()
    depth = module.count(".") + (1 if source.name == "__init__.py" else 0)
    return str(source.parents[depth])


class RayOracle(Oracle):
    """An oracle whose batches run on Ray actors. It has the wrapped oracle's identity, so
    its labels are the same cache entries; the label cache drives it through
    `detect_stream`, committing each batch as it comes back."""

    needs_pixels = False  # the actors decode their own frames

    def __init__(self, executor: RayExecutor, oracle: Oracle, entry: tuple, locate: Locate):
        self.executor, self.inner, self.locate = executor, oracle, locate
        self.name, self.identity, self.sources = oracle.name, oracle.identity, oracle.sources
        self.labels = oracle.labels
        self.batch_size, self.simulated_cost_ms = oracle.batch_size, oracle.simulated_cost_ms
        self.nearly_free = oracle.nearly_free  # labels ahead as it would in the driver
        options = dict(entry[3] or {})
        self.num_gpus = float(NUM_GPUS.check("oracle option num_gpus", options.get("num_gpus", 0)))
        self.entry = (entry[0], entry[1], entry[2], options)
        self.actors: list = []
        self._infos: dict[int, tuple] = {}  # id(VideoInfo) -> (it, its object ref)
        self.retried = 0  # batches resubmitted after an actor died

    def describe(self) -> str:
        return f"{self.inner.describe()} on {len(self.actors) or 'Ray'} actors"

    def detect(self, frames, frame_ids: np.ndarray) -> pd.DataFrame:
        """One batch (frames ignored: the actor decodes them)."""
        return DetectionArrays.concat([det for _, det, _ in self.detect_stream(
            frame_ids, len(frame_ids))]).to_frame()

    def batches(self, frames: np.ndarray, batch_size: int) -> list[list]:
        """Batches of at most `batch_size` frames, each within one clip, a new batch started
        at a GOP boundary once the current one is half full (so actors decode whole GOPs)."""
        out = []
        for info, local, positions, clip, only in self.locate(np.asarray(frames, dtype=np.int64)):
            gop = np.searchsorted(np.asarray(info.keyframes), local, side="right")
            start = 0
            for i in range(1, len(local) + 1):
                full = i - start >= batch_size
                if i == len(local) or full or (gop[i] != gop[i - 1] and 2 * (i - start) >= batch_size):
                    out.append([(info, local[start:i], positions[start:i], clip, only)])
                    start = i
        return out

    def detect_stream(self, frames: np.ndarray, batch_size: int) -> Iterator[tuple]:
        """Label `frames` on the actors, AHEAD batches queued on each; yield (positions,
        checked detections, oracle seconds) per batch as batches finish (any order). A batch
        whose actor dies is resubmitted to a fresh actor (at most MAX_TRIES times)."""
        ray = self.executor.ray
        self._start_actors()
        todo = deque((batch, 0) for batch in self.batches(frames, batch_size))
        pending: dict = {}  # ref -> (actor, batch, tries)
        try:
            while todo or pending:
                self._submit(todo, pending)
                ready, _ = ray.wait(list(pending), num_returns=1)
                actor, batch, tries = pending.pop(ready[0])
                try:
                    ids, det, seconds = ray.get(ready[0])
                except ray.exceptions.RayActorError as exc:
                    self._replace(actor, batch, tries, exc)
                    todo.appendleft((batch, tries + 1))
                    continue
                except ray.exceptions.RayTaskError as exc:
                    first = batch[0][2][0]
                    raise OracleError(f"oracle {self.name!r} failed on a Ray actor (frames from "
                                      f"{first}): {exc.cause!r}") from None
                yield ids, det, seconds  # checked by the label cache
        finally:
            for ref in pending:
                ray.cancel(ref)

    def _submit(self, todo: deque, pending: dict) -> None:
        load = {id(a): 0 for a in self.actors}
        for actor, _, _ in pending.values():
            load[id(actor)] = load.get(id(actor), 0) + 1
        for actor in self.actors:
            while todo and load[id(actor)] < AHEAD:
                batch, tries = todo.popleft()
                infos = [self._info_ref(piece[0]) for piece in batch]
                ref = actor.label.remote([piece[1:] for piece in batch], *infos)
                pending[ref] = (actor, batch, tries)
                load[id(actor)] += 1

    def _info_ref(self, info):
        """A clip's VideoInfo in the object store, put once (it holds every frame's pts)."""
        if id(info) not in self._infos:
            self._infos[id(info)] = (info, self.executor.ray.put(info))
        return self._infos[id(info)][1]

    def _replace(self, actor, batch: list, tries: int, exc: Exception) -> None:
        """An actor died: forget it and start another in its place (its queued batches
        come back as errors and are resubmitted too)."""
        if tries + 1 >= MAX_TRIES:
            raise OracleError(f"oracle {self.name!r}: Ray actors died {MAX_TRIES} times on the "
                              f"batch from frame {batch[0][2][0]}: {exc}") from None
        self.retried += 1
        if actor in self.actors:
            self.actors.remove(actor)
            self.actors.append(self._new_actor())

    def _new_actor(self):
        ray = self.executor.ray
        # no CPU held for the actor's lifetime (the index's embedding tasks need the CPUs
        # between labelling rounds); spread over the nodes instead
        cls = ray.remote(num_cpus=0, num_gpus=self.num_gpus,
                         scheduling_strategy="SPREAD")(OracleWorker)
        options = {k: v for k, v in self.entry[3].items() if k != "num_gpus"}
        return cls.remote((*self.entry[:3], options), import_root(self.inner, self.entry))

    def _start_actors(self) -> None:
        """Start the actors once and check each builds the oracle with this identity."""
        if self.actors:
            return
        ray = self.executor.ray
        count = (self.executor.slots("GPU", self.num_gpus) if self.num_gpus
                 else self.executor.slots())
        self.actors = [self._new_actor() for _ in range(count)]
        try:
            found = ray.get([a.identity.remote() for a in self.actors])
        except ray.exceptions.RayError as exc:
            self.actors = []
            raise OracleError(f"oracle {self.name!r} cannot be built on the Ray workers: "
                              f"{exc}") from None
        wrong = [f for f in found if f != self.identity]
        if wrong:
            self.close()
            raise OracleError(f"oracle {self.name!r} has identity {wrong[0]} on the Ray workers, "
                              f"not {self.identity}: its source differs there (it must be on "
                              f"storage every node sees)")

    def close(self) -> None:
        for actor in self.actors:
            self.executor.ray.kill(actor)
        self.actors = []
