"""The pipelined preprocessing runtime (after Smol): decode → transform → batch → consumer.

Stages run concurrently in threads joined by bounded queues, so the slowest stage sets the
pace and no stage runs ahead of the others by more than a few batches (backpressure):

* decoders (several; PyAV releases the GIL) each take a GOP-aligned chunk of one video,
  decode it with a single-threaded decoder and convert every frame (crop, resize, pixel
  format) inside swscale (`FrameSpec`);
* the batcher reads the chunks back in frame order and cuts fixed-size batches (a batch
  never spans two videos);
* transform workers apply a batch transform (e.g. `Normalize`, on CPU or GPU);
* the consumer is the caller: it iterates `Pipeline` or hands a callable to `run_pipeline`.

Output order is always frame order, whatever the number of workers. The first failure of
any stage stops every stage and is raised to the caller: a `VidqlError` (a corrupt video,
a failing oracle) as itself with a note saying where, anything else wrapped in
`PipelineError`, naming the stage, the video and the frames. Ctrl-C, an exception in the
consumer or leaving the loop early shuts all threads down before control returns.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from vidql.engine.errors import ParameterError, VidqlError
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import VideoInfo, probe_video
from vidql.preprocess.rendition import Rendition, RenditionReader, rendition_positions
from vidql.preprocess.transforms import FrameSpec

_POLL = 0.05  # seconds a blocked thread waits before checking whether to stop
_END = object()


class PipelineError(RuntimeError):
    """A stage failed; says which stage, which video and which frames, and chains the cause."""

    def __init__(self, stage: str, path: str, frames: tuple[int, int] | None, cause: BaseException):
        self.stage, self.path, self.frames, self.cause = stage, path, frames, cause
        where = "" if frames is None else f" frames {frames[0]}..{frames[1]} of"
        super().__init__(f"{stage} failed on{where} '{path}': {type(cause).__name__}: {cause}")


@dataclass
class Batch:
    """Consecutive output frames of one video: original frame numbers and the frames."""

    source: str
    indices: np.ndarray
    frames: Any  # uint8 N×H×W×C numpy array, or what the transform made of it

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, eq=False)
class Source:
    """One video as the pipeline sees it: the file to decode and how its frames are numbered."""

    path: str  # the file decoded (the rendition file for a rendition)
    info: VideoInfo
    name: str  # the video the user knows (the original for a rendition)
    rendition: Rendition | None = None

    @property
    def frame_count(self) -> int:
        return self.info.frame_count

    def reader(self, threads: int, interpolation: str = "AREA", options: dict | None = None) -> FrameReader:
        return FrameReader(self.path, self.info, threads=threads, interpolation=interpolation, options=options)

    def to_original(self, positions: np.ndarray) -> np.ndarray:
        return positions if self.rendition is None else self.rendition.frames[positions]

    def to_positions(self, frames: np.ndarray) -> np.ndarray:
        """Own frame positions of original frame numbers (range-checked)."""
        if self.rendition is not None:
            return rendition_positions(self.rendition, frames)
        bad = frames[(frames < 0) | (frames >= self.frame_count)]
        if len(bad):
            raise VidqlError(f"frame {int(bad[0])} is out of range for '{self.name}', "
                             f"which has frames 0..{self.frame_count - 1}")
        return frames


def as_source(source) -> Source:
    """A path, VideoInfo, Rendition, RenditionReader, FrameReader or Source as a pipeline Source."""
    if isinstance(source, Source):
        return source
    if isinstance(source, RenditionReader):
        source = source.rendition
    if isinstance(source, Rendition):
        return Source(str(source.path), source.info, source.source, source)
    if isinstance(source, FrameReader):
        return Source(source.path, source.info, source.path)
    if isinstance(source, VideoInfo):
        return Source(source.path, source, source.path)
    if isinstance(source, (str, os.PathLike)):
        info = probe_video(source)
        return Source(str(source), info, str(source))
    raise ParameterError(f"cannot read frames from a {type(source).__name__}; give a path, "
                         f"VideoInfo or Rendition")


@dataclass(frozen=True)
class _Chunk:
    seq: int
    source: int
    targets: Sequence[int]  # own frame positions, ascending


def plan_chunks(sources: Sequence[Source], frames: Sequence[np.ndarray | None], chunk_frames: int
                ) -> list[_Chunk]:
    """Cut the work into GOP-aligned chunks of about `chunk_frames` frames, in output order."""
    chunks: list[_Chunk] = []
    for s, (source, wanted) in enumerate(zip(sources, frames)):
        keyframes = np.asarray(source.info.keyframes, dtype=np.int64)
        if wanted is None:
            bounds = [0]
            for k in keyframes[1:]:
                if k - bounds[-1] >= chunk_frames:
                    bounds.append(int(k))
            bounds.append(source.frame_count)
            for a, b in zip(bounds, bounds[1:]):
                chunks.append(_Chunk(len(chunks), s, range(a, b)))
            continue
        if len(wanted) == 0:
            continue
        gops = np.searchsorted(keyframes, wanted, side="right") - 1
        start = 0
        for i in range(1, len(wanted) + 1):
            if i == len(wanted) or (i - start >= chunk_frames and gops[i] != gops[i - 1]):
                chunks.append(_Chunk(len(chunks), s, wanted[start:i].tolist()))
                start = i
    return chunks


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Pipeline:
    """Frames of one or more videos, decoded in parallel and delivered as ordered `Batch`es.

    sources: paths / VideoInfos / Renditions; frames: None for every frame, or per source an
    array of (original) frame numbers, delivered ascending and without duplicates;
    spec: per-frame crop/resize/format (or `size` for just a resize); transform: a callable
    on each uint8 batch (e.g. `Normalize()`, or a GPU transform); workers: decoder threads;
    max_batches: how many batches may wait between stages; decoder_options: FFmpeg decoder
    options such as {"skip_loop_filter": "all"} (faster, no longer frame-exact).
    """

    def __init__(self, sources, *, size: tuple[int, int] | None = None, spec: FrameSpec | None = None,
                 batch_size: int = 64, frames=None, transform: Callable | None = None,
                 workers: int | None = None, transform_workers: int = 1, max_batches: int = 4,
                 chunk_frames: int | None = None, memory_budget: int = 512 << 20,
                 decoder_options: dict[str, str] | None = None):
        if batch_size < 1:
            raise ParameterError(f"batch_size must be at least 1, got {batch_size}")
        single = not isinstance(sources, (list, tuple))
        self.sources = [as_source(s) for s in ([sources] if single else sources)]
        if not self.sources:
            raise ParameterError("the pipeline needs at least one video")
        if frames is None:
            wanted = [None] * len(self.sources)
        elif single:
            wanted = [frames]
        else:
            wanted = list(frames)
            if len(wanted) != len(self.sources):
                raise ParameterError("frames needs one entry (array or None) per source")
        self.frames = [None if w is None else
                       src.to_positions(np.unique(np.asarray(w, dtype=np.int64).reshape(-1)))
                       for src, w in zip(self.sources, wanted)]
        if spec is None:
            spec = FrameSpec(size=tuple(size) if size is not None else None)
        elif size is not None:
            raise ParameterError("give either size or spec, not both")
        for src in self.sources:
            spec.check_crop(src.info.width, src.info.height, src.name)
        self.spec = spec
        self.batch_size = int(batch_size)
        self.transform = transform
        self.decoder_options = dict(decoder_options or {})
        self.workers = max(1, int(workers or _cpu_count()))
        self.transform_workers = max(1, int(transform_workers))
        self.max_batches = max(1, int(max_batches))
        frame_bytes = max(self._frame_bytes(src) for src in self.sources)
        if chunk_frames is None:
            # a few chunks per worker, each small enough to be buffered whole within the budget
            total = sum(src.frame_count if w is None else len(w) for src, w in zip(self.sources, self.frames))
            chunk_frames = min(max(total // (4 * self.workers), 1), 1024,
                               max(memory_budget // (2 * self.workers * frame_bytes), 1))
        self.chunks = plan_chunks(self.sources, self.frames, int(chunk_frames))
        self._piece = max(1, min(self.batch_size, 16))
        self._chunk_queue_len = max(2, memory_budget // (2 * self.workers * frame_bytes * self._piece))
        # one FFmpeg thread per decoder when the chunks spread evenly over the workers; else
        # (few or uneven GOPs) let FFmpeg thread each decoder itself
        sizes = [len(chunk.targets) for chunk in self.chunks]
        even = len(self.chunks) >= self.workers and max(sizes) * self.workers <= 1.5 * sum(sizes)
        self.decoder_threads = 1 if even else 0
        self.workers = min(self.workers, max(1, len(self.chunks)))
        self._decoded = [0] * self.workers  # frames decoded and converted, per decoder
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._started = False
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()

    def _frame_bytes(self, source: Source) -> int:
        width, height = self.spec.output_size(source.info.width, source.info.height)
        return width * height * self.spec.channels

    # -- public --------------------------------------------------------------------
    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[Batch]:
        if self._started:
            raise RuntimeError("a Pipeline can be iterated once")
        self._start()
        try:
            yield from self._ordered_output()
        finally:
            self.close()

    def close(self) -> None:
        """Stop every stage and wait for its thread to end."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    @property
    def decoded_frames(self) -> int:
        """Frames the decoders have produced so far."""
        return sum(self._decoded)

    @property
    def total_frames(self) -> int:
        return sum(len(c.targets) for c in self.chunks)

    # -- stages --------------------------------------------------------------------
    def _start(self) -> None:
        self._started = True
        self._chunk_queues = [queue.Queue(self._chunk_queue_len) for _ in self.chunks]
        self._next_chunk = 0
        self._chunk_lock = threading.Lock()
        self._in_flight = threading.Semaphore(self.workers + 1)
        self._batches: queue.Queue = queue.Queue(self.max_batches)
        self._results: dict[int, Any] = {}
        self._results_cond = threading.Condition()
        self._result_slots = threading.Semaphore(self.max_batches + self.transform_workers)
        for w in range(self.workers):
            self._spawn(self._decoder, f"vidql-decode-{w}", w)
        self._spawn(self._batcher, "vidql-batch")
        for w in range(self.transform_workers):
            self._spawn(self._transformer, f"vidql-transform-{w}")

    def _spawn(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=self._guard, args=(target, *args), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guard(self, target, *args) -> None:
        try:
            target(*args)
        except BaseException as exc:  # recorded and raised in the caller's thread
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._error_lock:
            if self._error is None:
                self._error = exc
        self._stop.set()
        with self._results_cond:
            self._results_cond.notify_all()

    def _put(self, q: queue.Queue, item) -> bool:
        """Put with backpressure; False when the pipeline is stopping."""
        while not self._stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue):
        """Get, or _END when the pipeline is stopping."""
        while not self._stop.is_set():
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                continue
        return _END

    def _acquire(self, semaphore: threading.Semaphore) -> bool:
        while not self._stop.is_set():
            if semaphore.acquire(timeout=_POLL):
                return True
        return False

    def _decoder(self, worker: int) -> None:
        readers: dict[int, FrameReader] = {}
        try:
            while self._acquire(self._in_flight):
                with self._chunk_lock:
                    if self._next_chunk >= len(self.chunks):
                        self._in_flight.release()
                        return
                    chunk = self.chunks[self._next_chunk]
                    self._next_chunk += 1
                out = self._chunk_queues[chunk.seq]
                source = self.sources[chunk.source]
                if chunk.source not in readers:
                    readers[chunk.source] = source.reader(self.decoder_threads, self.spec.interpolation,
                                                          self.decoder_options)
                try:
                    self._decode_chunk(readers[chunk.source], source, chunk, out, worker)
                except Exception as exc:
                    # delivered in order: frames before the failure still reach the consumer
                    if not isinstance(exc, VidqlError):
                        first, last = source.to_original(np.asarray([chunk.targets[0], chunk.targets[-1]]))
                        exc = PipelineError("decode", source.name, (int(first), int(last)), exc)
                    self._put(out, ("error", exc))
                    return
        finally:
            for reader in readers.values():
                reader.close()

    def _decode_chunk(self, reader: FrameReader, source: Source, chunk: _Chunk, out: queue.Queue,
                      worker: int) -> None:
        width, height = self.spec.output_size(source.info.width, source.info.height)
        shape = (self._piece, height, width, self.spec.channels)
        names, piece, filled = np.empty(self._piece, dtype=np.int64), np.empty(shape, dtype=np.uint8), 0
        for index, frame in reader.iter_frames(chunk.targets):
            if self._stop.is_set():
                return
            names[filled] = index
            piece[filled] = self.spec.apply(frame, reader.reformatter)
            self._decoded[worker] += 1
            filled += 1
            if filled == self._piece:
                if not self._put(out, ("frames", names, piece)):
                    return
                names, piece, filled = np.empty(self._piece, dtype=np.int64), np.empty(shape, dtype=np.uint8), 0
        if filled:
            self._put(out, ("frames", names[:filled], piece[:filled]))
        self._put(out, ("end",))

    def _batcher(self) -> None:
        seq = 0
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        pending_count = 0
        current = None
        for chunk in self.chunks:
            if chunk.source != current and pending:
                seq = self._emit(seq, current, pending)
                pending, pending_count = [], 0
            current = chunk.source
            while True:
                item = self._get(self._chunk_queues[chunk.seq])
                if item is _END:
                    return
                if item[0] == "end":
                    self._in_flight.release()
                    break
                if item[0] == "error":
                    if pending:
                        seq = self._emit(seq, current, pending)
                    self._put(self._batches, ("error", seq, item[1]))
                    return
                pending.append((item[1], item[2]))
                pending_count += len(item[1])
                while pending_count >= self.batch_size:
                    names = np.concatenate([p[0] for p in pending])
                    pictures = np.concatenate([p[1] for p in pending])
                    seq = self._emit(seq, current, [(names[:self.batch_size], pictures[:self.batch_size])])
                    rest = len(names) - self.batch_size
                    pending = [(names[self.batch_size:], pictures[self.batch_size:])] if rest else []
                    pending_count = rest
        if pending:
            seq = self._emit(seq, current, pending)
        for _ in range(self.transform_workers):
            self._put(self._batches, ("end", seq))

    def _emit(self, seq: int, source_index: int, parts) -> int:
        source = self.sources[source_index]
        names = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
        pictures = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        batch = Batch(source.name, source.to_original(names), pictures)
        self._put(self._batches, ("batch", seq, batch))
        return seq + 1

    def _transformer(self) -> None:
        while True:
            item = self._get(self._batches)
            if item is _END:
                return
            if item[0] in ("end", "error"):
                self._deliver(item[1], item)
                return
            _, seq, batch = item
            if self.transform is not None:
                try:
                    batch.frames = self.transform(batch.frames)
                except BaseException as exc:
                    raise _located("transform", batch, exc) from exc
            if not self._acquire(self._result_slots):
                return
            self._deliver(seq, batch)

    def _deliver(self, seq: int, value) -> None:
        with self._results_cond:
            self._results[seq] = value
            self._results_cond.notify_all()

    def _ordered_output(self) -> Iterator[Batch]:
        seq = 0
        while True:
            with self._results_cond:
                while seq not in self._results and self._error is None:
                    self._results_cond.wait(_POLL)
                if self._error is not None:
                    raise self._error
                value = self._results.pop(seq)
            if isinstance(value, tuple):  # ("end", seq) or ("error", seq, exc), after every earlier batch
                if value[0] == "error":
                    raise value[2]
                return
            self._result_slots.release()
            yield value
            seq += 1


