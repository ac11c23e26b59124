"""Render a `Report` to a PNG (matplotlib, Agg backend) and to one self-contained HTML page.

The figure is built on `matplotlib.figure.Figure` with an Agg canvas, never through pyplot, so no
global state or display backend is involved and rendering is safe from any thread.
"""
from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from daemon.report.model import Marker, Report, Series

DEFAULT_DPI = 90
"""Small enough to commit a picture (about 100 KB), large enough to read the labels."""

FIGURE_WIDTH_INCHES = 12.0
PANEL_HEIGHT_INCHES = {"latency": 4.2}
"""The latency panel carries the story; the others (weights, timeout) are context."""
OTHER_PANEL_HEIGHT_INCHES = 1.8
TABLE_ROW_HEIGHT_INCHES = 0.24
MAX_TABLE_ROWS = 30
"""Rows drawn in the picture; the HTML table keeps them all."""
TABLE_CELL_CHARS = 110
"""Cells are cut to this many characters in the picture; the HTML table keeps the full text."""

MARKER_COLOURS = {
    "deploy": "#d62728",
    "detection": "#ff7f0e",
    "action": "#1f77b4",
    "verification": "#9467bd",
    "recovery": "#2ca02c",
}
NEUTRAL_COLOUR = "#7f7f7f"


# Pure layout decisions --------------------------------------------------------------------


def time_origin(report: Report) -> float | None:
    """The earliest finite time in the report (series, markers, spans), or None if there is none."""
    times: list[float] = [t for s in report.series for t in s.times]
    times += [m.t for m in report.markers] + [s.start for s in report.spans]
    finite = [t for t in times if math.isfinite(t)]
    return min(finite) if finite else None


def time_scale(extent_seconds: float) -> tuple[float, str]:
    """Divisor and unit for the x axis: seconds for a short run, minutes, hours beyond that."""
    if extent_seconds <= 600:
        return 1.0, "s"
    if extent_seconds <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def finite_points(series: Series) -> tuple[list[float], list[float]]:
    """The series' points, with NaN/inf values kept as NaN (a gap in the line), bad times dropped.

    Raises:
        ValueError: times and values differ in length (a bug in whoever built the series).
    """
    if len(series.times) != len(series.values):
        raise ValueError(f"series {series.name!r}: {len(series.times)} times but {len(series.values)} values")
    xs: list[float] = []
    ys: list[float] = []
    for t, v in zip(series.times, series.values):
        if not math.isfinite(t):
            continue
        xs.append(t)
        ys.append(v if math.isfinite(v) else math.nan)
    return xs, ys


def wants_log_scale(values: Sequence[float]) -> bool:
    """Log scale when positive values span more than two decades (P50 of 1 ms beside P99.9 of 600 ms)."""
    positive = [v for v in values if math.isfinite(v) and v > 0]
    if not positive:
        return False
    return max(positive) / min(positive) > 100 and all(v > 0 for v in values if math.isfinite(v))


def y_cap(values: Sequence[float], thresholds: Sequence[float], headroom: float = 2.5,
          brief: float = 0.95) -> float | None:
    """An upper y limit for a linear panel whose values shoot past `headroom` x its highest
    threshold in a brief spike, else None. What the series holds for long (its `brief` quantile)
    stays in view: a canary at 5x the budget for minutes is the story, not a spike to clip."""
    if not values or not thresholds or max(thresholds) <= 0:
        return None
    held = float(np.quantile(np.asarray(values, dtype=float), brief))
    cap = max(max(thresholds) * headroom, held * 1.2)
    return cap if max(values) > cap else None


def colour_keys(names: Sequence[str]) -> dict[str, int]:
    """A colour index per series name, shared by one quantile's views ("P99.9 clients", "P99.9 Prometheus")."""
    by_key: dict[str, int] = {}
    result: dict[str, int] = {}
    for name in names:
        first = name.split(" ", 1)[0]
        key = first if re.fullmatch(r"P\d+(\.\d+)?", first) else name
        result[name] = by_key.setdefault(key, len(by_key))
    return result


def tag_levels(positions: Sequence[float], extent: float, min_gap_fraction: float = 0.04) -> list[int]:
    """A stacking level per marker tag so that tags closer than `min_gap_fraction` of the axis never overlap."""
    gap = max(extent, 1e-9) * min_gap_fraction
    last_at_level: list[float] = []
    levels: list[int] = []
    for x in positions:
        for level, last in enumerate(last_at_level):
            if x - last >= gap:
                last_at_level[level] = x
                levels.append(level)
                break
        else:
            last_at_level.append(x)
            levels.append(len(last_at_level) - 1)
    return levels


