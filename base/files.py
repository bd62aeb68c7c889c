"""Writing a file so that readers see the old file or the whole new one, never a part."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path` to write to; when the block ends without an error it
    replaces `path` in one step, otherwise it is removed. `suffix` ends the temporary name
    (for writers that pick a format by it, e.g. ".npy")."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
