"""Finding rare events (EZMODE-style): rounds of a light classifier on frozen embeddings,
labelling the most confident frames first and flood-filling the temporal neighbourhood
of every positive.

Each round trains a logistic regression on the labelled frames (positives: the easier
half of each temporal cluster of positives, by the previous round's scores; negatives:
every labelled negative), scores the candidate pool (every unlabelled frame, or the SEALS
pool: the k nearest neighbours of labelled frames), and labels the `batch` highest
scores. Every positive found has its unlabelled neighbours within `radius` frames
labelled, recursively, as long as budget remains.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from vidql.errors import ParameterError
from vidql.ranges import MIN_RARE_BUDGET

from .oracle_calls import DistinctOracle, as_flags
from .results import RareResult
from .validation import check_int, check_scores, make_rng

POOLS = ("all", "seals")


def _clusters(frames: np.ndarray, radius: int) -> list[np.ndarray]:
    """Sorted positive frames split where consecutive ones are more than radius apart."""
    if frames.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(frames) > radius) + 1
    return np.split(frames, cuts)


def _easy_half(positives: np.ndarray, scores: np.ndarray | None, radius: int) -> np.ndarray:
    """The higher-scoring half (at least one) of each temporal cluster of positives."""
    if scores is None:
        return positives
    keep = []
    for cluster in _clusters(np.sort(positives), radius):
        ranked = cluster[np.argsort(-scores[cluster], kind="stable")]
        keep.append(ranked[:max(1, (ranked.size + 1) // 2)])
    return np.concatenate(keep)


class _SealsPool:
    """Candidate pool of the k nearest neighbours (faiss, exact L2) of labelled frames."""

    def __init__(self, embeddings: np.ndarray, k: int):
        import faiss

        self.index = faiss.IndexFlatL2(embeddings.shape[1])
        self.index.add(embeddings)
        self.embeddings = embeddings
        self.k = min(k + 1, embeddings.shape[0])
        self.pool = np.zeros(embeddings.shape[0], dtype=bool)

    def add(self, frames: np.ndarray) -> None:
        if frames.size:
            _, neighbours = self.index.search(self.embeddings[frames], self.k)
            found = neighbours[neighbours >= 0]
            self.pool[found] = True


def find_rare(embeddings: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
              budget: int = 500, seed=0, radius: int = 5, proxy: np.ndarray | None = None,
              batch: int = 50, max_rounds: int | None = None, patience: int | None = None,
              candidate_pool: str = "all", k_seals: int = 50,
              regularization: float = 1.0) -> RareResult:
    """Find as many distinct frames where `predicate` holds as `budget` oracle calls allow.

    `embeddings` (n, d): one vector per frame, frames in temporal order. The first round
    labels the `batch` top-proxy frames when a proxy is given, else `batch` random ones.
    Stops when the budget is spent, after `max_rounds`, after `patience` rounds in a row
    without a new positive, or when no candidate is left.
    """
    emb = np.ascontiguousarray(np.asarray(embeddings, dtype=np.float32))
    if emb.ndim != 2 or emb.shape[0] == 0 or not np.all(np.isfinite(emb)):
        raise ParameterError("embeddings must be a finite (frames, dims) array; got shape "
                             f"{emb.shape}")
    n = emb.shape[0]
    budget = check_int("budget", budget, MIN_RARE_BUDGET)
    radius = check_int("radius", radius, 0)
    batch = check_int("batch", batch, 1)
    if max_rounds is not None:
        check_int("max_rounds", max_rounds, 1)
    if patience is not None:
        check_int("patience", patience, 1)
    if candidate_pool not in POOLS:
        raise ParameterError(f"candidate_pool must be one of {POOLS}; got {candidate_pool!r}")
    k_seals = check_int("k_seals", k_seals, 1)
    if proxy is not None:
        proxy = check_scores("proxy", proxy, n)
    rng = make_rng(seed)
    oracle = DistinctOracle(predicate, n)
    label = np.zeros(n, dtype=bool)  # valid where oracle.labelled
    seals = _SealsPool(emb, k_seals) if candidate_pool == "seals" else None
    budget = min(budget, n)

    def query(frames: np.ndarray) -> np.ndarray:
        frames = frames[:budget - oracle.calls]
        if frames.size == 0:
            return frames
        label[frames] = as_flags(oracle(frames), frames.size)
        if seals is not None:
            seals.add(frames)
        return frames[label[frames]]

    def flood(new_positives: np.ndarray) -> int:
        """Label unlabelled neighbours within radius of positives, recursively."""
        labelled_here = 0
        frontier = new_positives
        while frontier.size and oracle.calls < budget and radius > 0:
            offsets = np.arange(-radius, radius + 1)
            near = np.unique((frontier[:, None] + offsets[None, :]).ravel())
            near = near[(near >= 0) & (near < n)]
            near = near[~oracle.labelled[near]]
            # closest to a positive first, in case the budget runs out mid-way
            distance = np.abs(near[:, None] - frontier[None, :]).min(axis=1)
            near = near[np.argsort(distance, kind="stable")]
            before = oracle.calls
            frontier = query(near)
            labelled_here += oracle.calls - before
        return labelled_here

    if proxy is not None:
        first = np.lexsort((rng.random(n), -proxy))[:batch]
    else:
        first = rng.choice(n, size=min(batch, n), replace=False)
    positives_after_round = []
    flood_calls = flood(query(first))
    positives_after_round.append(int(label[oracle.labelled].sum()))
    rounds, idle = 1, int(positives_after_round[0] == 0)
    scores = None
    while oracle.calls < budget and (max_rounds is None or rounds < max_rounds):
        labelled = np.flatnonzero(oracle.labelled)
        pos = labelled[label[labelled]]
        neg = labelled[~label[labelled]]
        candidates = ~oracle.labelled
        if seals is not None:
            candidates &= seals.pool
        candidate_frames = np.flatnonzero(candidates)
        if candidate_frames.size == 0:
            break
        if pos.size and neg.size:
            train_pos = _easy_half(pos, scores, radius)
            x = np.concatenate([emb[train_pos], emb[neg]])
            y = np.concatenate([np.ones(train_pos.size), np.zeros(neg.size)])
            from sklearn.linear_model import LogisticRegression  # loads in ~1.5 s: only here

            model = LogisticRegression(C=regularization, class_weight="balanced", max_iter=500)
            model.fit(x, y)
            scores = np.full(n, -np.inf)
            scores[candidate_frames] = model.decision_function(emb[candidate_frames])
            scores[labelled] = model.decision_function(emb[labelled])
            ranking = candidate_frames[np.lexsort((rng.random(candidate_frames.size),
                                                   -scores[candidate_frames]))]
        elif proxy is not None:
            ranking = candidate_frames[np.lexsort((rng.random(candidate_frames.size),
                                                   -proxy[candidate_frames]))]
        else:
            ranking = rng.permutation(candidate_frames)
        before = int(label[oracle.labelled].sum())
        flood_calls += flood(query(ranking[:batch]))
        rounds += 1
        found = int(label[oracle.labelled].sum())
        positives_after_round.append(found)
        idle = idle + 1 if found == before else 0
        if patience is not None and idle >= patience:
            break
    frames = np.flatnonzero(oracle.labelled & label).astype(np.int64)
    details = {"positives_after_round": positives_after_round, "flood_calls": flood_calls,
               "candidate_pool": candidate_pool,
               "seeded_by": "proxy" if proxy is not None else "random"}
    return RareResult(frames, oracle.calls, rounds, details)
