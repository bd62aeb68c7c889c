"""Cutting the pipeline's work into GOP-aligned chunks, in output order."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Sequence

import numpy as np

from vidql.preprocess.source import Source


@dataclass(frozen=True)
class Chunk:
    """A GOP-aligned run of one source's frames, decoded by one worker; `seq` is its output rank."""

    seq: int
    source: int
    targets: Sequence[int]  # own frame positions, ascending


def plan_chunks(sources: Sequence[Source], frames: Sequence[np.ndarray | None], chunk_frames: int
                ) -> list[Chunk]:
    """Cut the work into GOP-aligned chunks of about `chunk_frames` frames, in output order."""
    chunks: list[Chunk] = []
    for s, (source, wanted) in enumerate(zip(sources, frames, strict=True)):
        keyframes = np.asarray(source.info.keyframes, dtype=np.int64)
        if wanted is None:
            bounds = [0]
            for k in keyframes[1:]:
                if k - bounds[-1] >= chunk_frames:
                    bounds.append(int(k))
            bounds.append(source.frame_count)
            for a, b in pairwise(bounds):
                chunks.append(Chunk(len(chunks), s, range(a, b)))
            continue
        if len(wanted) == 0:
            continue
        gops = np.searchsorted(keyframes, wanted, side="right") - 1
        start = 0
        for i in range(1, len(wanted) + 1):
            if i == len(wanted) or (i - start >= chunk_frames and gops[i] != gops[i - 1]):
                chunks.append(Chunk(len(chunks), s, wanted[start:i].tolist()))
                start = i
    return chunks
