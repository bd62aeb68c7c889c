"""`vidql shell`: an interactive prompt for the dialect, with history and readable tables."""
from __future__ import annotations

import atexit
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import vidql
from vidql.base.errors import VidqlError
from vidql.display import print_result

HISTORY = Path(os.environ.get("VIDQL_HISTORY", Path.home() / ".vidql_history"))
HELP = """Statements end with ';'. Examples:
  LOAD VIDEO 'clip.mp4' AS night;
  CREATE ORACLE yolox FROM ONNX 'yolox_nano.onnx';  SET ORACLE night = yolox;
  SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 95%;
Ctrl-C clears the line (or stops a running statement; finished oracle batches stay cached).
A database file is opened for each statement and closed after it, so other processes can
use it while the shell waits. Commands: .help  .quit"""


class Shell:
    """Reads statements until ';', runs them, prints results and reports; errors never end
    the session."""

    def __init__(self, db_path: str | None, stdin=None, stdout=None, *, read_only: bool = False):
        self.db_path = db_path
        self.read_only = read_only
        # in memory, the database lives as long as the shell; a file is opened per statement
        self.memory = vidql.connect(None) if db_path is None else None
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.interactive = self.stdin.isatty()
        self.readline = None

    @contextmanager
    def _database(self):
        if self.memory is not None:
            yield self.memory
            return
        with vidql.connect(self.db_path, read_only=self.read_only) as db:
            yield db

    def _readline(self, prompt: str) -> str | None:
        if self.interactive:
            try:
                return input(prompt)
            except EOFError:
                return None
        line = self.stdin.readline()
        return None if line == "" else line.rstrip("\n")

    def _setup_history(self) -> None:
        try:
            import readline  # optional, and loading it changes how input() reads a line
        except ImportError:
            return
        self.readline = readline
        try:
            readline.read_history_file(HISTORY)
        except OSError:
            pass
        atexit.register(lambda: readline.write_history_file(HISTORY))

    def _one_history_entry(self, first: int, text: str) -> None:
        """Replace the history entries of a statement's lines (from `first`) by one entry."""
        if self.readline is None:
            return
        for _ in range(self.readline.get_current_history_length() - first):
            self.readline.remove_history_item(first)
        self.readline.add_history(" ".join(line.strip() for line in text.splitlines()))

    def _history_length(self) -> int:
        return self.readline.get_current_history_length() if self.readline else 0

    def _welcome(self) -> None:
        """At a terminal: load the history and greet."""
        if self.interactive:
            self._setup_history()
            where = "in memory" if self.db_path is None else self.db_path
            print(f"vidql shell on {where}{' (read-only)' if self.read_only else ''}; "
                  f".help for help", file=self.stdout)

    def run(self) -> int:
        self._welcome()
        buffer: list[str] = []
        first = 0
        while True:
            try:
                line = self._readline("vidql> " if not buffer else "   ...> ")
            except KeyboardInterrupt:  # Ctrl-C at the prompt: drop the statement being typed
                print("^C", file=self.stdout)
                buffer = []
                continue
            if line is None:
                break
            stripped = line.strip()
            if not buffer and stripped in (".quit", ".exit"):
                break
            if not buffer and stripped == ".help":
                print(HELP, file=self.stdout)
                continue
            if not buffer:
                first = self._history_length() - (1 if stripped else 0)
            buffer.append(line)
            if stripped.endswith(";"):
                text, buffer = "\n".join(buffer), []
                self._one_history_entry(first, text)
                self._execute(text)
        if "".join(buffer).strip():  # a last statement without ';' still runs
            self._execute("\n".join(buffer))
        if self.memory is not None:
            self.memory.close()
        return 0

    def _execute(self, text: str) -> None:
        try:
            with self._database() as db:
                result = db.sql(text)
                saved, sys.stdout = sys.stdout, self.stdout
                try:
                    print_result(result)
                finally:
                    sys.stdout = saved
        except VidqlError as exc:
            print(f"error: {exc}", file=self.stdout)
        except KeyboardInterrupt:
            print("interrupted; finished oracle batches are cached", file=self.stdout)
        except Exception as exc:  # DuckDB's own errors, or a bug: the session goes on
            print(f"error: {unexpected_error(exc)}", file=self.stdout)


def unexpected_error(exc: Exception) -> str:
    """A line for an error that is no VidqlError: DuckDB's words, or the exception's with a
    request to report it."""
    if type(exc).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        return f"DuckDB: {exc}"
    return f"{type(exc).__name__}: {exc} (unexpected; please report it with the statement)"
