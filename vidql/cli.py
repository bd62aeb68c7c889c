"""The `vidql` command: demo, load, sql, shell, export, bench."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import vidql
from vidql.base.errors import VidqlError
from vidql.bench.registry import BenchContext
from vidql.bench import runner
from vidql.bench.perfdoc import write_performance_doc
from vidql.display import FORMATS, MAX_ROWS, print_result
from vidql.engine.executor import execute_each
from vidql.shell import Shell

DEFAULT_CACHE = Path(os.environ.get("VIDQL_CACHE", Path.home() / ".cache" / "vidql"))


def _shared_dir() -> Path | None:
    """../shared beside the checkout, or $VIDQL_SHARED, when present."""
    env = os.environ.get("VIDQL_SHARED")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[1].parent / "shared")
    return next((c for c in candidates if (c / "data").is_dir()), None)


def cmd_sql(args) -> int:
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        with vidql.connect(args.db, read_only=args.read_only) as db:
            for k, (statement, result) in enumerate(execute_each(db, args.query)):
                if k and args.format != "json" and result is not None:
                    print(file=out)  # a blank line between statements' results
                print_result(result, args.format, args.max_rows, out=out, statement=statement)
    finally:
        if args.out:
            out.close()
    return 0


def cmd_export(args) -> int:
    with vidql.connect(args.db, read_only=args.read_only) as db:
        result = db.sql(args.query)
        if result is None:
            raise VidqlError("the statement returned no rows to export")
        index = result.export(args.out, boxes=args.boxes, clip_seconds=args.clip_seconds,
                              image_format=args.image_format)
    print(f"wrote {index} ({len(result)} row{'s' if len(result) != 1 else ''})")
    if result.report is not None:
        print(result.report.summary())
    return 0


def cmd_load(args) -> int:
    with vidql.connect(args.db) as db:
        row = db.load_video(args.path, args.name, rendition=args.rendition,
                            skip_bad=args.skip_bad, into=args.into,
                            oracle_rendition=args.oracle_rendition)
        shown = db.videos().set_index("name").loc[row["name"]]
        print(f"loaded {row['name']}: {f'{shown.clips} clips, ' if shown.clips > 1 else ''}"
              f"{shown.frame_count} frames, {shown['size']} {shown.codec} at {shown.fps} fps")
        for path, reason in row["skipped"]:
            print(f"skipped '{path}': {reason}")
    return 0


def cmd_shell(args) -> int:
    return Shell(args.db, read_only=args.read_only).run()


def cmd_demo(args) -> int:
    from vidql.demo import run_demo  # pandas and the data sets: 0.5 s that `vidql --help` need not wait for

    return run_demo(db_path=args.db, cache_dir=Path(args.cache), n_frames=args.frames)


def cmd_bench(args) -> int:
    if args.list:
        for name, (description, _) in sorted(runner.load_scenarios().items()):
            print(f"{name:12s} {description}")
        return 0
    ctx = BenchContext(out_dir=Path(args.out), quick=args.quick, tiny=args.tiny, seed=args.seed,
                       shared_dir=_shared_dir() if not args.no_shared else None,
                       cache_dir=Path(args.cache))
    report = runner.run(args.scenario, ctx)
    failed = [n for n, e in report["scenarios"].items() if "error" in e]
    print(f"wrote {ctx.out_dir / 'results.json'} and {ctx.out_dir / 'report.md'}")
    return 1 if failed else 0


def cmd_perfdoc(args) -> int:
    names = write_performance_doc([Path(s) for s in args.results], Path(args.out))
    print(f"wrote {args.out} ({len(names)} scenarios: {', '.join(names)})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vidql", description="Proxy-accelerated SQL over video.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_db(sp, default=None):
        sp.add_argument("--db", default=default,
                        help="database file (DuckDB) with an artifact folder beside it"
                             + ("" if default else "; in memory when omitted"))
        return sp

    d = with_db(sub.add_parser("demo", help="generate a synthetic video and run example queries"))
    d.add_argument("--frames", type=int, default=4000, help="length of the synthetic video")
    d.add_argument("--cache", default=str(DEFAULT_CACHE), help="where generated data is kept")
    d.set_defaults(fn=cmd_demo)

    ld = with_db(sub.add_parser("load", help="LOAD VIDEO into a database"), "vidql.db")
    ld.add_argument("path", help="a video file, a glob such as 'clips/*.mp4', or a folder")
    ld.add_argument("--name")
    ld.add_argument("--into", action="store_true", help="append to the existing video --name")
    ld.add_argument("--skip-bad", action="store_true",
                    help="load the files that read and report the others")
    ld.add_argument("--rendition", type=int, help="also keep a low-res copy (short side px)")
    ld.add_argument("--oracle-rendition", metavar="PX|auto|none",
                    type=lambda v: int(v) if v.isdigit() else v,
                    help="a lossless short-GOP copy at the oracle's input size (long side px, "
                         "e.g. 416) for the detector to read; default auto: written by an ONNX "
                         "detector on first use where random reads of a clip are costly")
    ld.set_defaults(fn=cmd_load)

    s = with_db(sub.add_parser("sql", help="run one statement or a ;-separated script and "
                                           "print each statement's result"), "vidql.db")
    s.add_argument("query")
    s.add_argument("--format", choices=FORMATS, default="table",
                   help="table (numbers rounded, the report as -- lines), csv (every row, full "
                        "precision; the report on stderr), json (one object a line per "
                        "statement, the report's fields in it) or markdown")
    s.add_argument("--out", metavar="FILE", help="write the results to FILE, not stdout")
    s.add_argument("--max-rows", type=int, default=MAX_ROWS, metavar="N",
                   help=f"rows a table or markdown result shows (default {MAX_ROWS}; 0: every "
                        "row); the rows left out are counted")
    s.set_defaults(fn=cmd_sql)

    sh = with_db(sub.add_parser("shell", help="interactive shell with history"), "vidql.db")
    sh.set_defaults(fn=cmd_shell)

    ex = with_db(sub.add_parser("export", help="run a query and write the frames its rows name "
                                               "as images (and clips) with an index.html page"),
                 "vidql.db")
    ex.add_argument("query", help="a query (of a script, the last statement's result)")
    ex.add_argument("--out", required=True, metavar="DIR", help="the folder to write into")
    ex.add_argument("--boxes", action="store_true",
                    help="draw the oracle's boxes and labels (from the label cache)")
    ex.add_argument("--clip-seconds", type=float, metavar="S",
                    help="also write an H.264 MP4 of the S seconds around each frame")
    ex.add_argument("--image-format", choices=("jpeg", "png"), default="jpeg")
    ex.set_defaults(fn=cmd_export)
    for reader in (s, sh, ex):
        reader.add_argument("--read-only", action="store_true",
                            help="open the database for reading only, so other processes can "
                                 "read it at the same time (no new labels or catalog changes)")

    b = sub.add_parser("bench", help="benchmark scenarios against their baselines")
    b.add_argument("scenario", nargs="*", help="scenario names (all when omitted)")
    b.add_argument("--quick", action="store_true", help="small sizes, a few minutes on 2 cores")
    b.add_argument("--tiny", action="store_true",
                   help="tiny sizes, seconds per scenario: checks that every scenario runs "
                        "(the figures mean nothing)")
    b.add_argument("--out", default="bench-out", help="output folder for JSON, Markdown, plots")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--cache", default=str(DEFAULT_CACHE), help="where generated data is kept")
    b.add_argument("--no-shared", action="store_true", help="skip the ../shared real data")
    b.add_argument("--list", action="store_true", help="list scenarios and exit")
    b.set_defaults(fn=cmd_bench)

    pd = sub.add_parser("perfdoc", help="write docs/performance.md from bench results")
    pd.add_argument("results", nargs="+", help="bench output folders or their results.json "
                                                "(a later one's scenario replaces an earlier one's)")
    pd.add_argument("--out", default="docs/performance.md", help="the Markdown page to write")
    pd.set_defaults(fn=cmd_perfdoc)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except VidqlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished oracle batches are cached", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
