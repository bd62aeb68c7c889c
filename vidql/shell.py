"""`vidql shell`: an interactive prompt for the dialect, with history and readable tables."""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import vidql
from vidql.base.errors import VidqlError
from vidql.display import FORMATS, MAX_ROWS, print_result
from vidql.engine import executor
from vidql.engine.sql.sqlnames import quote_name

HISTORY = Path(os.environ.get("VIDQL_HISTORY", Path.home() / ".vidql_history"))
HELP = """Statements end with ';'. Examples:
  LOAD VIDEO 'clip.mp4' AS night;
  CREATE ORACLE yolox FROM ONNX 'yolox_nano.onnx';  SET ORACLE night = yolox;
  SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 95%;
Ctrl-C clears the line (or stops a running statement; finished oracle batches stay cached).
A database file is opened for each statement and closed after it, so other processes can
use it while the shell waits. History is saved after each statement.
Commands:
  .tables              videos, oracles, indexes and DuckDB tables
  .schema [NAME]       the columns of a video or table (every video and table without NAME)
  .mode MODE           table (default), csv, json or markdown
  .maxrows N           rows a table shows (40; 0 shows every row)
  .output [FILE]       write results to FILE (none: back to the terminal)
  .timer on|off        print each statement's wall time
  .help  .quit"""
STOP = object()  # a command's answer that ends the session


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
        self.mode, self.max_rows, self.timer, self.output = "table", MAX_ROWS, False, None

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

    def _one_history_entry(self, first: int, text: str) -> None:
        """Replace the history entries of a statement's lines (from `first`) by one entry."""
        if self.readline is None:
            return
        for _ in range(self.readline.get_current_history_length() - first):
            self.readline.remove_history_item(first)
        self.readline.add_history(" ".join(line.strip() for line in text.splitlines()))
        try:  # saved now: a killed shell keeps its statements
            HISTORY.touch()
            self.readline.append_history_file(1, HISTORY)
        except OSError:
            pass

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
            if not buffer and stripped.startswith("."):
                if self._command(stripped) is STOP:
                    break
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
        self._set_output(None)
        return 0

    def _command(self, line: str):
        """Run a dot command; STOP for .quit."""
        name, _, arg = line.partition(" ")
        how = {".quit": lambda a: STOP, ".exit": lambda a: STOP, ".help": self._help,
               ".tables": self._tables, ".schema": self._schema, ".mode": self._mode,
               ".maxrows": self._maxrows, ".output": self._set_output,
               ".timer": self._timer}.get(name)
        if how is None:
            self._say(f"error: unknown command {name}; .help lists the commands")
            return None
        try:
            return how(arg.strip() or None)
        except VidqlError as exc:
            self._say(f"error: {exc}")
        except Exception as exc:  # DuckDB's own errors, or a bug: the session goes on
            self._say(f"error: {unexpected_error(exc)}")
        return None

    def _say(self, text: str) -> None:
        print(text, file=self.stdout)

    def _help(self, _arg) -> None:
        self._say(HELP)

    def _tables(self, _arg) -> None:
        with self._database() as db:
            tables = db.catalog.con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                "ORDER BY table_name").fetchall()
            videos = set(map(str.lower, db.catalog.video_names()))
            rows = {"videos": db.catalog.video_names(), "oracles": db.catalog.oracle_names(),
                    "indexes": db.indexes.names(),
                    "tables": [t for (t,) in tables if t.lower() not in videos]}
        for what, names in rows.items():
            self._say(f"{what}: {'  '.join(names) if names else '(none)'}")

    def _schema(self, name: str | None) -> None:
        with self._database() as db:
            names = [name] if name else db.catalog.video_names() + [
                t for (t,) in db.catalog.con.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                    "AND table_type = 'BASE TABLE' ORDER BY table_name").fetchall()]
            videos = set(map(str.lower, db.catalog.video_names()))
            for table in names:
                self._say(f"-- {table}" + (f" (a video: frame functions such as objects('car') "
                                           f"and the table {table}.objects read its oracle's "
                                           "labels)" if table.lower() in videos else ""))
                result = db.sql(f"DESCRIBE {quote_name(table)}")
                result.report = None  # a catalog read: nothing to report
                print_result(result, self.mode, 0, out=self.output or self.stdout,
                             statement=f"DESCRIBE {table}")

    def _mode(self, mode: str | None) -> None:
        if mode not in FORMATS:
            self._say(f"error: .mode takes one of {', '.join(FORMATS)}; it is {self.mode}")
            return
        self.mode = mode

    def _maxrows(self, arg: str | None) -> None:
        if arg is None or not arg.isdigit():
            self._say(f"error: .maxrows takes a whole number (0: every row); it is {self.max_rows}")
            return
        self.max_rows = int(arg)

    def _timer(self, arg: str | None) -> None:
        if arg not in ("on", "off"):
            self._say(f"error: .timer takes on or off; it is {'on' if self.timer else 'off'}")
            return
        self.timer = arg == "on"

    def _set_output(self, path: str | None) -> None:
        """Results to `path` (appended), or back to the terminal when None."""
        if self.output is not None:
            self.output.close()
        self.output = None if path is None else open(path, "a", encoding="utf-8")

    def _execute(self, text: str) -> None:
        try:
            with self._database() as db:
                self._print_each(db, text)
        except VidqlError as exc:
            print(f"error: {exc}", file=self.stdout)
        except KeyboardInterrupt:
            print("interrupted; finished oracle batches are cached", file=self.stdout)
        except Exception as exc:  # DuckDB's own errors, or a bug: the session goes on
            print(f"error: {unexpected_error(exc)}", file=self.stdout)

    def _print_each(self, db, text: str) -> None:
        """Run the statements of `text`, printing each one's result (and time) as it ends."""
        out = self.output or self.stdout
        t0 = time.perf_counter()
        for statement, result in executor.execute_each(db, text):
            print_result(result, self.mode, self.max_rows, out=out, statement=statement)
            if self.timer:
                print(f"Run Time: {time.perf_counter() - t0:.2f} s", file=self.stdout)
            t0 = time.perf_counter()


def unexpected_error(exc: Exception) -> str:
    """A line for an error that is no VidqlError: DuckDB's words, or the exception's with a
    request to report it."""
    if type(exc).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        return f"DuckDB: {exc}"
    return f"{type(exc).__name__}: {exc} (unexpected; please report it with the statement)"
