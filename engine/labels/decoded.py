"""A query's decoded frames, kept for its later draws, so that a GOP is decoded again only
where that is cheaper than decoding on now.

An operator that draws in rounds (ERROR WITHIN, ORACLE BUDGET's two stages) fixes its draw
order up front and tells the label cache (`LabelCache.plan_draws`). When a labelling call
decodes a GOP to reach the frames it labels now, it may decode on to planned frames of that
GOP and keep them (what the oracle reads, at its input size: `Oracle.shrink`) here, earliest
draws first, within STORE_BYTES; a later round takes them from memory instead of decoding
the GOP again. Decoding on is worth it where the frames it reaches would cost more to decode
later, weighted by the chance that the query draws them at all (`frames_to_keep`): in a
120-frame GOP nearly always, in an 8-frame one (an oracle rendition) only for draws due
soon. The answer does not change: the oracle sees the same pixels, whichever round decodes
them.
"""
from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from vidql.preprocess import DecodeStats, frame_batches
from vidql.preprocess.source import as_source

STORE_BYTES = 256 << 20  # decoded frames a query may hold for its later draws


def frames_to_keep(wanted: np.ndarray, planned: np.ndarray, draws: np.ndarray, drawn: int,
                   keyframes: np.ndarray, room: int) -> np.ndarray:
    """Of `planned` (frames the query may draw later, earliest draw first; `draws[i]` counts
    the query's draws up to and including planned[i]'s), the ones worth decoding on to and
    keeping in the GOPs that decoding `wanted` touches, at most `room`, earliest draws first.

    A planned frame decoded later costs its offset in its GOP plus one frames; a query that
    has made `drawn` draws by the end of this call goes on to make `draws[i]` with chance
    about drawn / draws[i] (its stopping point unknown, as likely to double as not). In each
    GOP, decoding goes on past the last wanted frame to where the frames kept save the most
    decoding, counted that way, beyond what decoding on to them costs; planned frames before
    the last wanted one are kept for free. Frames are positions in the decoded file, whose
    GOPs start at `keyframes`."""
    if room <= 0 or len(planned) == 0 or len(wanted) == 0:
        return planned[:0]
    gop_of = lambda frames: np.searchsorted(keyframes, frames, side="right") - 1  # noqa: E731
    ends = np.full(len(keyframes), -1, dtype=np.int64)
    np.maximum.at(ends, gop_of(wanted), wanted)  # the last wanted frame of each GOP touched
    gops = gop_of(planned)
    end = ends[gops]
    saving = np.minimum(1.0, drawn / np.maximum(draws, 1)) * (planned - keyframes[gops] + 1)
    keep = (end >= 0) & (planned <= end)
    beyond = np.flatnonzero((end >= 0) & (planned > end))
    beyond = beyond[np.lexsort((planned[beyond], gops[beyond]))]  # by GOP, then in file order
    for part in np.split(beyond, np.flatnonzero(np.diff(gops[beyond])) + 1):
        if len(part):
            gain = np.cumsum(saving[part]) - (planned[part] - end[part])
            best = int(np.argmax(gain))
            if gain[best] > 0:
                keep[part[:best + 1]] = True
    return planned[keep][:room]


class DecodedFrames:
    """Frames of a video (by global position) decoded ahead for a query's planned draws,
    and the plan: each planned frame's rank in the draw order."""

    def __init__(self, n_frames: int):
        self.capacity = STORE_BYTES
        self.rank = np.full(n_frames, -1, dtype=np.int64)  # -1: not planned
        self.held = np.zeros(n_frames, dtype=bool)
        self.frames: dict[int, np.ndarray] = {}
        self.bytes = 0
        self.first_draw = 0  # the query's draws before the plan's first
        self.drawn = 0  # the query's draws made once the current call ends

    def plan(self, positions: np.ndarray, done: int = 0) -> None:
        """The query, having made `done` draws, will draw `positions` (global, not labelled
        yet) in this order; frames kept for an earlier plan and not in this one are let go."""
        self.rank.fill(-1)
        self.rank[positions] = np.arange(len(positions))
        self.first_draw = self.drawn = int(done)
        self.take(np.asarray([p for p in self.frames if self.rank[p] < 0], dtype=np.int64))

    def unplan(self, positions: np.ndarray) -> None:
        """`positions` are being labelled now: no later draw needs them."""
        ranks = self.rank[positions]
        if (ranks >= 0).any():
            self.drawn = max(self.drawn, self.first_draw + int(ranks.max()) + 1)
        self.rank[positions] = -1

    def planned(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(planned positions in [first, stop) not kept yet, earliest draw first, the query's
        draws up to and including each)."""
        ranks = self.rank[first:stop]
        found = np.flatnonzero((ranks >= 0) & ~self.held[first:stop])
        found = found[np.argsort(ranks[found], kind="stable")]
        return first + found, self.first_draw + ranks[found] + 1

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
    planned, draws = kept.planned(first, first + clip.frame_count)
    room = kept.room(clip.kept_size[0] * clip.kept_size[1] * 3)
    chosen = frames_to_keep(source.to_positions(local), source.to_positions(planned - first),
                            draws, kept.drawn, np.asarray(source.info.keyframes, dtype=np.int64),
                            room)
    return np.sort(source.to_original(chosen))