def _located(stage: str, batch: Batch, exc: BaseException) -> BaseException:
    """A VidqlError as itself with a note on where it happened; anything else as a PipelineError."""
    frames = (int(batch.indices[0]), int(batch.indices[-1])) if len(batch.indices) else None
    if isinstance(exc, VidqlError):
        where = f" frames {frames[0]}..{frames[1]} of" if frames else ""
        exc.add_note(f"(in the pipeline's {stage}, on{where} '{batch.source}')")
        return exc
    return PipelineError(stage, batch.source, frames, exc)


def frame_batches(source, *, size: tuple[int, int] | None = None, batch_size: int = 64,
                  frames=None, workers: int | None = None, spec: FrameSpec | None = None,
                  transform: Callable | None = None, normalize=None, placement=None
                  ) -> Iterator[tuple[np.ndarray, Any]]:
    """Yield (original frame numbers, batch) for one video, in frame order.

    `source` is a path, VideoInfo or Rendition (frame numbers are the original video's);
    `frames` restricts to some frames (delivered ascending, once each). Batches are uint8
    N×H×W×3 unless `transform` or `normalize` (a `Normalize`) says otherwise.
    `placement` ("auto", "cpu", "cuda", "dali" or a `Placement`) puts resize/normalise
    (and decode) on the GPU; None keeps everything on the CPU without measuring.
    """
    args = _placed(source, size, spec, transform, normalize, placement, workers, frames, batch_size)
    if "dali" in args:
        yield from args["dali"]
        return
    with Pipeline(source, batch_size=batch_size, frames=frames, workers=workers, **args) as pipeline:
        for batch in pipeline:
            yield batch.indices, batch.frames


