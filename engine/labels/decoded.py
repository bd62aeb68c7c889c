"""A query's decoded frames, kept for its later draws, so that each GOP is decoded at most
once per query.

An operator that draws in rounds (ERROR WITHIN, ORACLE BUDGET's two stages) fixes its draw
order up front and tells the label cache (`LabelCache.plan_draws`). When a labelling call
decodes a GOP to reach the frames it labels now, it decodes on to the last planned frame
of that GOP and keeps the planned frames (what the oracle reads, at its input size:
`Oracle.shrink`) here, earliest draws first, within STORE_BYTES; a later round takes them
from memory instead of decoding the GOP again. The answer does not change: the oracle sees
the same pixels, whichever round decodes them.
"""
from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from vidql.preprocess import DecodeStats, frame_batches
from vidql.preprocess.source import as_source

STORE_BYTES = 256 << 20  # decoded frames a query may hold for its later draws


def frames_to_keep(wanted: np.ndarray, planned: np.ndarray, keyframes: np.ndarray,
                   room: int) -> np.ndarray:
    """Of `planned` (a clip's frames the query may draw later, earliest draw first), the
    ones in GOPs that decoding `wanted` touches, at most `room` of them, earliest draws
    first: decoding goes on to the last of them in each GOP, and they are kept. Frames are
    positions in the decoded file, whose GOPs start at `keyframes`."""
    if room <= 0 or len(planned) == 0 or len(wanted) == 0:
        return planned[:0]
    touched = np.unique(np.searchsorted(keyframes, wanted, side="right"))
    gops = np.searchsorted(keyframes, planned, side="right")
    return planned[np.isin(gops, touched)][:room]


class DecodedFrames:
    """Frames of a video (by global position) decoded ahead for a query's planned draws,
    and the plan: each planned frame's rank in the draw order."""

    def __init__(self, n_frames: int):
        self.capacity = STORE_BYTES
        self.rank = np.full(n_frames, -1, dtype=np.int64)  # -1: not planned
        self.held = np.zeros(n_frames, dtype=bool)
        self.frames: dict[int, np.ndarray] = {}
        self.bytes = 0

    def plan(self, positions: np.ndarray) -> None:
        """The query will draw `positions` (global, not labelled yet) in this order; frames
        kept for an earlier plan and not in this one are let go."""
        self.rank.fill(-1)
        self.rank[positions] = np.arange(len(positions))
        self.take(np.asarray([p for p in self.frames if self.rank[p] < 0], dtype=np.int64))

    def unplan(self, positions: np.ndarray) -> None:
        """`positions` are being labelled now: no later draw needs them."""
        self.rank[positions] = -1

    def planned(self, first: int, stop: int) -> np.ndarray:
        """Planned positions in [first, stop) not kept yet, earliest draw first."""
        ranks = self.rank[first:stop]
        found = np.flatnonzero((ranks >= 0) & ~self.held[first:stop])
        return first + found[np.argsort(ranks[found], kind="stable")]

    def room(self, frame_bytes: int) -> int:
        """How many more frames of `frame_bytes` bytes fit."""
        return max(0, (self.capacity - self.bytes) // max(1, frame_bytes))

    def keep(self, positions: np.ndarray, frames: np.ndarray) -> None:
        """Keep decoded `frames` of `positions` (copies) for a later draw."""
        for position, frame in zip(positions.tolist(), frames, strict=True):
            self.frames[position] = frame.copy()
            self.bytes += frame.nbytes
        self.held[positions] = True

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """(those of `positions` kept here, their frames), no longer kept."""
        found = positions[self.held[positions]]
        frames = [self.frames.pop(p) for p in found.tolist()]
        self.held[found] = False
        self.bytes -= sum(frame.nbytes for frame in frames)
        return found, frames


@dataclass(frozen=True)
class OracleInput:
    """What an oracle reads of one clip: `source` to decode (the clip's VideoInfo, or its
    oracle rendition), `shrink` and `finish` (together the oracle's `prepare`: kept frames
    are shrunk ones), `kept_size`, the (width, height) of a shrunk frame, and the clip's
    frame count."""

    source: object
    shrink: Callable
    finish: Callable
    kept_size: tuple[int, int]
    frame_count: int


def clip_pixels(clip: OracleInput, first: int, local: np.ndarray, batch_size: int,
                kept: DecodedFrames | None, stats: DecodeStats | None = None
                ) -> Iterator[tuple[np.ndarray, object]]:
    """(global positions, prepared batch) of one clip's frames `local` (ascending, numbered
    within the clip, whose first frame is global position `first`): those `kept` holds
    from memory, the rest decoded in file order, with `kept`'s planned frames of the GOPs
    decoded (as many as fit) decoded on the way and kept. Batches are full but the last.
    The decoding's work is added to `stats`."""
    found, frames = kept.take(first + local) if kept is not None else (local[:0], [])
    local = local[~np.isin(first + local, found)]
    extra = _extra_frames(clip, first, local, kept)
    if not len(extra) and not len(found):  # as the oracle's `prepare`, ahead of it
        finish = lambda frames: clip.finish(clip.shrink(frames))  # noqa: E731
        with closing(frame_batches(clip.source, frames=local, batch_size=batch_size, workers=1,
                                   transform=finish, stats=stats)) as batches:
            for ids, pixels in batches:
                yield np.asarray(ids, dtype=np.int64) + first, pixels
        return
    ids = found
    for got, small in _shrunk(clip, np.union1d(local, extra), batch_size, stats):
        ahead = np.isin(got, extra)
        kept.keep(first + got[ahead], small[ahead])
        ids, frames = np.concatenate([ids, first + got[~ahead]]), frames + list(small[~ahead])
        while len(ids) >= batch_size:
            yield ids[:batch_size], clip.finish(np.stack(frames[:batch_size]))
            ids, frames = ids[batch_size:], frames[batch_size:]
    if len(ids):
        yield ids, clip.finish(np.stack(frames))


def _shrunk(clip: OracleInput, local: np.ndarray, batch_size: int, stats: DecodeStats | None
            ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(frames, shrunk pixels) of a clip's frames `local`, decoded in file order."""
    if not len(local):
        return
    with closing(frame_batches(clip.source, frames=local, batch_size=batch_size, workers=1,
                               transform=clip.shrink, stats=stats)) as batches:
        for got, small in batches:
            yield np.asarray(got, dtype=np.int64), small


def _extra_frames(clip: OracleInput, first: int, local: np.ndarray,
                  kept: DecodedFrames | None) -> np.ndarray:
    """Planned frames of `clip` (numbered within it) to decode with `local` and keep."""
    if kept is None or not len(local):
        return local[:0]
    source = as_source(clip.source)
    planned = kept.planned(first, first + clip.frame_count) - first
    room = kept.room(clip.kept_size[0] * clip.kept_size[1] * 3)
    chosen = frames_to_keep(source.to_positions(local), source.to_positions(planned),
                            np.asarray(source.info.keyframes, dtype=np.int64), room)
    return np.sort(source.to_original(chosen))
