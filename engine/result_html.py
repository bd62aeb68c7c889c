"""A result as HTML: the report's figures, a grid of the frames its rows name (with the
oracle's boxes), an aggregate's estimates with their intervals drawn as bars, else its rows.
`notebook_html` is `Result._repr_html_` (thumbnails embedded as data URIs); `page` is the
self-contained `index.html` that `Result.export` writes beside its images."""
from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from vidql.base.errors import VidqlError
from vidql.engine.picture import draw_boxes, encoded
from vidql.engine.result_frames import ResultFrames, boxes_note

SHOWN_FRAMES = 24  # thumbnails a notebook shows
THUMB_WIDTH = 160
SHOWN_ROWS = 20  # rows a notebook shows of a result without frames or intervals
SHOWN_GROUPS = 50  # an aggregate's bars
BAR_WIDTH = 320
STYLE = ("<style>.vidql-result{font-family:sans-serif;font-size:13px}"
         ".vidql-result .grid{display:flex;flex-wrap:wrap;gap:8px}"
         ".vidql-result figure{margin:0}.vidql-result figcaption{font-size:11px;color:#333}"
         ".vidql-result pre{background:#f4f4f4;padding:6px;white-space:pre-wrap}"
         ".vidql-result .note{color:#555}.vidql-result td{padding:1px 6px}</style>")


@dataclass(frozen=True)
class Card:
    """One frame in a grid: its image's address (a file beside the page or a data URI), its
    width on the page, its caption (HTML), its text alternative, and where it links to (None:
    nowhere)."""

    src: str
    width: int
    caption: str
    alt: str
    link: str | None = None


def report_html(report) -> str:
    """The figures a user needs to trust a result: guarantee, oracle calls, cache hits and
    seconds (with notes)."""
    if report is None:
        return ""
    seconds = report.seconds.get("total", sum(report.seconds.values()))
    figures = [("operator", report.operator), ("guarantee", report.guarantee or "none"),
               ("oracle calls", report.oracle_calls), ("cache hits", report.cache_hits),
               ("seconds", f"{seconds:.2f}")]
    if report.seed is not None:
        figures.append(("seed", report.seed))
    notes = [report.details[k] for k in ("index_note", "note") if report.details.get(k)]
    return ("<p class='report'>" + " · ".join(f"<b>{html.escape(k)}</b>: {html.escape(str(v))}"
                                              for k, v in figures) + "</p>"
            + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes))


def grid_html(cards: list[Card], total: int, note: str = "") -> str:
    """A grid of frames, a line counting those not shown, and `note` (whose boxes)."""
    figures = []
    for card in cards:
        img = (f"<img src='{html.escape(card.src)}' width='{card.width}' "
               f"alt='{html.escape(card.alt)}'>")
        if card.link:
            img = f"<a href='{html.escape(card.link)}'>{img}</a>"
        figures.append(f"<figure style='width:{card.width}px'>{img}"
                       f"<figcaption>{card.caption}</figcaption></figure>")
    more = total - len(cards)
    rest = (f"<p class='note'>… and {more} more frame{'s' if more != 1 else ''} ({total} in "
            f"all)</p>") if more > 0 else ""
    return (f"<div class='grid'>{''.join(figures)}</div>{rest}"
            + (f"<p class='note'>{html.escape(note)}</p>" if note else ""))


def caption(row) -> str:
    """A frame's caption: clip, frame and ts (HTML)."""
    return (f"clip <b>{html.escape(str(row['clip']))}</b> · frame {int(row['frame'])} · "
            f"ts {float(row['ts']):.2f} s")


def is_aggregate(table: pa.Table) -> bool:
    return {"estimate", "ci_low", "ci_high"} <= set(table.column_names)


