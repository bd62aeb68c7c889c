"""Oracle kinds of `CREATE ORACLE name FROM <kind> 'source' WITH (...)` and their factory."""
from __future__ import annotations

import hashlib
import importlib
import inspect
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd

from vidql.base.errors import OracleError
from vidql.base.detections import FLOAT_COLUMNS, DetectionArrays, detections_frame
from vidql.engine.labels.oracle_api import Oracle, file_digest, label_vocabulary
from vidql.base.ranges import BATCH_SIZE, Bounds
from vidql.engine.sql.sqlnames import ORACLE_KINDS
from vidql import datasets
from vidql.engine.labels.oracle_models import OnnxDetector, TorchvisionDetector

COST_MS = Bounds(0.0)                     # simulated milliseconds per frame


EXACT_DTYPES = (np.int8, np.int16, np.int32, np.float32)  # tried in order by `narrowest_exact`


def narrowest_exact(values: np.ndarray) -> np.ndarray:
    """`values` in the first of EXACT_DTYPES narrower than theirs that holds every value bit
    for bit (so `astype` back gives exactly `values`), else `values` unchanged."""
    if not len(values):
        return values
    low, high = values.min(), values.max()
    for dtype in EXACT_DTYPES:
        if np.dtype(dtype).itemsize >= values.dtype.itemsize:
            break
        if np.issubdtype(dtype, np.integer) and not (np.iinfo(dtype).min <= low
                                                      and high <= np.iinfo(dtype).max):
            continue
        narrow = values.astype(dtype)
        back = narrow.astype(values.dtype)
        if np.array_equal(back.view(f"u{back.itemsize}"), values.view(f"u{values.itemsize}")):
            return narrow
    return values


TABLES_KEPT = 2  # label files kept loaded per process, most recently used first


class LabelTable:
    """A label file's rows sorted by (clip, frame), found by binary search, each column read
    on its own and kept in the narrowest dtype that holds its values exactly (labels as
    codes; score and box stacked as `values` in one dtype that holds them all): 15 bytes a
    detection with whole-pixel boxes instead of a DataFrame's 50.
    `digest` hashes the file's bytes. Read-only once loaded, so oracles share it (`of`)."""

    _loaded: OrderedDict = OrderedDict()  # (path, size, mtime, inode) -> LabelTable

    def __init__(self, path: Path):
        columns = datasets.read_label_columns(path)
        order = self._sort(columns)
        floats = {}
        for name, values in columns:
            if name == "label":
                self.label_names = tuple(str(c) for c in values.categories)
                self.codes = narrowest_exact(values.codes[order])
            else:
                floats[name] = narrowest_exact(values[order])
        # score and box of each row in one dtype that holds them all (whole-pixel boxes:
        # int16), so a lookup takes rows at once and hands them on as they are
        self.values = np.empty((len(order), len(FLOAT_COLUMNS)),
                               dtype=np.result_type(*(floats[c] for c in FLOAT_COLUMNS)))
        for i, name in enumerate(FLOAT_COLUMNS):
            self.values[:, i] = floats.pop(name)
        self.digest = file_digest(path)

    @classmethod
    def of(cls, path: str | Path) -> "LabelTable":
        """The table of the file at `path`, loaded once per process while its size, time
        and inode stay the same (each new connection's oracle would otherwise read and hash
        the whole file again); the TABLES_KEPT most recently used are kept."""
        path = Path(path)
        try:
            st = path.stat()
        except OSError:
            return cls(path)  # says why the file cannot be read
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        table = cls._loaded.pop(key, None) or cls(path)
        cls._loaded[key] = table  # the most recently used last
        while len(cls._loaded) > TABLES_KEPT:
            cls._loaded.popitem(last=False)
        return table

    def _sort(self, columns) -> np.ndarray:
        """Read the clip (when present) and frame columns from `columns`: sets `clips`,
        `spans` (each clip's rows) and `frames`; returns the row order (file order within
        a frame)."""
        name, values = next(columns)
        clip = None
        if name == "clip":
            clip, (name, values) = values, next(columns)
        names = list(clip.categories) if clip is not None else [""]
        self.clips = sorted(names) if clip is not None else None
        codes = clip.codes if clip is not None else np.zeros(len(values), dtype=np.int8)
        order = np.lexsort((values, codes))
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        self.spans = dict(zip(names, zip(bounds[:-1], bounds[1:], strict=True), strict=True))
        self.frames = narrowest_exact(values[order])
        return order


