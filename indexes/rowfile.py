"""Embeddings on disk: a float32 `.npy` in an unlinked temporary file, written a block of
rows at a time and read a block at a time through the page cache, so however many frames
a video has, the rows never count as this process's memory. `row_blocks` walks an array
in memory or a RowFile alike."""
from __future__ import annotations

import os
import tempfile
from typing import Iterator

import numpy as np

BLOCK_BYTES = 16 << 20  # rows read per block by `row_blocks`
COPY_BYTES = 16 << 20


class RowFile:
    """An n×dim array kept in a temporary `.npy` file (unlinked: gone when closed). Assigning
    consecutive rows writes them, indexing (`x[a:b]`, `x[i]`, `x[rows]`) reads rows into
    memory, `array()` maps it read-only and `copy_to` writes the whole `.npy` elsewhere."""

    ndim = 2

    def __init__(self, n_rows: int, dim: int, dtype=np.float32):
        self.shape, self.dtype = (int(n_rows), int(dim)), np.dtype(dtype)
        self.file = tempfile.TemporaryFile()
        np.lib.format.write_array_header_1_0(self.file, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
            "shape": self.shape})
        self.file.flush()
        self.offset = self.file.tell()
        self.row_bytes = self.shape[1] * self.dtype.itemsize
        self.size = self.offset + self.shape[0] * self.row_bytes
        self.file.truncate(self.size)

    def __len__(self) -> int:
        return self.shape[0]

    def __setitem__(self, key, rows: np.ndarray) -> None:
        """Write rows at a slice or at consecutive ascending row numbers (as a frame source
        delivers them)."""
        start, count = self._run(key)
        rows = np.ascontiguousarray(rows, dtype=self.dtype).reshape(count, self.shape[1])
        data, at = memoryview(rows.reshape(-1)).cast("B"), self.offset + start * self.row_bytes
        while len(data):
            done = os.pwrite(self.file.fileno(), data, at)
            data, at = data[done:], at + done

    def _run(self, key) -> tuple[int, int]:
        """(first row, count) of a slice or of consecutive row numbers within the file."""
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return start, max(0, stop - start)
        else:
            rows = np.asarray(key, dtype=np.int64).reshape(-1)
            if not len(rows):
                return 0, 0
            if (np.diff(rows) == 1).all() and 0 <= rows[0] and rows[-1] < len(self):
                return int(rows[0]), len(rows)
        raise IndexError("a RowFile writes and reads consecutive rows within it only")

    def read_into(self, start: int, out: np.ndarray) -> np.ndarray:
        """Rows start..start + len(out) - 1 into `out` (C-contiguous, this dtype); returns it."""
        data, at = memoryview(out.reshape(-1)).cast("B"), self.offset + int(start) * self.row_bytes
        while len(data):
            done = os.preadv(self.file.fileno(), [data], at)
            if not done:
                raise OSError(f"embedding file ends before row {start + len(out)}")
            data, at = data[done:], at + done
        return out

    def __getitem__(self, key) -> np.ndarray:
        """Rows of a slice, one row, or rows by number (any order), read into memory."""
        if isinstance(key, slice):
            start, count = self._run(key)
            return self.read_into(start, np.empty((count, self.shape[1]), self.dtype))
        rows = np.asarray(key, dtype=np.int64)
        if rows.size and (rows.min() < -len(self) or rows.max() >= len(self)):
            raise IndexError(f"row out of range for a RowFile of {len(self)} rows")
        rows = rows % max(len(self), 1)
        if rows.ndim == 0:
            return self[int(rows):int(rows) + 1][0]
        out = np.empty((len(rows), self.shape[1]), self.dtype)
        for k, row in enumerate(rows):
            self.read_into(row, out[k:k + 1])
        return out

    def array(self) -> np.ndarray:
        """The rows, memory-mapped read-only (the map keeps the file)."""
        if not len(self):
            return np.empty(self.shape, self.dtype)
        return np.memmap(self.file, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=self.shape)

    def copy_to(self, fh) -> None:
        """Write the whole `.npy` file (header and rows) to the binary file object `fh`."""
        for at in range(0, self.size, COPY_BYTES):
            fh.write(os.pread(self.file.fileno(), min(COPY_BYTES, self.size - at), at))


def row_blocks(x, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) blocks covering `x` (an array or a RowFile) in order. A RowFile's
    blocks are read into one buffer, valid until the next block."""
    n, dim = len(x), x.shape[1]
    step = max(1, block_bytes // max(1, dim * np.dtype(x.dtype).itemsize))
    buffer = np.empty((min(step, n), dim), x.dtype) if isinstance(x, RowFile) else None
    for start in range(0, n, step):
        stop = min(start + step, n)
        yield start, (x.read_into(start, buffer[:stop - start]) if buffer is not None
                      else x[start:stop])