def run_pipeline(sources, consumer: Callable[[Batch], Any], *, size: tuple[int, int] | None = None,
                 batch_size: int = 64, frames=None, workers: int | None = None,
                 spec: FrameSpec | None = None, transform: Callable | None = None, normalize=None,
                 placement=None, progress: bool = False) -> list:
    """Feed every batch, in frame order, to `consumer(batch)`; return its results in order.

    The consumer runs in the calling thread while decoders and transforms work ahead.
    Arguments as for `frame_batches` (`placement` applies to the first source's measurements).
    """
    first = sources[0] if isinstance(sources, (list, tuple)) else sources
    args = _placed(first, size, spec, transform, normalize, placement, workers, frames, None)
    results = []
    with Pipeline(sources, batch_size=batch_size, frames=frames, workers=workers, **args) as pipeline:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=pipeline.total_frames, unit="frame", desc="preprocess")
        try:
            for batch in pipeline:
                try:
                    results.append(consumer(batch))
                except Exception as exc:
                    raise _located("consumer", batch, exc) from exc
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
    return results


def _placed(source, size, spec, transform, normalize, placement, workers, frames,
            dali_batch_size: int | None) -> dict:
    """Pipeline arguments (spec, transform) for a placement; or a DALI batch iterator
    (only when `dali_batch_size` is given, i.e. for `frame_batches`)."""
    if placement is None:
        if normalize is not None:
            if transform is not None:
                raise ParameterError("give either transform or normalize, not both")
            transform = normalize
        return {"size": size, "spec": spec, "transform": transform}
    if spec is not None or transform is not None:
        raise ParameterError("a placement builds spec and transform itself; give size and normalize")
    from vidql.preprocess.placement import Placement, plan_placement

    chosen = placement if isinstance(placement, Placement) else plan_placement(
        source, size, normalize=normalize, override=None if placement == "auto" else placement,
        workers=workers)
    if chosen.decode == "dali":
        if dali_batch_size is None or frames is not None or isinstance(source, (list, tuple)):
            raise ParameterError("DALI decoding reads one whole video; use placement='cuda' here")
        from vidql.preprocess.gpu import DeviceTransform, dali_frame_batches

        src = as_source(source)
        finish = DeviceTransform("cuda", None, normalize) if normalize is not None else None
        batches = dali_frame_batches(src.path, size=size, batch_size=dali_batch_size, info=src.info)
        return {"dali": ((src.to_original(i), finish(b) if finish else b) for i, b in batches)}
    return chosen.pipeline_args(size, normalize)


def thread_names() -> list[str]:
    """Names of this module's threads still alive (for tests and leak checks)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("vidql-")]