class LabelsOracle(Oracle):
    """Answers from a table of detections (CSV or Parquet), e.g. ground truth or labels a
    detector made earlier. `cost_ms` states a simulated cost per frame for reports and
    EXPLAIN; nothing sleeps."""

    needs_pixels = False

    def __init__(self, name: str, path: str | Path, *, cost_ms: float | None = None,
                 batch_size: int = 256):
        cost_ms = None if cost_ms is None else COST_MS.check("LABELS option cost_ms", cost_ms)
        batch_size = BATCH_SIZE.check("option batch_size", batch_size)
        self._table = LabelTable.of(path)
        self.clips = self._table.clips
        self.name, self.batch_size, self.simulated_cost_ms = name, batch_size, cost_ms
        self.nearly_free = cost_ms is None  # a stated cost stands in for a model's
        self.identity = f"labels:{name}:{self._table.digest}"
        self.labels = label_vocabulary(self._table.label_names)
        self.sources = (Path(path),)

    def check_clips(self, clips: tuple[str, ...]) -> None:
        """A file without a clip column labels one clip; one with a clip column must name
        every clip of the video, with detections or with a row with an empty label (labelled,
        nothing found): a clip it lacks was not labelled, and counting it as zero detections
        would be silently wrong."""
        if self.clips is None and len(clips) > 1:
            raise OracleError(f"label file of oracle {self.name!r} has no 'clip' column, so it "
                              f"cannot tell the {len(clips)} clips of a collection apart: add a "
                              f"clip column naming each row's clip")
        if self.clips is None:
            return
        if not set(clips) & set(self.clips):
            raise OracleError(f"label file of oracle {self.name!r} names none of the video's "
                              f"clips ({', '.join(clips[:5])}); its clips are "
                              f"{', '.join(self.clips[:5])}")
        missing = [c for c in clips if c not in set(self.clips)]
        if missing:
            raise OracleError(
                f"label file of oracle {self.name!r} has no rows for clip(s) "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} of the video, so "
                f"they were not labelled: add their detections, or, for a clip labelled with "
                f"nothing found, a row with the clip's name and an empty label (e.g. "
                f"'{missing[0]},,,,,,,'; write_labels(..., clips=...) writes them), then CREATE "
                f"OR REPLACE ORACLE {self.name}")

    def detect(self, frames, frame_ids: np.ndarray) -> pd.DataFrame:
        if self.clips is not None and len(self.clips) != 1:
            raise OracleError(f"label file of oracle {self.name!r} holds {len(self.clips)} "
                              f"clips; name the clip (detect_in_clip)")
        clip = self.clips[0] if self.clips else ""
        return self.detect_in_clip(frames, frame_ids, clip, True).to_frame()

    def detect_in_clip(self, frames, frame_ids: np.ndarray, clip: str,
                       only_clip: bool) -> DetectionArrays:
        """Rows of (clip, frame) when the file has a clip column, else of frame: a file
        without one labels a single-file video, but cannot tell a collection's clips apart."""
        if self.clips is None and not only_clip:
            raise OracleError(f"label file of oracle {self.name!r} has no 'clip' column, so it "
                              f"cannot label clip {clip!r} of a collection: add a clip column "
                              f"naming each row's clip")
        lo, hi = self._table.spans.get(clip if self.clips is not None else "", (0, 0))
        ids = self._keys(np.asarray(frame_ids, dtype=np.int64))
        frames = self._table.frames[lo:hi]
        first = lo + np.searchsorted(frames, ids, side="left")
        count = lo + np.searchsorted(frames, ids, side="right") - first
        rows = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
        return self._rows(rows)

    def _keys(self, ids: np.ndarray) -> np.ndarray:
        """`ids` in the dtype of the table's frames when they fit (wider keys make every
        search copy the whole column)."""
        dtype = np.iinfo(self._table.frames.dtype)
        fits = not len(ids) or (dtype.min <= ids.min() and ids.max() <= dtype.max)
        return ids.astype(self._table.frames.dtype) if fits else ids

    def _rows(self, rows: np.ndarray) -> DetectionArrays:
        """Detections at sorted positions `rows`."""
        table = self._table
        return DetectionArrays(table.frames[rows].astype(np.int64),
                               table.codes[rows].astype(np.int32), table.label_names,
                               table.values[rows])


