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
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from vidql.base.errors import ParameterError, VidqlError
from vidql.preprocess.chunks import Chunk, plan_chunks
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.source import Source, as_source
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


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


DECODER_NICE = 10  # priority steps below a consumer's that needs whole cores (a CNN, a detector)
_DECODERS: ContextVar[tuple[int | None, int]] = ContextVar("vidql_decoders", default=(None, 0))


@contextmanager
def decoder_threads(n: int | None, nice: int = 0):
    """Pipelines started inside (and given no `workers`) decode with `n` threads instead of
    one per core (None), each `nice` steps below the caller's priority (Linux; elsewhere
    as they are): for a pass whose consumer needs a core of its own, a CNN on the CPU,
    decoders that take what it leaves."""
    token = _DECODERS.set((None if n is None else max(1, int(n)), int(nice)))
    try:
        yield
    finally:
        _DECODERS.reset(token)


def lower_thread_priority(steps: int) -> None:
    """Make the calling thread (and the threads it starts, FFmpeg's) `steps` nicer: the
    scheduler then runs it only on what threads of normal priority leave."""
    if steps and hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + steps)
        except OSError:
            pass  # not allowed here: decode at normal priority


@dataclass
class DecodeStats:
    """What decoders did, added up over pipelines: seconds spent decoding frames (not
    waiting for room downstream) and frames decoded (a GOP's lead-in to the frames wanted
    included); seconds spent converting the frames wanted, and how many."""

    seconds: float = 0.0
    frames: int = 0
    convert_seconds: float = 0.0
    converted: int = 0


