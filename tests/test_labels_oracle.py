"""The LABELS oracle keeps its table compactly (each column in the narrowest dtype that holds
its values exactly, labels as codes) and answers exactly what the file says."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd

from vidql.datasets import write_labels
from vidql.engine.labels.oracle_kinds import LabelsOracle, narrowest_exact


def pixel_boxes(n_rows: int, n_frames: int, seed: int = 0) -> pd.DataFrame:
    """Detections with whole-pixel boxes and score 1, like a label file of ground truth."""
    rng = np.random.default_rng(seed)
    x1, y1 = rng.integers(0, 300, n_rows), rng.integers(0, 160, n_rows)
    return pd.DataFrame({"frame": rng.integers(0, n_frames, n_rows),
                         "label": rng.choice(["car", "bus", "person"], n_rows), "score": 1.0,
                         "x1": x1, "y1": y1, "x2": x1 + rng.integers(1, 20, n_rows),
                         "y2": y1 + rng.integers(1, 20, n_rows)})


def test_the_table_of_whole_pixel_boxes_takes_under_20_bytes_a_detection(tmp_path):
    n_rows = 400_000
    write_labels(pixel_boxes(n_rows, 50_000), tmp_path / "t.parquet")
    tracemalloc.start()
    try:
        oracle = LabelsOracle("t", tmp_path / "t.parquet")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held / n_rows < 20, held / n_rows  # a DataFrame of the columns holds 49
    assert len(oracle.detect(None, np.arange(50_000))) == n_rows


def test_every_value_comes_back_bit_for_bit(tmp_path):
    table = pixel_boxes(3000, 400, seed=1)
    rng = np.random.default_rng(2)
    table["score"] = rng.random(len(table))  # needs float64
    table["x1"] = table["x1"] + 0.5  # float32 holds it
    table["y2"] = np.where(rng.random(len(table)) < 0.5, -0.0, 1e12)  # keeps its sign; no int32
    write_labels(table, tmp_path / "t.csv")
    oracle = LabelsOracle("t", tmp_path / "t.csv")
    ids = np.array([399, 5, 0, 5000, 17])
    got = oracle.detect(None, ids)
    want = pd.concat([table[table["frame"] == f] for f in ids], ignore_index=True)
    assert got["label"].tolist() == want["label"].tolist()
    for column in ["frame", "score", "x1", "y1", "x2", "y2"]:
        assert got[column].dtype == want[column].astype("float64").dtype or column == "frame"
        np.testing.assert_array_equal(got[column].to_numpy().view(np.int64),
                                      want[column].to_numpy(dtype=got[column].dtype).view(np.int64))


def test_narrowest_exact_dtype():
    cases = {(1.0, 0.0, 120.0): np.int8, (1.0, 300.0): np.int16, (1.0, 2.0**20): np.int32,
             (0.5, 1.0): np.float32, (-0.0, 1.0): np.float32, (0.1,): np.float64,
             (1e12,): np.float64}
    for values, dtype in cases.items():
        values = np.array(values)
        narrow = narrowest_exact(values)
        assert narrow.dtype == dtype, values
        assert narrow.astype(np.float64).tobytes() == values.tobytes()
    assert narrowest_exact(np.array([5, 70_000], dtype=np.int64)).dtype == np.int32
    assert narrowest_exact(np.array([], dtype=np.float64)).dtype == np.float64


def test_a_label_file_is_read_once_per_process_until_it_changes(tmp_path, monkeypatch):
    """Every connection builds its oracles anew; the file's table is read (and hashed) once
    while its size and time stay the same, and read again, with a new identity, after."""
    import vidql.datasets

    reads = []
    real = vidql.datasets.read_label_columns
    monkeypatch.setattr(vidql.datasets, "read_label_columns",
                        lambda path: reads.append(path) or real(path))
    path = tmp_path / "t.parquet"
    write_labels(pixel_boxes(500, 100), path)
    first, second = LabelsOracle("a", path), LabelsOracle("b", path, batch_size=8)
    assert len(reads) == 1 and first.identity.split(":")[-1] == second.identity.split(":")[-1]
    pd.testing.assert_frame_equal(first.detect(None, np.arange(100)),
                                  second.detect(None, np.arange(100)))
    write_labels(pixel_boxes(500, 100, seed=3), path)
    third = LabelsOracle("a", path)
    assert len(reads) == 2 and third.identity != first.identity
    assert not third.detect(None, np.arange(100)).equals(first.detect(None, np.arange(100)))
