"""Seeing what a query found: `Result._repr_html_` (the report, thumbnails with the oracle's
boxes, an aggregate's intervals as bars), `Result.export` and `vidql export` (one image per
result frame, read frame-exactly, MP4 clips around them, an index.html), and the page in a
real headless browser."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import sys
import textwrap

import av
import numpy as np
import pandas as pd
import pytest
from PIL import Image

import vidql
from vidql.base.errors import ParameterError, VidqlError
from vidql.cli import main
from vidql.engine.picture import draw_boxes
from vidql.preprocess import FrameReader

LIMIT = "SELECT clip, frame FROM v WHERE objects('car') >= 3 LIMIT 5 SEED 1"
THUMB = re.compile(r"src='data:image/jpeg;base64,([^']+)'")


def _thumbnails(html: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in THUMB.findall(html)]


def test_notebook_shows_the_report_and_thumbnails_with_boxes(traffic_con):
    result = traffic_con.sql(LIMIT)
    html = result._repr_html_()
    report = result.report
    for figure in (report.guarantee, f"<b>oracle calls</b>: {report.oracle_calls}",
                   f"<b>cache hits</b>: {report.cache_hits}", "<b>seconds</b>"):
        assert figure in html
    thumbs = _thumbnails(html)
    assert len(thumbs) == len(result) == 5 and all(t.width == 160 for t in thumbs)
    for clip, frame in result.df()[["clip", "frame"]].itertuples(index=False):
        assert f"clip <b>{clip}</b> · frame {frame} ·" in html
    assert "Boxes: oracle truth&#x27;s cached detections." in html


def test_notebook_caps_the_thumbnails_and_counts_the_rest(traffic_con):
    html = traffic_con.sql("SELECT clip, frame FROM v WHERE frame < 30 AND objects('car') >= 0"
                           )._repr_html_()
    assert len(_thumbnails(html)) == 24
    assert "… and 6 more frames (30 in all)" in html


def test_notebook_draws_an_aggregate_interval_per_group(traffic_con):
    result = traffic_con.sql("SELECT frame >= 150 AS late, AVG(objects('car')) FROM v "
                             "GROUP BY late ORACLE BUDGET 60 SEED 3")
    html = result._repr_html_()
    assert html.count("<svg") == len(result) == 2
    assert "<img" not in html and result.report.guarantee.split(" (")[0] in html
    for est, low, high in result.df()[["estimate", "ci_low", "ci_high"]].itertuples(index=False):
        assert f"{est:.4g} [{low:.4g}, {high:.4g}]" in html


def test_notebook_shows_rows_of_a_result_without_frames(traffic_con):
    html = traffic_con.sql("SHOW VIDEOS")._repr_html_()
    assert "<table" in html and "<img" not in html


def test_draw_boxes_outlines_each_detection_with_a_box():
    frame = np.zeros((60, 80, 3), dtype=np.uint8)
    detections = pd.DataFrame({"frame": [0, 0], "label": ["car", "car"], "score": [0.9, 0.9],
                               "x1": [10.0, 5.0], "y1": [20.0, 5.0], "x2": [50.0, 5.0],
                               "y2": [40.0, 9.0]})  # the second has no area: no box
    drawn = np.asarray(draw_boxes(frame, detections))
    assert drawn[30, 10].any() and drawn[20, 30].any() and drawn[40, 30].any()
    assert not drawn[30, 30].any() and not drawn[7, 5].any()


def _counter_bits(image: np.ndarray) -> int:
    """The frame number a counter frame shows (preprocess/testclip.py: 16 cells, 10 px)."""
    return sum(1 << bit for bit in range(16) if image[2:8, bit * 10 + 2:bit * 10 + 8].mean() > 128)


def test_export_reads_exactly_the_frames_the_rows_name(clip_db, counter_clip, tmp_path):
    result = clip_db.sql("SELECT clip, frame FROM clip WHERE frame IN (5, 37, 118) "
                         "ORDER BY frame DESC")
    index = result.export(tmp_path / "out", boxes=False, image_format="png")
    files = sorted((tmp_path / "out" / "frames").iterdir())
    assert [f.name for f in files] == [f"000{k}_counter_{n}.png" for k, n in enumerate((118, 37, 5))]
    with FrameReader(counter_clip) as reader:
        for path, number in zip(files, (118, 37, 5), strict=True):
            image = np.asarray(Image.open(path))
            assert np.array_equal(image, reader.read([number])[0])
            assert _counter_bits(image) == number
    assert "Boxes not drawn." in index.read_text()


def test_export_writes_boxed_images_clips_and_a_page(traffic_con, tmp_path):
    result = traffic_con.sql(LIMIT)
    index = result.export(tmp_path / "out", boxes=True, clip_seconds=1)
    rows = result.df()
    page = index.read_text()
    assert LIMIT.replace("'", "&#x27;").replace(">", "&gt;") in page
    assert result.report.guarantee in page
    frames = sorted((tmp_path / "out" / "frames").glob("*.jpg"))
    clips = sorted((tmp_path / "out" / "clips").glob("*.mp4"))
    assert len(frames) == len(clips) == len(rows) == 5
    for path, (clip, frame, ts) in zip(frames, rows[["clip", "frame", "ts"]].itertuples(index=False),
                                       strict=True):
        assert f"src='frames/{path.name}'" in page
        assert f"clip <b>{clip}</b> · frame {frame} · ts {ts:.2f} s" in page
    with av.open(str(clips[0])) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        decoded = sum(1 for _ in container.decode(stream))
    ts = rows["ts"].iloc[0]
    want = traffic_con.sql(f"SELECT count(*) FROM v WHERE ts BETWEEN {ts - 0.5} AND {ts + 0.5}"
                           ).fetchone()[0]
    assert decoded == want
    assert "clips/" + clips[0].name in page
    unboxed = result.export(tmp_path / "plain", boxes=False)
    assert unboxed.read_text().count("<img") == 5
    first = sorted((tmp_path / "plain" / "frames").glob("*.jpg"))[0]
    assert not np.array_equal(np.asarray(Image.open(first)), np.asarray(Image.open(frames[0])))


BOXLESS = '''
class Boxless:
    """One 'car' a frame, with no box."""
    def detect(self, frames):
        return [[("car", 1.0, 0.0, 0.0, 0.0, 0.0)] for _ in frames]
'''


def test_a_label_only_oracle_draws_no_boxes_and_says_so(counter_clip, tmp_path, monkeypatch):
    (tmp_path / "vq_boxless.py").write_text(textwrap.dedent(BOXLESS))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("vq_boxless", None)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{counter_clip}' AS clip; CREATE ORACLE b FROM PYTHON "
               "'vq_boxless:Boxless'; SET ORACLE clip = b")
        result = db.sql("SELECT clip, frame FROM clip WHERE objects('car') >= 1 LIMIT 2 SEED 1")
        page = result.export(tmp_path / "out").read_text()
        assert "Oracle b gives labels without boxes, so none are drawn." in result._repr_html_()
    assert "Oracle b gives labels without boxes, so none are drawn." in page


def test_export_of_an_aggregate_draws_its_interval(traffic_con, tmp_path):
    page = traffic_con.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 0.5 SEED 3").export(
        tmp_path / "agg").read_text()
    assert page.count("<svg") == 1 and "AVG within ±0.5" in page


def test_export_refuses_bad_options(traffic_con, tmp_path):
    result = traffic_con.sql(LIMIT)
    with pytest.raises(ParameterError, match="clip seconds must be"):
        result.export(tmp_path / "x", clip_seconds=0)
    with pytest.raises(ParameterError, match="image format must be jpeg or png"):
        result.export(tmp_path / "x", image_format="gif")


def test_export_command(traffic_db, tmp_path, capsys):
    out = tmp_path / "found"
    query = LIMIT.replace("FROM v", "FROM t")
    assert main(["export", query, "--out", str(out), "--db", str(traffic_db), "--boxes",
                 "--clip-seconds", "0.5", "--image-format", "png"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out / 'index.html'} (5 rows)" in said and "guarantee:" in said
    assert len(list((out / "frames").glob("*.png"))) == len(list((out / "clips").glob("*.mp4"))) == 5
    assert main(["export", query, "--out", str(out), "--db", str(traffic_db),
                 "--clip-seconds", "-1"]) == 2
    assert "clip seconds must be a number in (0, 600]" in capsys.readouterr().err


def _chromium() -> str:
    found = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))),
                 None)
    if found is None:
        pytest.skip("needs Chromium for the browser test (scripts/test.sh installs Debian's "
                    "`chromium` package where it runs as root or with sudo)")
    return found


# records, once the page has loaded, how many of its images the browser decoded
LOADED_JS = ("<script>window.addEventListener('load', () => { const i = [...document.images]; "
             "document.body.dataset.images = i.length; document.body.dataset.loaded = "
             "i.filter(x => x.complete && x.naturalWidth > 0).length; });</script></body>")


@pytest.mark.slow
def test_export_page_loads_every_image_in_a_headless_browser(traffic_con, tmp_path):
    browser = _chromium()
    index = traffic_con.sql(LIMIT).export(tmp_path / "out", clip_seconds=1)
    check = index.with_name("check.html")  # beside it, so its relative paths hold
    check.write_text(index.read_text().replace("</body>", LOADED_JS))
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", check.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    images = re.search(r'<body data-images="(\d+)" data-loaded="(\d+)"', dom)
    assert images is not None, dom[:500]
    assert images.group(1) == images.group(2) == "5"
    shot = tmp_path / "page.png"
    subprocess.run([*flags, "--window-size=1000,700", f"--screenshot={shot}", index.as_uri()],
                   capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (700, 1000, 3)
    assert (pixels.min(axis=2) < 200).mean() > 0.1  # the frames, not a blank page


def test_a_result_of_a_closed_database_shows_its_rows_and_refuses_export(small_traffic, tmp_path):
    video, labels = small_traffic
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS v; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE v = truth")
        result = db.sql(LIMIT)
    html = result._repr_html_()
    assert "frames not shown: the database this result came from is closed" in html
    assert "<table" in html and "<img" not in html
    with pytest.raises(VidqlError, match="the database this result came from is closed"):
        result.export(tmp_path / "out")
