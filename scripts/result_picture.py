"""docs/img/result.png: the frames a LIMIT query found on a real clip, with the detector's
boxes, and the query's answer and report. Needs ../shared (a real clip and YOLOX-Nano).

    .venv/bin/python scripts/result_picture.py [--out docs/img/result.png]
"""
from __future__ import annotations

import argparse
import tempfile
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import vidql  # noqa: E402
from vidql.engine.picture import draw_boxes  # noqa: E402
from vidql.preprocess import FrameReader  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
QUERY = ("SELECT clip, frame, ts FROM street WHERE objects('car') >= 8 "
         "LIMIT 4 GAP 100 USING INDEX street_idx")


def run_query(db_path: Path):
    db = vidql.connect(db_path, progress=False)
    db.sql(f"LOAD VIDEO '{SHARED / 'data/residential_street.mp4'}' AS street")
    db.sql(f"CREATE ORACLE yolox FROM ONNX '{SHARED / 'models/yolox_nano.onnx'}'")
    db.sql("SET ORACLE street = yolox")
    db.sql("CREATE INDEX street_idx ON street USING TASTI")
    result = db.sql(QUERY)
    rows = result.df()
    frames = rows["frame"].tolist()
    boxes = db.sql("SELECT frame, label, x1, y1, x2, y2 FROM street.objects WHERE frame IN ("
                   + ", ".join(map(str, frames)) + ")").df()
    return rows, boxes, result.report.summary()


def draw(rows, boxes, summary: str, out: Path) -> None:
    with FrameReader(SHARED / "data/residential_street.mp4") as reader:
        images = reader.read(rows["frame"].tolist())
    fig, axes = plt.subplots(1, len(images), figsize=(4 * len(images), 3.6))
    for ax, image, (_, row) in zip(axes, images, rows.iterrows(), strict=True):
        ax.imshow(draw_boxes(image, boxes[boxes["frame"] == row["frame"]]))
        ax.set_title(f"frame {row['frame']}, ts {row['ts']:.1f} s", fontsize=9)
        ax.axis("off")
    fig.suptitle(QUERY, fontsize=10, family="monospace")
    caption = "\n".join(w for line in summary.splitlines() for w in textwrap.wrap(line, 200))
    fig.text(0.5, 0.02, caption, ha="center", fontsize=7.5, family="monospace")
    fig.subplots_adjust(left=0.01, right=0.99, top=0.86, bottom=0.16, wspace=0.03)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img/result.png")
    args = parser.parse_args()
    if not SHARED.exists():
        raise SystemExit(f"{SHARED} is absent: the picture needs its real clip and detector")
    with tempfile.TemporaryDirectory() as tmp:
        rows, boxes, summary = run_query(Path(tmp) / "street.db")
    draw(rows, boxes, summary, Path(args.out))
    print(f"wrote {args.out}:\n{rows}\n{summary}")


if __name__ == "__main__":
    main()
