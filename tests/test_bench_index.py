"""The index bench's ceiling measures: the learning curve of the default index over label
budgets, and the reference proxy that knows the truth of a frame's neighbours only."""
import numpy as np
import pytest
from test_index_efficientnet import needs_weights
from test_index_source import ToyTraffic

from vidql.bench.scenarios_index import (VIDQL, ceiling_note, ceiling_rows, learning_curve,
                                         neighbour_ceiling, neighbour_truth)
from vidql.engine.sql.framestat import evaluate


def test_neighbour_truth_averages_the_frames_beside_each_frame_but_not_the_frame():
    truth = np.array([0.0, 4.0, 0.0, 2.0])
    assert neighbour_truth(truth, 1).tolist() == [4.0, 0.0, 3.0, 0.0]
    assert neighbour_truth(truth, 2).tolist() == pytest.approx([2.0, 2 / 3, 2.0, 2.0])


def test_neighbour_ceiling_is_perfect_on_steady_truth_and_worst_on_flicker():
    steady = np.repeat([0, 1, 0, 3], 25)
    flicker = np.tile([0, 1], 50)
    out = neighbour_ceiling({"steady": steady, "flicker": flicker},
                            {"steady": "rho", "flicker": "auc"})
    assert list(out) == [1, 2, 5]
    assert out[1]["steady"] > 0.85 and out[1]["flicker"] == 0.0


class SizedToy(ToyTraffic):
    def proxy_size(self, short_side=None):
        return (96, 64)


@needs_weights
def test_learning_curve_builds_each_budget_up_to_half_the_frames_and_reuses_known_ones():
    toy = SizedToy(n_frames=240, width=96, height=64, seed=3)
    stats = {"objects('car')": "rho", "contains('car')": "auc"}
    truths = {e: evaluate(e, toy.labels, np.arange(toy.n_frames)) for e in stats}
    known = {50: {"objects('car')": 0.5, "contains('car')": 0.5}}
    curve = learning_curve(toy, toy.labels, stats, truths, seed=0, known=known)
    assert list(curve) == [50, 100] and curve[50] == known[50]  # 200 > 240 // 2
    assert curve[100]["objects('car')"] > 0.5
    rows = ceiling_rows("toy", {"learning_curve": curve,
                                 "neighbour_truth": neighbour_ceiling(truths, stats)}, stats)
    assert [r["measure"] for r in rows][:2] == [
        "Spearman rho objects('car') at 50/100 labels",
        "Spearman rho objects('car') of the truth at t-w..t+w without t, w = 1/2/5"]
    assert rows[0][VIDQL] == "0.5 / " + str(curve[100]["objects('car')"])




def test_theceiling_note_names_predicates_in_3_to_30_percent_of_frames_and_flags_flicker():
    figures = {"base_rates": {"objects('car')": 1.0, "contains('person')": 0.12,
                              "contains('car')": 1.0},
               "learning_curve": {50: {"contains('person')": 0.94},
                                  100: {"contains('person')": 0.96}},
               "neighbour_truth": {1: {"contains('person')": 0.9},
                                   5: {"contains('person')": 0.93}}}
    assert ceiling_note("clip", figures) == (
        "ceiling, clip: AUC contains('person') (12% of frames) 0.94 / 0.96 at 50/100 labels; "
        "the truth beside each frame, w = 1/5: 0.9 / 0.93 (below 0.95 at every w).")