class Pipeline:
    """Frames of one or more videos, decoded in parallel and delivered as ordered `Batch`es.

    sources: paths / VideoInfos / Renditions; frames: None for every frame, or per source an
    array of (original) frame numbers, delivered ascending and without duplicates;
    spec: per-frame crop/resize/format (or `size` for just a resize); transform: a callable
    on each uint8 batch (e.g. `Normalize()`, or a GPU transform); workers: decoder threads;
    decoder_nice: how many steps nicer than the caller they run (beside a consumer that
    needs whole cores: DECODER_NICE); both as `decoder_threads` advises when None;
    max_batches: how many batches may wait between stages; decoder_options: FFmpeg decoder
    options such as {"skip_loop_filter": "all"} (faster, no longer frame-exact);
    stats: a DecodeStats the decoders' work is added to when the pipeline closes.
    """

    def __init__(self, sources, *, size: tuple[int, int] | None = None, spec: FrameSpec | None = None,
                 batch_size: int = 64, frames=None, transform: Callable | None = None,
                 workers: int | None = None, transform_workers: int = 1, max_batches: int = 4,
                 chunk_frames: int | None = None, memory_budget: int = 512 << 20,
                 decoder_options: dict[str, str] | None = None, decoder_nice: int | None = None,
                 stats: DecodeStats | None = None):
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
                       for src, w in zip(self.sources, wanted, strict=True)]
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
        advised, nice = _DECODERS.get()
        self.workers = max(1, int(workers or advised or cpu_count()))
        self.decoder_nice = nice if decoder_nice is None else int(decoder_nice)
        self.transform_workers = max(1, int(transform_workers))
        self.max_batches = max(1, int(max_batches))
        frame_bytes = max(self._frame_bytes(src) for src in self.sources)
        if chunk_frames is None:
            # a few chunks per worker, each small enough to be buffered whole within the budget
            total = sum(src.frame_count if w is None else len(w) for src, w in zip(self.sources, self.frames, strict=True))
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
        self.stats = stats
        self._work = [DecodeStats() for _ in range(self.workers)]  # per decoder
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
        if self.stats is not None:
            for work in self._work:
                self.stats.seconds += work.seconds
                self.stats.frames += work.frames
                self.stats.convert_seconds += work.convert_seconds
                self.stats.converted += work.converted
            self._work = [DecodeStats() for _ in self._work]

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
        lower_thread_priority(self.decoder_nice)
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

    def _decode_chunk(self, reader: FrameReader, source: Source, chunk: Chunk, out: queue.Queue,
                      worker: int) -> None:
        width, height = self.spec.output_size(source.info.width, source.info.height)
        shape = (self._piece, height, width, self.spec.channels)
        names, piece, filled = np.empty(self._piece, dtype=np.int64), np.empty(shape, dtype=np.uint8), 0
        work, before, start = self._work[worker], reader.decoded, time.perf_counter()
        try:
            for index, frame in reader.iter_frames(chunk.targets):
                if self._stop.is_set():
                    return
                names[filled] = index
                decoded = time.perf_counter()
                piece[filled] = self.spec.apply(frame, reader.reformatter)
                converted = time.perf_counter()
                work.convert_seconds += converted - decoded
                work.seconds -= converted - decoded  # the stretch's time, added below, less this
                work.converted += 1
                self._decoded[worker] += 1
                filled += 1
                if filled == self._piece:
                    work.seconds += time.perf_counter() - start
                    if not self._put(out, ("frames", names, piece)):
                        return
                    start = time.perf_counter()
                    names, piece, filled = np.empty(self._piece, dtype=np.int64), np.empty(shape, dtype=np.uint8), 0
            work.seconds += time.perf_counter() - start
        finally:
            work.frames += reader.decoded - before
        if filled:
            self._put(out, ("frames", names[:filled], piece[:filled]))
        self._put(out, ("end",))

    def _batcher(self) -> None:
        seq = 0
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        current = None
        for chunk in self.chunks:
            if chunk.source != current and pending:
                seq, pending = self._emit(seq, current, pending), []
            current = chunk.source
            while True:
                item = self._get(self._chunk_queues[chunk.seq])
                if item is _END:
                    return
                if item[0] == "end":
                    self._in_flight.release()
                    break
                if item[0] == "error":
                    self._emit_error(seq, current, pending, item[1])
                    return
                pending.append((item[1], item[2]))
                seq, pending = self._emit_full(seq, current, pending)
        if pending:
            seq = self._emit(seq, current, pending)
        for _ in range(self.transform_workers):
            self._put(self._batches, ("end", seq))

    def _emit_full(self, seq: int, source_index: int, pending: list) -> tuple[int, list]:
        """Emit every full batch in `pending`; returns the next seq and the frames left over."""
        count = sum(len(p[0]) for p in pending)
        while count >= self.batch_size:
            names = np.concatenate([p[0] for p in pending])
            pictures = np.concatenate([p[1] for p in pending])
            seq = self._emit(seq, source_index, [(names[:self.batch_size], pictures[:self.batch_size])])
            count = len(names) - self.batch_size
            pending = [(names[self.batch_size:], pictures[self.batch_size:])] if count else []
        return seq, pending

    def _emit_error(self, seq: int, source_index: int, pending: list, exc: BaseException) -> None:
        """Emit the frames decoded before a decoder's error, then the error."""
        if pending:
            seq = self._emit(seq, source_index, pending)
        self._put(self._batches, ("error", seq, exc))

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
                    raise located("transform", batch, exc) from exc
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


def located(stage: str, batch: Batch, exc: BaseException) -> BaseException:
    """A VidqlError as itself with a note on where it happened; anything else as a PipelineError."""
    frames = (int(batch.indices[0]), int(batch.indices[-1])) if len(batch.indices) else None
    if isinstance(exc, VidqlError):
        where = f" frames {frames[0]}..{frames[1]} of" if frames else ""
        exc.add_note(f"(in the pipeline's {stage}, on{where} '{batch.source}')")
        return exc
    return PipelineError(stage, batch.source, frames, exc)


def thread_names() -> list[str]:
    """Names of this module's threads still alive (for tests and leak checks): a pipeline's
    decoders, batcher and transformers, not other vidql threads (an ONNX oracle's pool)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("vidql-decode-", "vidql-batch", "vidql-transform-"))]
