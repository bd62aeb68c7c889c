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
from threadpoolctl import threadpool_limits

from vidql.base.errors import ParameterError
from vidql.base.ranges import MIN_RARE_BUDGET

from .limit import proxy_order
from .oracle_calls import DistinctOracle, as_flags
from .results import RareResult
from .validation import check_int, check_scores, make_rng

POOLS = ("all", "seals")
RARE_BATCH = 50  # frames a round labels (by the classifier's scores)


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
              batch: int = RARE_BATCH, max_rounds: int | None = None, patience: int | None = None,
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
    seals = _SealsPool(emb, k_seals) if candidate_pool == "seals" else None
    search = _Search(emb, predicate, min(budget, n), radius, seals)
    if proxy is not None:
        first = proxy_order(proxy, rng)[:batch]
    else:
        first = rng.choice(n, size=min(batch, n), replace=False)
    flood_calls = search.flood(search.query(first))
    positives_after_round = [search.found()]
    rounds, idle = 1, int(positives_after_round[0] == 0)
    with one_blas_thread():
        while search.calls < search.budget and (max_rounds is None or rounds < max_rounds):
            ranking = search.ranking(rng, proxy, regularization)
            if ranking is None:
                break
            flood_calls += search.flood(search.query(ranking[:batch]))
            rounds += 1
            positives_after_round.append(search.found())
            idle = idle + 1 if positives_after_round[-1] == positives_after_round[-2] else 0
            if patience is not None and idle >= patience:
                break
    frames = np.flatnonzero(search.oracle.labelled & search.label).astype(np.int64)
    details = {"positives_after_round": positives_after_round, "flood_calls": flood_calls,
               "candidate_pool": candidate_pool,
               "seeded_by": "proxy" if proxy is not None else "random"}
    return RareResult(frames, search.calls, rounds, details)


def one_blas_thread():
    """A block whose BLAS and OpenMP calls run on one thread: the classifier's are small, and
    on 2 cores a FIND RARE on 10k frames took 38-52 ms against 83-243 ms with two
    threads; its scores (and so its answer) then do not depend on the machine's cores."""
    return threadpool_limits(limits=1)


class _Search:
    """One FIND RARE run: the labels so far, the candidates, and the last classifier scores."""

    def __init__(self, emb: np.ndarray, predicate, budget: int, radius: int,
                 seals: _SealsPool | None):
        self.emb, self.n, self.budget, self.radius, self.seals = emb, emb.shape[0], budget, radius, seals
        self.oracle = DistinctOracle(predicate, self.n)
        self.label = np.zeros(self.n, dtype=bool)  # valid where oracle.labelled
        self.scores = None

    @property
    def calls(self) -> int:
        return self.oracle.calls

    def found(self) -> int:
        return int(self.label[self.oracle.labelled].sum())

    def query(self, frames: np.ndarray) -> np.ndarray:
        """Label `frames` (as far as the budget goes); the positives among them."""
        frames = frames[:self.budget - self.oracle.calls]
        if frames.size == 0:
            return frames
        self.label[frames] = as_flags(self.oracle(frames), frames.size)
        if self.seals is not None:
            self.seals.add(frames)
        return frames[self.label[frames]]

    def flood(self, new_positives: np.ndarray) -> int:
        """Label unlabelled neighbours within radius of positives, recursively; the calls."""
        labelled_here = 0
        frontier = new_positives
        while frontier.size and self.oracle.calls < self.budget and self.radius > 0:
            offsets = np.arange(-self.radius, self.radius + 1)
            near = np.unique((frontier[:, None] + offsets[None, :]).ravel())
            near = near[(near >= 0) & (near < self.n)]
            near = near[~self.oracle.labelled[near]]
            # closest to a positive first, in case the budget runs out mid-way
            distance = np.abs(near[:, None] - frontier[None, :]).min(axis=1)
            near = near[np.argsort(distance, kind="stable")]
            before = self.oracle.calls
            frontier = self.query(near)
            labelled_here += self.oracle.calls - before
        return labelled_here

    def ranking(self, rng, proxy: np.ndarray | None, regularization: float) -> np.ndarray | None:
        """Unlabelled candidates, most promising first (None when none is left): by a
        classifier on the embeddings once both classes are seen, else by proxy or at random."""
        labelled = np.flatnonzero(self.oracle.labelled)
        pos = labelled[self.label[labelled]]
        neg = labelled[~self.label[labelled]]
        candidates = ~self.oracle.labelled
        if self.seals is not None:
            candidates &= self.seals.pool
        candidate_frames = np.flatnonzero(candidates)
        if candidate_frames.size == 0:
            return None
        if pos.size and neg.size:
            train_pos = _easy_half(pos, self.scores, self.radius)
            x = np.concatenate([self.emb[train_pos], self.emb[neg]])
            y = np.concatenate([np.ones(train_pos.size), np.zeros(neg.size)])
            from sklearn.linear_model import LogisticRegression  # loads in ~1.5 s: only here

            model = LogisticRegression(C=regularization, class_weight="balanced", max_iter=500)
            model.fit(x, y)
            self.scores = np.full(self.n, -np.inf)
            self.scores[candidate_frames] = model.decision_function(self.emb[candidate_frames])
            self.scores[labelled] = model.decision_function(self.emb[labelled])
            return candidate_frames[proxy_order(self.scores[candidate_frames], rng)]
        if proxy is not None:
            return candidate_frames[proxy_order(proxy[candidate_frames], rng)]
        return rng.permutation(candidate_frames)
