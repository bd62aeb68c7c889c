"""The index's embedding passes leave a CPU network the cores its torch threads need."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

import vidql.indexes.embedders as embedders
from vidql.indexes.network import cpu_threads
from vidql.preprocess.pipeline import cpu_count

from test_index_source import ToyTraffic


@pytest.mark.parametrize("network", [True, False])
def test_a_network_pass_leaves_its_torch_threads_a_core(network, monkeypatch):
    """A decoder per core took the CNN's core (0.75-0.81 of the slower of decode-only and
    forward-only on synthetic traffic, 0.84-0.85 with one decoder beside a 1-thread CNN)."""
    advised = []

    @contextmanager
    def recording(n):
        advised.append(n)
        yield

    monkeypatch.setattr(embedders, "decoder_threads", recording)
    with cpu_threads(1):
        out = embedders.embed_source(ToyTraffic(n_frames=20), lambda b: np.ones((len(b), 2)),
                                     2, size=(64, 36), network=network)
    assert out.shape == (20, 2) and advised == [max(1, cpu_count() - 1) if network else None]
