"""`vidql shell`: an interactive prompt for the dialect, with history and readable tables."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from vidql.engine.errors import VidqlError

HISTORY = Path(os.environ.get("VIDQL_HISTORY", Path.home() / ".vidql_history"))
HELP = """Statements end with ';'. Examples:
  LOAD VIDEO 'clip.mp4' AS night;
  CREATE ORACLE yolox FROM ONNX 'yolox_nano.onnx';  SET ORACLE night = yolox;
  SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 95%;
Commands: .help  .quit"""


class Shell:
    """Reads statements until ';', runs them, prints results; errors never end the session."""

    def __init__(self, db_path: str | None, stdin=None, stdout=None):
        import vidql

        self.db = vidql.connect(db_path)
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.interactive = self.stdin.isatty()

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
            import readline
        except ImportError:
            return
        try:
            readline.read_history_file(HISTORY)
        except OSError:
            pass
        import atexit

        atexit.register(lambda: readline.write_history_file(HISTORY))

    def run(self) -> int:
        from vidql.cli import print_result

        if self.interactive:
            self._setup_history()
            print(f"vidql shell on {self.db!r}; .help for help", file=self.stdout)
        buffer: list[str] = []
        while True:
            line = self._readline("vidql> " if not buffer else "   ...> ")
            if line is None:
                break
            stripped = line.strip()
            if not buffer and stripped in (".quit", ".exit"):
                break
            if not buffer and stripped == ".help":
                print(HELP, file=self.stdout)
                continue
            buffer.append(line)
            if not stripped.endswith(";"):
                continue
            text, buffer = "\n".join(buffer), []
            try:
                result = self.db.sql(text)
                saved, sys.stdout = sys.stdout, self.stdout
                try:
                    print_result(result)
                finally:
                    sys.stdout = saved
            except VidqlError as exc:
                print(f"error: {exc}", file=self.stdout)
            except KeyboardInterrupt:
                print("interrupted; finished oracle batches are cached", file=self.stdout)
        self.db.close()
        return 0
