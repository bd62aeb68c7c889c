"""Clips of a collection: which files a LOAD VIDEO names, what the clips are called, and
how a collection's global frame positions map to (clip, frame).

A collection's frames are numbered by one global position: clip after clip, in the order
they were loaded (`first_frame` of a clip + its frame number). Clips are only appended, so
positions never change; the label cache, the index and the operators all use them.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vidql.base.errors import VideoError

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts",
                  ".y4m", ".h264", ".hevc")
GLOB_CHARS = re.compile(r"[*?\[]")
MAX_GLOB_ENTRIES = 100_000  # a `**` pattern walks at most this many files and folders
_GLOB_TOKENS = re.compile(r"(\*\*/|\*\*|\*|\?|\[!?\]?[^\]]*\])")


def video_paths(source) -> list[Path]:
    """The files a LOAD VIDEO source names, in a stable order: a glob pattern (sorted
    matches), a folder (its video files, sorted), a list of paths (as given) or one file.
    Missing files are kept (probing reports them); a pattern or folder matching nothing is
    a VideoError."""
    if isinstance(source, (list, tuple)):
        return [Path(p).expanduser().resolve() for p in source]
    text = str(source)
    if GLOB_CHARS.search(text):
        pattern = os.path.abspath(Path(text).expanduser())
        matches = _walk_matches(pattern, text) if "**" in pattern else glob.glob(pattern)
        found = sorted({Path(p).resolve() for p in matches if Path(p).is_file()})
        if not found:
            raise VideoError(text, "the pattern matches no file")
        return found
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file()
                       and p.suffix.lower() in VIDEO_SUFFIXES)
        if not found:
            raise VideoError(path, f"the folder holds no video file ({', '.join(VIDEO_SUFFIXES)})")
        return found
    return [path]


def _walk_matches(pattern: str, text: str) -> list[str]:
    """The files under a `**` pattern's fixed leading folder that match it. Each folder is
    entered once (by its real path), so a symlink loop ends; more than MAX_GLOB_ENTRIES
    entries is a VideoError."""
    parts = Path(pattern).parts
    fixed = next(i for i, part in enumerate(parts) if GLOB_CHARS.search(part))
    root, regex = os.path.join(*parts[:fixed]), _glob_regex(pattern)
    seen, entries, found = set(), 0, []
    for folder, dirs, files in os.walk(root, followlinks=True):
        seen.add(os.path.realpath(folder))
        dirs[:] = [d for d in dirs if os.path.realpath(os.path.join(folder, d)) not in seen]
        entries += len(dirs) + len(files)
        if entries > MAX_GLOB_ENTRIES:
            raise VideoError(text, f"the pattern walks more than {MAX_GLOB_ENTRIES} files and "
                                   f"folders under '{root}'; name a narrower folder or pattern")
        found += [p for p in (os.path.join(folder, f) for f in files) if regex.fullmatch(p)]
    return found


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob pattern as a regular expression: `**/` any folders (or none), `**` and `*`
    within the path's rules, `?` one character, `[...]` a class."""
    pieces = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    out = []
    for token in _GLOB_TOKENS.split(pattern):
        if token in pieces:
            out.append(pieces[token])
        elif token.startswith("[") and token.endswith("]") and len(token) > 2:
            out.append("[" + ("^" + token[2:-1] if token[1] == "!" else token[1:-1]) + "]")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out))


def clip_names(paths: list[Path], taken: set[str] = frozenset()) -> list[str]:
    """A name per file, unique within the collection: the file name without its suffix
    (`cam3_0800.mp4` -> `cam3_0800`), with `_2`, `_3`... when two files share it."""
    used = {t.lower() for t in taken}
    names = []
    for path in paths:
        base = path.stem or path.name
        name, k = base, 2
        while name.lower() in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name.lower())
        names.append(name)
    return names


def creation_timestamp(text: str | None) -> pd.Timestamp | None:
    """A container's creation time as a naive UTC timestamp (None when absent or unreadable;
    encoders write 1970-01-01 or 1904-01-01 for 'unknown', which count as absent)."""
    if not text:
        return None
    try:
        ts = pd.Timestamp(text)
    except (ValueError, TypeError):
        return None
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return None if ts.year <= 1970 else ts


@dataclass(frozen=True)
class ClipMap:
    """The clips of a collection in load order: name, first global position, frame count."""

    names: tuple[str, ...]
    first: np.ndarray  # int64, ascending
    counts: np.ndarray  # int64

    @classmethod
    def of(cls, clips: pd.DataFrame) -> "ClipMap":
        """From a catalog clip table (columns clip, first_frame, frame_count; any order)."""
        clips = clips.sort_values("first_frame")
        return cls(tuple(clips["clip"]), clips["first_frame"].to_numpy(np.int64),
                   clips["frame_count"].to_numpy(np.int64))

    @property
    def n_frames(self) -> int:
        return int(self.first[-1] + self.counts[-1]) if len(self.first) else 0

    def ordinals(self, positions: np.ndarray) -> np.ndarray:
        """The clip (its place in load order) of each global position."""
        return np.searchsorted(self.first, positions, side="right") - 1

    def split(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """Global positions -> (clip ordinal, frame within the clip)."""
        positions = np.asarray(positions, dtype=np.int64)
        ordinal = self.ordinals(positions)
        return ordinal, positions - self.first[ordinal]

    def pieces(self, positions):
        """Yield (clip ordinal, frames within the clip, global positions) for ascending
        global `positions`, one piece per clip they touch."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(self.first) == 1:  # one clip: one piece (none for no positions)
            if len(positions):
                yield 0, positions - self.first[0], positions
            return
        ordinal = self.ordinals(positions)
        cuts = np.flatnonzero(np.diff(ordinal)) + 1
        for part in np.split(np.arange(len(positions)), cuts):
            if len(part):
                o = int(ordinal[part[0]])
                yield o, positions[part] - self.first[o], positions[part]

    def gap_coordinates(self, positions: np.ndarray, gap: int) -> np.ndarray:
        """Coordinates in which frames of different clips are always more than `gap` apart
        and frames of one clip keep their distance (LIMIT ... GAP applies within a clip)."""
        ordinal, frames = self.split(positions)
        spread = int(self.counts.max(initial=0)) + int(gap) + 1
        return ordinal * spread + frames

