"""The index's embedding passes decode beside a CPU network on what it leaves: a decoder per
core, each at lower priority than the network's thread."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import vidql.indexes.embedders as embedders
from vidql.indexes.network import DECODER_NICE, cpu_threads
from vidql.preprocess.concat import LowResSource
from vidql.preprocess.pipeline import cpu_count
from vidql.preprocess.probe import probe_video


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
@pytest.mark.parametrize("network", [True, False])
def test_a_network_pass_decodes_on_what_the_network_leaves(network, counter_clip):
    """One decoder beside a 1-thread CNN left a decode-bound clip at half the decoding rate
    (indoor_people 0.48-0.49 of the slower stage); a decoder per core at normal priority took
    the CNN's core. Decoders per core at lower priority: 0.62-0.92 on the four clips."""
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def embed(batch):
        for thread in threading.enumerate():
            if thread.name.startswith("vidql-decode") and thread.native_id is not None:
                try:
                    seen[thread.name] = os.getpriority(os.PRIO_PROCESS, thread.native_id)
                except OSError:  # ended meanwhile
                    pass
        return np.ones((len(batch), 2))

    source = LowResSource(probe_video(counter_clip))
    with cpu_threads(1):
        out = embedders.embed_source(source, embed, 2, size=(32, 18), batch_size=8,
                                     network=network)
    assert out.shape == (source.n_frames, 2) and 1 <= len(seen) <= cpu_count()
    assert set(seen.values()) == {mine + DECODER_NICE if network else mine}


def test_cpu_threads_gives_torch_its_threads_and_blas_one():
    from threadpoolctl import threadpool_info

    torch_lib = str(Path(torch.__file__).parent)
    with cpu_threads(2):
        pools = threadpool_info()
        torch_pools = [p for p in pools if p["filepath"].startswith(torch_lib)]
        assert torch_pools and all(p["num_threads"] == 2 for p in torch_pools if p["user_api"] == "openmp")
        assert all(p["num_threads"] == 1 for p in pools if p["user_api"] == "blas")
