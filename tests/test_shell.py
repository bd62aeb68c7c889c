"""`vidql shell` through a pseudo-terminal: reports, Ctrl-C at the prompt, one history entry
per statement, no lock held while idle; piped input runs a last statement without ';'."""
from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

import vidql
from vidql.shell import Shell

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A child process on a pseudo-terminal (its controlling terminal, so Ctrl-C signals)."""

    def __init__(self, argv: list[str], env: dict):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: a 40x200 terminal (a new pty has no size)
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
            os.execve(argv[0], argv, env)
        self.seen, self.pos = b"", 0

    def expect(self, text: str, timeout: float = 120) -> str:
        """Read until `text` appears after the previous match; return what came before it."""
        deadline = time.monotonic() + timeout
        while (end := self.seen.find(text.encode(), self.pos)) < 0:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {text!r} within {timeout} s; got {self.seen[self.pos:]!r}")
            try:
                self.seen += os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                raise AssertionError(f"shell ended before {text!r}; got {self.seen[self.pos:]!r}") from None
        before, self.pos = self.seen[self.pos:end], end + len(text.encode())
        return ANSI.sub(b"", before).decode(errors="replace")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.seen += os.read(self.fd, 65536)  # drain, so the child never blocks
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.1)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("the shell did not exit")


def test_shell_on_a_terminal(traffic_db, tmp_path):
    history = tmp_path / "history"
    env = {**os.environ, "VIDQL_HISTORY": str(history), "TERM": "dumb"}
    shell = Terminal([sys.executable, "-m", "vidql", "shell", "--db", str(traffic_db)], env)
    shell.expect("vidql> ")
    # an idle shell holds no lock: another process can open the database for writing
    with vidql.connect(traffic_db, progress=False) as other:
        assert other.sql("SELECT count(*) FROM t").fetchall() == [(300,)]
    shell.send("SELECT AVG(objects('car')) FROM t\r")
    shell.expect("...> ")
    shell.send("ERROR WITHIN 0.5 SEED 1;\r")
    out = shell.expect("vidql> ")
    assert "guarantee: AVG within ±0.5 (absolute error) at 95% confidence" in out
    assert int(re.search(r"\| oracle calls: (\d+)", out).group(1)) > 0
    assert "aggregate on t, calling the oracle" in out  # its progress bar, on the terminal
    shell.send("SELECT 'half typed")
    time.sleep(0.5)
    shell.send("\x03")  # Ctrl-C at the prompt: the line is dropped, the shell stays
    shell.expect("^C")
    shell.expect("vidql> ")
    shell.send("SELECT 41 + 1 AS answer;\r")
    out = shell.expect("vidql> ")
    assert "42" in out and "half typed" not in out
    shell.send(".quit\r")
    assert shell.wait() == 0
    entries = history.read_text().splitlines()
    assert "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1;" in entries
    assert not any(e.startswith("ERROR WITHIN") or "half typed" in e for e in entries)


def test_piped_input_runs_a_last_statement_without_semicolon(traffic_db):
    out = io.StringIO()
    script = "SELECT count(*) AS n FROM t;\nSELECT 40 + 2\n  AS answer"
    assert Shell(str(traffic_db), stdin=io.StringIO(script), stdout=out).run() == 0
    assert "300" in out.getvalue() and "42" in out.getvalue()


def test_a_held_database_names_the_process_and_the_remedy(traffic_db):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, vidql; db = vidql.connect(sys.argv[1]); "
                               "print('open', flush=True); sys.stdin.read()", str(traffic_db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(vidql.VidqlError) as err:
            vidql.connect(traffic_db)
        assert f"PID {holder.pid}" in str(err.value) and "--read-only" in str(err.value)
    finally:
        holder.communicate("")
    with vidql.connect(traffic_db, read_only=True) as a, vidql.connect(traffic_db, read_only=True) as b:
        assert a.sql("SELECT count(*) FROM t").fetchall() == b.sql("SELECT count(*) FROM t").fetchall()
        with pytest.raises(vidql.VidqlError, match="read-only"):
            a.sql("SELECT sum(objects('car')) FROM t")  # labels are needed: it says so
        with pytest.raises(vidql.CatalogError, match="read-only"):
            a.sql("SET ORACLE t = truth")


def test_a_piped_session_survives_a_duckdb_error_and_a_bug(traffic_db, monkeypatch):
    """A statement raising a DuckDB error (LIMIT 1e300 cannot be cast) or any other
    exception prints a line and the script goes on (it ended the session before)."""
    import vidql.engine.executor as executor

    out = io.StringIO()
    script = ("SELECT 1 AS first;\nSELECT frame FROM t WHERE objects('car') >= 1 LIMIT 1e300;\n"
              "SELECT 40 + 2 AS answer;\nSELECT 'boom' AS bug;\nSELECT 'after' AS last;\n")
    real = executor.execute_each

    def buggy(db, text, scope=None):
        if "boom" in text:
            raise RuntimeError("a bug")
        return real(db, text, scope)

    monkeypatch.setattr(executor, "execute_each", buggy)
    assert Shell(str(traffic_db), stdin=io.StringIO(script), stdout=out).run() == 0
    text = out.getvalue()
    assert "error: DuckDB: Conversion Error" in text
    assert "42" in text and "after" in text
    assert "error: RuntimeError: a bug (unexpected; please report it" in text


def test_dot_commands_a_sql_user_knows(traffic_db, tmp_path):
    saved = tmp_path / "saved.txt"
    script = (".tables\n.schema t\n.mode csv\nSELECT frame FROM t WHERE frame < 3;\n"
              ".mode json\nSELECT 1 AS one;\n.timer on\nSELECT 2 AS two;\n.timer off\n"
              f".output {saved}\nSELECT 3 AS three;\n.output\n.mode bogus\n.maxrows 2\n"
              ".mode table\nSELECT frame FROM t WHERE frame < 5;\n.nope\n")
    out = io.StringIO()
    assert Shell(str(traffic_db), stdin=io.StringIO(script), stdout=out).run() == 0
    text = out.getvalue()
    assert "videos: t\noracles: truth\nindexes: (none)\ntables: (none)" in text
    assert "-- t (a video: frame functions" in text and "│ frame       │ BIGINT" in text
    assert "frame\n0\n1\n2\n" in text  # csv
    assert '"rows": [{"one": 1}]' in text  # json
    assert re.search(r'"rows": \[\{"two": 2\}\].*\nRun Time: \d+\.\d\d s', text)
    assert "three" not in text and '"rows": [{"three": 3}]' in saved.read_text()
    assert "error: .mode takes one of table, csv, json, markdown" in text
    assert "│     1 │" in text and "│     2 │" not in text and "… 3 more rows" in text
    assert "error: unknown command .nope" in text


def test_history_is_saved_after_each_statement(traffic_db, tmp_path):
    history = tmp_path / "history"
    env = {**os.environ, "VIDQL_HISTORY": str(history), "TERM": "dumb"}
    shell = Terminal([sys.executable, "-m", "vidql", "shell", "--db", str(traffic_db)], env)
    shell.expect("vidql> ")
    shell.send("SELECT 41 + 1\r")
    shell.expect("...> ")
    shell.send("AS answer;\r")
    shell.expect("vidql> ")
    assert history.read_text().splitlines() == ["SELECT 41 + 1 AS answer;"]  # before quitting
    shell.send(".quit\r")
    assert shell.wait() == 0