def clip_cell(text: str, limit: int = TABLE_CELL_CHARS) -> str:
    """One line of at most `limit` characters, with an ellipsis when cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


# Drawing ------------------------------------------------------------------------------------


def build_figure(report: Report, dpi: int = DEFAULT_DPI) -> Figure:
    """The report's figure: one panel per `panel` name sharing the time axis, the table under them."""
    panels = report.panels()
    heights = [PANEL_HEIGHT_INCHES.get(p, OTHER_PANEL_HEIGHT_INCHES) for p in panels]
    table_rows = report.table_rows[:MAX_TABLE_ROWS]
    table_height = (len(table_rows) + 1) * TABLE_ROW_HEIGHT_INCHES if table_rows else 0.0
    origin = time_origin(report) or 0.0
    end = _time_end(report, origin)
    divisor, unit = time_scale(end - origin)
    ordered = sorted(report.markers, key=lambda m: m.t)
    xs = [(m.t - origin) / divisor for m in ordered]
    levels = tag_levels(xs, (end - origin) / divisor)
    top_inches = 0.5 + 0.17 * (max(levels) + 1 if levels else 0)
    gap_inches = 0.75 if table_rows else 0.0
    plots_height = sum(heights) + 0.15 * (len(heights) - 1)
    total = top_inches + plots_height + gap_inches + table_height + 0.55
    fig = Figure(figsize=(FIGURE_WIDTH_INCHES, total), dpi=dpi)
    FigureCanvasAgg(fig)
    plots_bottom = (table_height + gap_inches + 0.55) / total
    grid = fig.add_gridspec(len(panels), 1, height_ratios=heights, hspace=0.15 * len(heights) / sum(heights),
                            left=0.07, right=0.70, top=1 - top_inches / total, bottom=plots_bottom)
    axes: list[Axes] = []
    for i in range(len(panels)):
        axes.append(fig.add_subplot(grid[i], sharex=axes[0] if axes else None))

    for ax, panel in zip(axes, panels):
        _draw_panel(ax, report, panel, origin, divisor)
    _draw_spans(axes, report, origin, end, divisor)
    _draw_markers(axes, ordered, xs, levels)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    started = datetime.fromtimestamp(origin, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    axes[-1].set_xlabel(f"{unit} since {started}")
    axes[-1].set_xlim(0.0, max((end - origin) / divisor, 1e-6))
    fig.suptitle(report.title, fontsize=13, x=0.01, y=1 - 0.12 / total, ha="left", va="top")
    if table_rows:
        ax = fig.add_axes((0.01, 0.25 / total, 0.98, table_height / total))
        _draw_table(ax, report.table_header, table_rows)
    return fig


def _time_end(report: Report, origin: float) -> float:
    times: list[float] = [t for s in report.series for t in s.times]
    times += [m.t for m in report.markers] + [s.start for s in report.spans]
    times += [s.end for s in report.spans if s.end is not None]
    finite = [t for t in times if math.isfinite(t)]
    return max(finite) if finite else origin + 1.0


def _draw_panel(ax: Axes, report: Report, panel: str, origin: float, divisor: float) -> None:
    members = [s for s in report.series if s.panel == panel]
    colours = colour_keys([s.name for s in members])
    all_values: list[float] = []
    drawn = 0
    for series in members:
        xs, ys = finite_points(series)
        if not xs:
            continue
        # Clients' view dashed, Prometheus' solid, the same quantile in the same colour.
        style = "--" if "client" in series.name.lower() else "-"
        ax.plot([(x - origin) / divisor for x in xs], ys, style, label=series.name, linewidth=1.4,
                color=f"C{colours[series.name] % 10}",
                drawstyle="steps-post" if panel != "latency" else "default")
        all_values += ys
        drawn += 1
    for threshold in (t for t in report.thresholds if t.panel == panel):
        ax.axhline(threshold.value, color="black", linestyle=":", linewidth=1.0, label=threshold.label)
        all_values.append(threshold.value)
    if drawn == 0:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color=NEUTRAL_COLOUR)
    if wants_log_scale(all_values):
        ax.set_yscale("log")
    else:
        top = y_cap([v for v in all_values if math.isfinite(v)],
                    [t.value for t in report.thresholds if t.panel == panel])
        if top is not None:
            # A stall spike would flatten the story; cap the axis and say so.
            ax.set_ylim(top=top)
            ax.text(0.995, 0.98, "axis capped: higher values clipped", transform=ax.transAxes, ha="right",
                    va="top", fontsize=7, color=NEUTRAL_COLOUR)
    unit = members[0].unit if members else ""
    ax.set_ylabel(f"{panel} ({unit})" if unit else panel)
    ax.grid(True, which="major", alpha=0.3)


