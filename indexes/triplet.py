"""Triplet training on oracle labels: which labelled frames are "close", how triplets are
drawn, and the training loop of the compact embedding network."""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .network import CompactCNN, to_tensor, torch_device

HELD_OUT_PART = 64  # held-out triplets scored at once (256: 70-115 MB more peak RSS)


def label_closeness(labels: pd.DataFrame, frames: np.ndarray, *, box_tol: float = 1.0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Class counts (T×C int) and closeness (T×T bool) of labelled `frames`.

    Two frames are close when they have the same count per class and, per class, the
    Hausdorff distance between their box centres is at most `box_tol` times the median
    box diagonal of all these labels (a scale-free tolerance)."""
    frames = np.asarray(frames, dtype=np.int64)
    t = len(frames)
    row_of = pd.Series(np.arange(t), index=frames)
    det = labels[labels["frame"].isin(frames)]
    classes = np.sort(det["label"].unique()).astype(object)
    rows = row_of.loc[det["frame"].to_numpy()].to_numpy()
    cls = np.searchsorted(classes, det["label"].to_numpy()) if len(det) else np.empty(0, int)
    counts = np.zeros((t, len(classes)), dtype=np.int64)
    np.add.at(counts, (rows, cls), 1)
    close = np.zeros((t, t), dtype=bool)
    if len(det):
        w = (det["x2"] - det["x1"]).to_numpy()
        h = (det["y2"] - det["y1"]).to_numpy()
        tol = box_tol * max(float(np.median(np.hypot(w, h))), 1e-9)
        centres = np.stack([(det["x1"] + det["x2"]).to_numpy(), (det["y1"] + det["y2"]).to_numpy()],
                           axis=1) / 2.0
    _, group = np.unique(counts, axis=0, return_inverse=True)
    for g in np.unique(group):
        members = np.flatnonzero(group == g)
        ok = np.ones((len(members), len(members)), dtype=bool)
        for k in np.flatnonzero(counts[members[0]]):
            sel = cls == k
            order = np.argsort(rows[sel], kind="stable")
            member_rows = rows[sel][order]
            keep = np.isin(member_rows, members)
            pts = centres[sel][order][keep].reshape(len(members), counts[members[0], k], 2)
            ok &= _hausdorff_within(pts, tol)
        close[np.ix_(members, members)] = ok
    return counts, close


def _hausdorff_within(pts: np.ndarray, tol: float, budget: int = 1 << 22) -> np.ndarray:
    """G×G bool: symmetric Hausdorff distance between point sets pts[i], pts[j] (G×c×2) ≤ tol."""
    g, c, _ = pts.shape
    out = np.empty((g, g), dtype=bool)
    step = max(1, budget // max(1, g * c * c))
    for start in range(0, g, step):
        a = pts[start:start + step]
        d = np.linalg.norm(a[:, None, :, None, :] - pts[None, :, None, :, :], axis=-1)
        h = np.maximum(d.min(axis=3).max(axis=2), d.min(axis=2).max(axis=2))
        out[start:start + step] = h <= tol
    return out


def sample_triplets(close: np.ndarray, counts: np.ndarray, times: np.ndarray,
                    rng: np.random.Generator, *, min_gap: int = 30, near_fraction: float = 0.5
                    ) -> np.ndarray:
    """One (anchor, positive, negative) row per anchor that has a negative, anchors in
    random order.

    Positives are close frames more than `min_gap` frames away in time when there are any,
    else any other close frame, else the anchor itself. Negatives are frames that are not
    close: with probability `near_fraction` one whose class counts are nearest to the
    anchor's (L1), so the embedding separates counts that differ by one; else uniform."""
    t = len(close)
    count_gap = np.zeros((t, t), dtype=np.int64)
    for column in counts.T:
        count_gap += np.abs(column[:, None] - column[None, :])
    time_gap = np.abs(times[:, None] - times[None, :])
    rows = []
    for a in rng.permutation(t):
        negatives = np.flatnonzero(~close[a])
        if not len(negatives):
            continue
        candidates = close[a].copy()
        candidates[a] = False
        far = candidates & (time_gap[a] > min_gap)
        pool = np.flatnonzero(far if far.any() else candidates)
        p = rng.choice(pool) if len(pool) else a
        if rng.random() < near_fraction:
            gaps = count_gap[a, negatives]
            negatives = negatives[gaps == gaps.min()]
        rows.append((a, p, rng.choice(negatives)))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def train_triplet_network(images: np.ndarray, close: np.ndarray, counts: np.ndarray,
                          times: np.ndarray, *, dim: int = 128, triplets: int = 12_000,
                          batch_size: int = 32, lr: float = 1e-3, margin: float = 1.0,
                          count_weight: float = 30.0, jitter: bool = True, seed: int = 0,
                          holdout: float = 0.15, min_held_out: int = 8, patience: int = 3,
                          min_window: int = 2000, progress: bool = True
                          ) -> tuple[CompactCNN, dict]:
    """Train a CompactCNN on `images` (uint8 T×H×W×3) with triplet loss for at most
    `triplets` triplets; returns the network and training figures.

    Early stopping, when the `holdout` share is at least `min_held_out` frames: that share
    is never trained on (on 10k traffic frames with 150 training frames, holding out 22
    and keeping the best network gave car-count rho 0.88 where training on all 150 gave
    0.80 in one run and 0.89 in another: the selection steadies the result), and its
    triplets (anchor held out, positive and negative from any frame) are scored after
    every pass over the training frames; training stops when the best held-out loss has
    not improved by 1% for `patience` passes (and `min_window` triplets), and the network
    with the best held-out loss is returned.

    With `count_weight` > 0, a linear head on the embedding also regresses each frame's
    standardised log class counts (a training-only auxiliary loss), which orders the
    embedding by counts and so keeps neighbours' counts alike. With `jitter`, each image's
    brightness and contrast are varied at random, so lighting alone cannot separate frames.
    Seeded by `seed` without touching torch's global random state."""
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    device = torch_device()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CompactCNN(out_dim=dim).to(device)
        head = torch.nn.Linear(dim, counts.shape[1]).to(device)
    optimiser = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=lr)
    objective = _Objective(model, head, to_tensor(images, device), _count_target(counts).to(device),
                           margin, count_weight, generator)
    train, held = _split(counts, rng, holdout, min_held_out)
    held_triplets = _held_out_triplets(close, counts, times, held, rng)
    sub_close, sub_counts, sub_times = close[np.ix_(train, train)], counts[train], times[train]
    seen, losses, best, stale = 0, [], (np.inf, None, 0), False
    with tqdm(total=triplets, desc="triplet training", unit="triplet", disable=not progress) as bar:
        while seen < triplets and not stale:
            epoch = train[sample_triplets(sub_close, sub_counts, sub_times, rng)]
            if not len(epoch):
                break
            model.train()
            for batch in _batches(epoch, batch_size, triplets - seen):
                losses.append(objective.step(batch, optimiser, jitter))
                seen += len(batch)
                bar.update(len(batch))
            if len(held_triplets):
                model.eval()
                held_loss = objective.held_out(held_triplets)
                if held_loss < 0.99 * best[0]:
                    best = (held_loss, copy.deepcopy(model.state_dict()), seen)
                stale = (seen - best[2]) >= max(patience * len(train), min_window)
    if best[1] is not None:
        model.load_state_dict(best[1])
    model.eval()
    tail = losses[-max(1, len(losses) // 10):] if losses else [float("nan")]
    return model, {"triplets": seen, "final_loss": float(np.mean(tail)),
                   "held_out_loss": None if best[1] is None else best[0],
                   "best_at_triplets": best[2] if best[1] is not None else seen,
                   "held_out_frames": len(held)}


class _Objective:
    """The training loss of a batch of (anchor, positive, negative) frame rows: triplet
    loss on the embeddings plus, with `count_weight` > 0, the count head's regression."""

    def __init__(self, model: CompactCNN, head: torch.nn.Linear, x: torch.Tensor,
                 target: torch.Tensor, margin: float, count_weight: float,
                 generator: torch.Generator):
        self.model, self.head, self.x, self.target = model, head, x, target
        self.count_weight, self.generator = count_weight, generator
        self.triplet_loss = torch.nn.TripletMarginLoss(margin=margin)

    def __call__(self, rows: np.ndarray, augment: bool) -> torch.Tensor:
        batch = torch.from_numpy(rows).to(self.x.device)
        frames = batch.reshape(-1)
        inputs = random_lighting(self.x[frames], self.generator) if augment else self.x[frames]
        z = self.model(inputs)
        zt = z.view(len(batch), 3, -1)
        loss = self.triplet_loss(zt[:, 0], zt[:, 1], zt[:, 2])
        if self.count_weight > 0 and self.target.shape[1]:
            loss = loss + self.count_weight * torch.nn.functional.mse_loss(self.head(z),
                                                                           self.target[frames])
        return loss

    def step(self, rows: np.ndarray, optimiser: torch.optim.Optimizer, augment: bool) -> float:
        """One optimiser step on the batch; its loss."""
        loss = self(rows, augment)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        return loss.item()

    def held_out(self, triplets: np.ndarray) -> float:
        """Mean loss over held-out triplets (in parts of HELD_OUT_PART), without
        augmentation."""
        with torch.inference_mode():
            parts = np.array_split(triplets, -(-len(triplets) // HELD_OUT_PART))
            return float(np.mean([float(self(part, False)) for part in parts]))


def _count_target(counts: np.ndarray) -> torch.Tensor:
    """Standardised log class counts per frame: the auxiliary regression's target."""
    target = np.log1p(counts.astype(np.float32))
    return torch.from_numpy((target - target.mean(axis=0)) / np.maximum(target.std(axis=0), 1e-6))


def _batches(epoch: np.ndarray, size: int, left: int):
    """Batches of `size` triplets of `epoch` until `left` triplets are given; a last
    batch of one is skipped (BatchNorm needs more than one sample)."""
    for start in range(0, len(epoch), size):
        batch = epoch[start:start + size]
        if len(batch) < 2:
            continue
        yield batch
        left -= len(batch)
        if left <= 0:
            return


def _split(counts: np.ndarray, rng: np.random.Generator, holdout: float, min_held_out: int,
           rare: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) frame rows: a random `holdout` share held out when that is at
    least `min_held_out` frames and leaves 16 to train on, else none. Frames showing a
    class seen in fewer than a `rare` share of the frames always train (few examples)."""
    t = len(counts)
    n_held = int(round(holdout * t))
    rare_class = (counts > 0).mean(axis=0) < rare
    eligible = np.flatnonzero(~(counts[:, rare_class] > 0).any(axis=1))
    if n_held < max(1, min_held_out) or t - n_held < 16 or len(eligible) < n_held:
        return np.arange(t), np.empty(0, dtype=np.int64)
    held = np.sort(rng.choice(eligible, size=n_held, replace=False))
    return np.setdiff1d(np.arange(t), held), held


def _held_out_triplets(close, counts, times, held: np.ndarray, rng: np.random.Generator,
                       passes: int = 4) -> np.ndarray:
    """Triplets whose anchors are the held-out frames (`passes` draws per anchor)."""
    if not len(held):
        return np.empty((0, 3), dtype=np.int64)
    anchor = np.zeros(len(close), dtype=bool)
    anchor[held] = True
    rows = [r[anchor[r[:, 0]]] for r in (sample_triplets(close, counts, times, rng)
                                         for _ in range(passes))]
    return np.concatenate(rows)


def random_lighting(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random per-image contrast (×0.6–1.4) and brightness (±0.4 std) on normalised images;
    `generator` (a CPU torch.Generator) makes it reproducible."""
    n = len(x)
    gain = torch.rand(n, 1, 1, 1, generator=generator).to(x.device) * 0.8 + 0.6
    shift = torch.rand(n, 1, 1, 1, generator=generator).to(x.device) * 0.8 - 0.4
    return x * gain + shift
