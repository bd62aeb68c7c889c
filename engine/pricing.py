"""What labelling a query's frames costs: the oracle's time per frame plus decoding the
frames (each clip's `ReadCost`: GOP layout and measured decode time; where a call would
write a clip's 'auto' oracle rendition, writing it and the rendition's estimated cost), for
EXPLAIN and for the planner's choice between sampling and the exact scan."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vidql.engine.labels.cache import LabelCache
from vidql.engine.labels import decoded as store

TIMING_FRAMES = 2  # frames a first EXPLAIN labels to time an oracle that never ran
# The share of decoding that runs beside the oracle rather than adding to its time. The
# decoder and the oracle each take a core of the 2-core bench machine, but a call's first
# batch waits for its decoding, and the oracle time measured so far already carries some
# contention. Against two runs of the real bench (real clips, the 1080p GOP-120 clip read
# from its file and from its oracle rendition, calls cut into OVERLAP_BATCHES), a half left
# EXPLAIN within 1.5x in 22 and 23 of 25 queries; a quarter in 20 and 20, all of it 20 and 21.
DECODE_HIDDEN = 0.5


@dataclass(frozen=True)
class Decoding:
    """Seconds and frames of decoding for labelling calls; `writing`: the seconds of them
    spent writing 'auto' oracle renditions."""

    seconds: float = 0.0
    frames: int = 0
    writing: float = 0.0

    def plus(self, other: "Decoding") -> "Decoding":
        return Decoding(self.seconds + other.seconds, self.frames + other.frames,
                        self.writing + other.writing)


@dataclass(frozen=True)
class Price:
    """Estimated seconds of labelling `calls` frames: the oracle's and decoding's."""

    calls: int
    oracle_seconds: float | None  # None: the oracle's time per frame is unknown
    decode_seconds: float
    decoded_frames: int
    writing_seconds: float = 0.0  # of decode_seconds, writing 'auto' oracle renditions

    @property
    def seconds(self) -> float | None:
        """The oracle's seconds and decoding's, DECODE_HIDDEN of the reading hidden behind
        the oracle (a decoder thread works ahead of it), but never less than decoding alone;
        writing a rendition comes first and hides nothing."""
        if self.oracle_seconds is None:
            return None
        reading = self.decode_seconds - self.writing_seconds
        return self.writing_seconds + max(reading, self.oracle_seconds + (1 - DECODE_HIDDEN) * reading)

    def plus(self, other: "Price") -> "Price":
        """Both labellings' price together (unknown if either oracle's time is)."""
        oracle = (None if self.oracle_seconds is None or other.oracle_seconds is None
                  else self.oracle_seconds + other.oracle_seconds)
        return Price(self.calls + other.calls, oracle, self.decode_seconds + other.decode_seconds,
                     self.decoded_frames + other.decoded_frames,
                     self.writing_seconds + other.writing_seconds)


def known_ms(catalog, oracle) -> float | None:
    """The oracle's milliseconds per frame where known without labelling a frame: a stated
    `cost_ms`, the time measured over what it labelled, or none for a LABELS table; else None."""
    if oracle.simulated_cost_ms is not None:
        return oracle.simulated_cost_ms
    ms = catalog.measured_ms_per_frame(oracle.identity)
    return 0.0 if ms is None and oracle.nearly_free else ms


def oracle_ms(catalog, cache: LabelCache, frames: np.ndarray) -> tuple[float | None, str | None]:
    """(milliseconds per frame, how it is known): `known_ms`; else, unless the database is
    read-only, timed now by labelling `frames`, a frame or two not labelled yet (their labels
    are kept, as any label is)."""
    oracle = cache.oracle
    ms = known_ms(catalog, oracle)
    if ms is not None:
        simulated = oracle.simulated_cost_ms is not None
        return ms, "seconds simulated from the oracle's cost_ms" if simulated else None
    fresh = np.asarray(frames, dtype=np.int64)
    if fresh.size == 0 or catalog.read_only:
        return None, None
    cache.ensure(fresh)
    return (catalog.measured_ms_per_frame(oracle.identity),
            f"the oracle was timed on {fresh.size} frame(s) for this estimate (their labels are kept)")


class _Reading:
    """What a query's labelling calls read, call after call: each clip's ReadCost (its 'auto'
    oracle rendition's once a call writes it, as the engine does) and the file reads of its
    earlier calls, which count toward writing it (rent or buy, `Catalog.rendition_to_write`)."""

    def __init__(self, catalog, video: str, cache: LabelCache):
        self.catalog, self.video, self.oracle = catalog, video, cache.oracle
        self.costs = catalog.read_costs(video, cache.oracle)
        self.written: set[int] = set()
        self.rented: dict[int, float] = {}  # estimated file seconds of earlier calls

    def call(self, ordinal: int, local: np.ndarray, also: np.ndarray | None = None) -> Decoding:
        """Decoding a clip's frames `local` (and `also`, kept for later) in one labelling
        call: writing its 'auto' oracle rendition first where the call would, and reading."""
        writing = 0.0
        if ordinal not in self.written:
            write = self.catalog.rendition_to_write(self.video, ordinal, self.oracle, local,
                                                    self.rented.get(ordinal, 0.0))
            if write is None:
                self.rented[ordinal] = self.rented.get(ordinal, 0.0) + \
                    self.catalog.file_read_seconds(self.video, ordinal, local)
            else:
                writing, self.costs[ordinal] = write
                self.written.add(ordinal)
        wanted = local if also is None else np.union1d(local, also)
        cost = self.costs[ordinal]
        n = cost.decoded_in_order(wanted)
        return Decoding(cost.seconds(n, len(wanted)) + writing, n, writing)


def decode_seconds(catalog, video: str, cache: LabelCache, calls: list[np.ndarray]) -> Decoding:
    """Decoding the global positions of each of `calls` (labelling calls, one after the
    other) in file order, clip by clip (a call may write a clip's 'auto' oracle rendition
    first, and read that); nothing for an oracle that needs no pixels."""
    if not cache.oracle.needs_pixels:
        return Decoding()
    reading, total = _Reading(catalog, video, cache), Decoding()
    for frames in calls:
        frames = np.unique(np.asarray(frames, dtype=np.int64))
        for ordinal, local, _ in cache.clip_map.pieces(frames):
            total = total.plus(reading.call(ordinal, local))
    return total


def decode_planned(catalog, video: str, cache: LabelCache, rounds: list[np.ndarray],
                   plan: np.ndarray) -> Decoding:
    """Decoding in labelling calls `rounds` (global positions) of a query that plans its
    draws (`plan`, in draw order, the rounds' frames first), as the engine decodes them
    (engine/labels/decoded.py): each call decodes the GOPs of its frames not kept yet, on
    to the planned frames in them worth keeping that fit in the store, which it keeps."""
    if not cache.oracle.needs_pixels or not rounds:
        return Decoding()
    reading = _Reading(catalog, video, cache)
    kept = np.zeros(cache.n_frames, dtype=bool)
    total, done = Decoding(), 0
    for frames in rounds:
        frames = np.unique(frames)
        done += len(frames)
        free = ~kept[plan[done:]]
        later, draws = plan[done:][free], done + 1 + np.flatnonzero(free)
        todo = frames[~kept[frames]]
        kept[frames] = False
        for ordinal, local, _ in cache.clip_map.pieces(todo):
            first = int(cache.clip_map.first[ordinal])
            clip = catalog.oracle_input(video, ordinal, cache.oracle)
            mine = (later >= first) & (later < first + clip.frame_count)
            room = store.STORE_BYTES // (clip.kept_size[0] * clip.kept_size[1] * 3) - int(kept.sum())
            extra = store.frames_to_keep(local, later[mine] - first, draws[mine], done,
                                         reading.costs[ordinal].keyframes, room)
            kept[first + extra] = True
            total = total.plus(reading.call(ordinal, local, extra))
    return total


def price(catalog, video: str, cache: LabelCache, frames: np.ndarray, ms: float | None) -> Price:
    """The price of labelling the global positions `frames` (all of them new) in one
    labelling call, which decodes them in file order."""
    decoding = decode_seconds(catalog, video, cache, [frames])
    oracle = None if ms is None else len(frames) * ms / 1000
    return Price(int(len(frames)), oracle, decoding.seconds, decoding.frames, decoding.writing)


def uniform_draw(population: np.ndarray, cached: np.ndarray, n: int) -> np.ndarray:
    """`n` frames drawn uniformly (seeded) from the frames of `population` not in `cached`:
    where a budgeted query's draws will fall, for pricing their decoding."""
    fresh = population[~np.isin(population, cached)]
    n = min(int(n), fresh.size)
    return np.random.default_rng(0).choice(fresh, size=n, replace=False) if n else fresh[:0]