def _draw_spans(axes: list[Axes], report: Report, origin: float, end: float, divisor: float) -> None:
    named: set[str] = set()  # an alert pending twice is one legend entry, not two
    for span in report.spans:
        stop = span.end if span.end is not None else end
        # Pending lighter than firing: the rule's `for:` wait is visible beside the action.
        colour = "#ffbb78" if "pending" in span.label.lower() else "#ff9896"
        label = span.label if span.label not in named else None
        named.add(span.label)
        for j, ax in enumerate(axes):
            ax.axvspan((span.start - origin) / divisor, (stop - origin) / divisor, color=colour, alpha=0.3,
                       label=label if j == 0 else None, linewidth=0)


def _draw_markers(axes: list[Axes], ordered: list[Marker], xs: list[float], levels: list[int]) -> None:
    top = axes[0]
    for number, (marker, x, level) in enumerate(zip(ordered, xs, levels), start=1):
        colour = MARKER_COLOURS.get(marker.kind, NEUTRAL_COLOUR)
        for i, ax in enumerate(axes):
            # The top panel's legend names each numbered marker; the line repeats on every panel.
            ax.axvline(x, color=colour, linewidth=1.1, alpha=0.85,
                       label=f"{number} {marker.kind}: {clip_cell(marker.label, 34)}" if i == 0 else None)
        # Numbered tags above the top panel, stacked when close together.
        top.annotate(str(number), xy=(x, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(0, 3 + 12 * level), textcoords="offset points", ha="center", va="bottom",
                     fontsize=8, color="white", fontweight="bold",
                     bbox={"boxstyle": "round,pad=0.2", "facecolor": colour, "edgecolor": "none"})


def _draw_table(ax: Axes, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    ax.axis("off")
    width = max([len(header)] + [len(r) for r in rows])
    head = [clip_cell(h) for h in header] + [""] * (width - len(header))
    body = [[clip_cell(c) for c in row] + [""] * (width - len(row)) for row in rows]
    lengths = [max([len(head[i])] + [len(r[i]) for r in body]) + 2 for i in range(width)]
    total = float(sum(lengths)) or 1.0
    table = ax.table(cellText=body, colLabels=head if any(head) else None, bbox=Bbox.from_bounds(0.0, 0.0, 1.0, 1.0),
                     cellLoc="left", colLoc="left", colWidths=[n / total for n in lengths])
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    for (row, _), cell in table.get_celld().items():
        cell.PAD = 0.005  # a fraction of the cell's width: the default 0.1 indents wide columns by inches
        cell.set_edgecolor("#dddddd")
        if row == 0 and any(head):
            cell.set_facecolor("#f3f3f3")


# Files ------------------------------------------------------------------------------------


def png_bytes(report: Report, dpi: int = DEFAULT_DPI) -> bytes:
    """The report's picture as PNG bytes."""
    buffer = io.BytesIO()
    build_figure(report, dpi).savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def render_png(report: Report, path: str | Path, dpi: int = DEFAULT_DPI) -> Path:
    """Write the report's picture to `path` (parents created).

    Args:
        report: what to draw.
        path: where the PNG goes.
        dpi: resolution; the default keeps a committed picture small.

    Returns:
        The path written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(png_bytes(report, dpi))
    return target


def html_page(report: Report, png: bytes) -> str:
    """One self-contained page: the picture embedded as base64, the full decisions table, the notes."""
    esc = html.escape
    encoded = base64.b64encode(png).decode("ascii")
    head = "".join(f"<th>{esc(h)}</th>" for h in report.table_header)
    rows = "\n".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in report.table_rows)
    notes = "\n".join(f"<li>{esc(n)}</li>" for n in report.notes)
    markers = "\n".join(
        f"<tr><td>{esc(_utc(m.t))}</td><td>{esc(m.kind)}</td><td>{esc(m.label)}</td></tr>"
        for m in sorted(report.markers, key=lambda m: m.t))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(report.title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }}
td, th {{ border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{esc(report.title)}</h1>
<img alt="{esc(report.title)}" src="data:image/png;base64,{encoded}">
<h2>Timeline</h2>
<table><tr><th>time</th><th>kind</th><th>event</th></tr>
{markers}
</table>
<h2>Decisions</h2>
<table><tr>{head}</tr>
{rows}
</table>
<ul>
{notes}
</ul>
</body></html>
"""


def render_html(report: Report, path: str | Path, dpi: int = DEFAULT_DPI) -> Path:
    """Write one self-contained HTML page for the report to `path` (parents created).

    Args:
        report: what to show.
        path: where the page goes.
        dpi: resolution of the embedded picture.

    Returns:
        The path written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html_page(report, png_bytes(report, dpi)), encoding="utf-8")
    return target


def _utc(t: float) -> str:
    if not math.isfinite(t):
        return "?"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]
