"""The TASTI index over a real encoded video: synthetic traffic decoded by FrameReader."""
import numpy as np
import pytest
from scipy.stats import spearmanr
from test_index_source import CountingOracle

from vidql import datasets
from vidql.engine.sql.framestat import evaluate
from vidql.indexes import TastiIndex
from vidql.preprocess import frames as frames_module
from vidql.engine.sql.framestat import frame_statistic

N_FRAMES = 1500


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    path = tmp_path_factory.mktemp("traffic") / "traffic.mp4"
    truth = datasets.generate_traffic(path, N_FRAMES, seed=3)
    return path, truth


def test_index_over_decoded_video_ranks_car_counts(traffic):
    path, truth = traffic
    oracle = CountingOracle(truth)
    with frames_module.FrameReader(path) as source:
        index = TastiIndex.build(source, oracle, train=60, reps=120, seed=0, triplets=2000,
                                 size=(64, 36), progress=False)
    assert index.n_frames == N_FRAMES and oracle.calls == 120
    cars = evaluate("objects('car')", truth, np.arange(N_FRAMES))
    proxy = index.proxy(frame_statistic("objects('car')"))
    held_out = np.setdiff1d(np.arange(N_FRAMES), index.rep_frames)
    assert np.array_equal(proxy[index.rep_frames], cars[index.rep_frames])
    rho = spearmanr(proxy[held_out], cars[held_out])[0]
    assert rho >= 0.8, rho  # random order: |rho| < 0.06 at this size