def intervals_html(table: pa.Table) -> str:
    """An aggregate's rows as bars: each group's interval [ci_low, ci_high] on one scale,
    with a tick at its estimate, and the numbers beside it."""
    names = table.column_names
    groups = names[:names.index("estimate")]
    rows = table.slice(0, SHOWN_GROUPS).to_pylist()
    values = [v for r in rows for v in (r["estimate"], r["ci_low"], r["ci_high"]) if _finite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    span = (hi - lo) or max(abs(hi), 1.0)
    lo, hi = lo - 0.05 * span, hi + 0.05 * span
    x = lambda v: BAR_WIDTH * (v - lo) / (hi - lo)  # noqa: E731
    head = "".join(f"<th>{html.escape(g)}</th>" for g in groups)
    lines = [f"<table class='intervals'><tr>{head}<th>estimate and interval</th><th></th></tr>"]
    for r in rows:
        cells = "".join(f"<td>{html.escape(str(r[g]))}</td>" for g in groups)
        est, low, high = r["estimate"], r["ci_low"], r["ci_high"]
        svg, text = "", "no estimate"
        if all(_finite(v) for v in (est, low, high)):
            svg = (f"<svg width='{BAR_WIDTH}' height='16' role='img'>"
                   f"<line x1='0' y1='8' x2='{BAR_WIDTH}' y2='8' stroke='#ddd'/>"
                   f"<rect x='{x(low):.1f}' y='3' width='{max(x(high) - x(low), 1):.1f}' "
                   f"height='10' fill='#9ecae1'/><line x1='{x(est):.1f}' y1='0' "
                   f"x2='{x(est):.1f}' y2='16' stroke='#08306b' stroke-width='2'/></svg>")
            text = f"{est:.4g} [{low:.4g}, {high:.4g}]"
        lines.append(f"<tr>{cells}<td>{svg}</td><td>{html.escape(text)}</td></tr>")
    lines.append("</table>")
    more = table.num_rows - len(rows)
    if more > 0:
        lines.append(f"<p class='note'>… and {more} more group{'s' if more != 1 else ''}</p>")
    return "".join(lines)


def rows_html(table: pa.Table) -> str:
    """The first SHOWN_ROWS rows as a table, and how many more there are."""
    shown = table.slice(0, SHOWN_ROWS).to_pandas().to_html(index=False, max_cols=30)
    more = table.num_rows - min(table.num_rows, SHOWN_ROWS)
    return shown + (f"<p class='note'>… and {more} more row{'s' if more != 1 else ''}</p>"
                    if more > 0 else "")


def notebook_html(result) -> str:
    """`Result._repr_html_`: the report, then the frames its rows name as thumbnails with
    the oracle's boxes (at most SHOWN_FRAMES), or an aggregate's intervals, or its rows."""
    body = report_html(result.report)
    try:
        frames = ResultFrames.of(result.catalog, result.report, result.table)
        if frames is not None and len(frames):
            return f"<div class='vidql-result'>{STYLE}{body}{_thumbnails(frames)}</div>"
    except (VidqlError, duckdb.Error) as exc:  # a closed database, a moved file
        body += f"<p class='note'>frames not shown: {html.escape(str(exc))}</p>"
    shown = intervals_html(result.table) if is_aggregate(result.table) else rows_html(result.table)
    return f"<div class='vidql-result'>{STYLE}{body}{shown}</div>"


def _thumbnails(frames: ResultFrames) -> str:
    rows = np.arange(min(len(frames), SHOWN_FRAMES))
    positions = frames.rows["position"].to_numpy()[rows]
    detections, note = boxes_note(frames, positions)
    cards = []
    for k, (pixels, scale) in zip(rows, frames.read(rows, THUMB_WIDTH), strict=True):
        image = draw_boxes(pixels, detections[detections["frame"] == positions[k]], scale)
        src = "data:image/jpeg;base64," + base64.b64encode(encoded(image)).decode()
        row = frames.rows.iloc[k]
        cards.append(Card(src, image.width, caption(row), f"{row['clip']} frame {row['frame']}"))
    return grid_html(cards, len(frames), note)


def page(query: str | None, report, body: str) -> str:
    """A self-contained HTML page: the query, its report, then `body`."""
    title = html.escape(" ".join((query or "vidql result").split())[:120])
    text = f"<pre class='query'>{html.escape(query)}</pre>" if query else ""
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title>"
            f"</head><body><div class='vidql-result'>{STYLE}<h1>vidql result</h1>{text}"
            f"{report_html(report)}{body}</div></body></html>\n")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
