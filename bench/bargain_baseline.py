"""BARGAIN's recall selector (PyPI `bargain`, Zeighami et al.) as a baseline for the select
bench: `BARGAIN_R` with its default beta = 0, the mode whose guarantee holds (uniform
sampling with replacement, betting tests over proxy-ordered thresholds). Its proxy and
oracle are the bench population's scores and labels, vectorised instead of its per-record
thread pool. None when the package is not installed (`pip install bargain`)."""
from __future__ import annotations

import numpy as np

from vidql.queries import SelectionResult


def bargain_recall(proxy: np.ndarray, label, *, target: float, confidence: float = 0.95,
                   budget: int, seed: int) -> SelectionResult | None:
    """The frames BARGAIN_R returns for a recall `target` at `confidence` with `budget`
    oracle calls; `label(frames) -> bool array`."""
    try:
        from BARGAIN import BARGAIN_R, Oracle, Proxy
    except ImportError:
        return None

    class Scores(Proxy):
        def get_preds_and_scores(self, indxs, data_records):
            # BARGAIN ranks by pred * score + (1 - pred) * (1 - score): the score itself
            return np.ones(len(indxs)), np.asarray(proxy)[np.asarray(indxs, dtype=np.int64)]

    class Labels(Oracle):
        def get_pred(self, data_records, indxs=None):
            frames = np.asarray(indxs, dtype=np.int64)
            self.preds_dict.update(dict.fromkeys(frames.tolist(), True))
            return np.asarray(label(frames), dtype=bool)

    oracle = Labels(verbose=False)
    selector = BARGAIN_R(Scores(verbose=False), oracle, delta=1.0 - confidence, target=target,
                         budget=budget, seed=seed)
    frames = np.sort(np.asarray(selector.process(np.arange(proxy.size)), dtype=np.int64))
    calls = oracle.get_number_preds()
    # verified: labelled positive (BARGAIN also keeps the labelled negatives above its cut)
    verified = np.isin(frames, np.fromiter(oracle.preds_dict, dtype=np.int64, count=calls))
    verified[verified] = np.asarray(label(frames[verified]), dtype=bool)
    return SelectionResult(frames, calls, verified, {"method": "BARGAIN_R (beta = 0)"})