class PythonOracle(Oracle):
    """Wraps `module:callable`. The callable (or a class instantiated with the WITH options)
    maps a uint8 RGB batch N×H×W×3 to one list per frame of (label, score, x1, y1, x2, y2)."""

    def __init__(self, name: str, target: str, **options):
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise OracleError(f"PYTHON oracle source must be 'module:callable', got {target!r}")
        try:
            module = _import_current(module_name)
        except Exception as exc:
            raise OracleError(f"cannot import module {module_name!r} for oracle {name!r}: {exc}") from None
        obj = getattr(module, attr, None)
        if obj is None:
            raise OracleError(f"module {module_name!r} has no attribute {attr!r}")
        batch_size = BATCH_SIZE.check("option batch_size", options.pop("batch_size", 8))
        if inspect.isclass(obj):
            obj = obj(**options)
        elif options:
            raise OracleError(f"oracle {name!r}: options {sorted(options)} need a class, "
                              f"but {target!r} is a function")
        self.fn = getattr(obj, "detect", obj)
        if not callable(self.fn):
            raise OracleError(f"{target!r} is not callable and has no detect method")
        source = inspect.getsourcefile(module)
        digest = file_digest(source) if source else hashlib.sha256(target.encode()).hexdigest()[:16]
        version = getattr(obj, "version", "")
        self.name, self.batch_size = name, batch_size
        self.identity = f"python:{target}:{digest}:{version}:{sorted(options.items())}"
        self.sources = (Path(source),) if source else ()

    def detect(self, frames: np.ndarray, frame_ids: np.ndarray) -> pd.DataFrame:
        per_frame = self.fn(frames)
        if len(per_frame) != len(frame_ids):
            raise OracleError(f"oracle {self.name!r} returned {len(per_frame)} results for "
                              f"{len(frame_ids)} frames")
        return detections_frame([(int(f), str(d[0]), *map(float, d[1:6]))
                                 for f, dets in zip(frame_ids, per_frame, strict=True) for d in dets])


_MODULE_DIGESTS: dict[str, str] = {}  # module name -> digest of the source it was imported from


def _import_current(module_name: str):
    """Import a module, re-importing it when its source file changed since it was imported
    (so CREATE OR REPLACE ORACLE runs the code whose digest the new identity has)."""
    module = importlib.import_module(module_name)
    source = inspect.getsourcefile(module)
    if source:
        digest = file_digest(source)
        if _MODULE_DIGESTS.setdefault(module_name, digest) != digest:
            module = importlib.reload(module)
            _MODULE_DIGESTS[module_name] = digest
    return module


def absolute_source(kind: str, source: str, options: dict) -> tuple[str, dict]:
    """The source (and `weights` option) of an oracle as absolute paths where they name
    files, so the catalog works from any working directory."""
    options = dict(options)
    if kind.upper() in ("ONNX", "LABELS"):
        source = str(Path(source).expanduser().absolute())
    if kind.upper() == "TORCHVISION" and isinstance(options.get("weights"), str):
        options["weights"] = str(Path(options["weights"]).expanduser().absolute())
    return source, options


def changed_sources(old_identity: str, oracle: Oracle) -> list[str]:
    """The source files of `oracle` whose digest is not part of `old_identity`."""
    return [str(p) for p in oracle.sources if file_digest(p) not in old_identity]


def make_oracle(name: str, kind: str, source: str, options: dict | None = None) -> Oracle:
    """Build an oracle from its catalog entry (kind is one of ORACLE_KINDS)."""
    options = dict(options or {})
    options.pop("num_gpus", None)  # where the Ray executor runs it (engine.ray_executor)
    kind = kind.upper()
    builders = {"LABELS": LabelsOracle, "PYTHON": PythonOracle, "ONNX": OnnxDetector,
                "TORCHVISION": TorchvisionDetector}  # their libraries load when one is built
    if kind not in builders:
        raise OracleError(f"unknown oracle kind {kind!r}; use one of {', '.join(ORACLE_KINDS)}")
    try:
        oracle = builders[kind](name, source, **options)
    except TypeError as exc:
        allowed = [p for p in inspect.signature(builders[kind]).parameters if p not in ("name",)]
        raise OracleError(f"bad options for {kind} oracle {name!r}: {exc}; "
                          f"allowed: {', '.join(allowed[1:])}") from None
    if kind == "ONNX" and not oracle.sources:
        oracle.sources = (Path(source),)
    return oracle
