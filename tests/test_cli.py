"""The command line: sql, load, shell (driven through stdin), bench listing, errors."""
from __future__ import annotations

import io
import subprocess
import sys

from vidql.cli import main
from vidql.shell import Shell


def test_load_and_sql_commands(counter_clip, tmp_path, capsys):
    db = str(tmp_path / "cli.db")
    assert main(["load", str(counter_clip), "--name", "clip", "--db", db]) == 0
    assert "loaded clip: 120 frames" in capsys.readouterr().out
    assert main(["sql", "SELECT count(*) AS n FROM clip", "--db", db]) == 0
    assert "120" in capsys.readouterr().out
    assert main(["sql", "SELECT AVG(objects('car')) FROM clip ERROR WITHIN 0 ", "--db", db]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "position" in err


def test_shell_runs_statements_and_survives_errors(counter_clip, tmp_path):
    script = (f"LOAD VIDEO '{counter_clip}'\n AS clip;\n"
              "SELECT count(*) AS n FROM clip;\n"
              "SELECT * FROM nowhere;\n"
              ".help\n"
              "SHOW VIDEOS;\n")
    out = io.StringIO()
    Shell(str(tmp_path / "s.db"), stdin=io.StringIO(script), stdout=out).run()
    text = out.getvalue()
    assert "120" in text and "error:" in text and "nowhere" in text
    assert "Statements end with ';'" in text
    assert text.count("clip") >= 2


def test_console_script_lists_scenarios():
    out = subprocess.run([sys.executable, "-m", "vidql", "bench", "--list"],
                         capture_output=True, text=True, check=True).stdout
    assert "decode-only" in out and "oracle" in out
