"""LOAD VIDEO globs are bounded: a symlink loop ends, a huge tree is refused (item 10)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from vidql.base.errors import VideoError
from vidql.engine.labels import clips


def _tree_with_loops(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    for name in ("a.mp4", "sub/b.mp4", "sub/deeper/c.mp4", "sub/notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub" / "loop").symlink_to(tmp_path)
    (tmp_path / "sub" / "deeper" / "up").symlink_to(tmp_path / "sub")
    return tmp_path


def test_a_recursive_glob_over_symlink_loops_ends(tmp_path):
    """Each folder is entered once by its real path; every file is found once. Run in a
    child with a timeout: the unbounded walk did not finish."""
    root = _tree_with_loops(tmp_path)
    code = ("import sys; from vidql.engine.labels.clips import video_paths; "
            "print([p.name for p in video_paths(sys.argv[1])])")
    done = subprocess.run([sys.executable, "-c", code, str(root / "**" / "*.mp4")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['a.mp4', 'b.mp4', 'c.mp4']"


def test_a_glob_walking_too_many_entries_is_refused(tmp_path, monkeypatch):
    for i in range(30):
        (tmp_path / f"v{i}.mp4").write_bytes(b"")
    monkeypatch.setattr(clips, "MAX_GLOB_ENTRIES", 20)
    with pytest.raises(VideoError, match="walks more than 20 files and folders .*narrower"):
        clips.video_paths(str(tmp_path / "**" / "*.mp4"))
    assert len(clips.video_paths(str(tmp_path / "*.mp4"))) == 30  # no ** : no walk
