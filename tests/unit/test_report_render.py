"""The report renderer: a real PNG of sane size, one panel per panel name, HTML that embeds it."""
from __future__ import annotations

import base64
import io
import math
import re
import struct
from pathlib import Path

import pytest
from matplotlib.image import imread

from daemon.report import Marker, Report, Series, Span, Threshold, render_html, render_png
from daemon.report.render import (build_figure, colour_keys, finite_points, tag_levels, time_scale, wants_log_scale,
                                  y_cap)

T0 = 1_700_000_000.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR is the first chunk)."""
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def incident_report(table_rows: int = 3) -> Report:
    times = [T0 + i for i in range(0, 120, 2)]
    tail = [6.0 if t < T0 + 40 or t > T0 + 75 else 600.0 for t in times]
    return Report(
        title="ranker <tail> & friends",
        series=[
            Series("P50 Prometheus", times, [2.0] * len(times), "ms"),
            Series("P99.9 Prometheus", times, tail, "ms"),
            Series("P99.9 clients", times, [v * 1.1 for v in tail], "ms"),
            Series("weight v2", times, [20.0] * 40 + [0.0] * 20, "%", panel="weights"),
            Series("gateway timeout", times, [30000.0] * 45 + [2000.0] * 15, "ms", panel="timeout"),
        ],
        markers=[Marker(T0 + 40, "ranker now serves v2", "deploy"), Marker(T0 + 52, "3/5 above", "detection"),
                 Marker(T0 + 52.5, "pin v1", "action"), Marker(T0 + 75, "below 500 ms", "recovery")],
        spans=[Span(T0 + 55, T0 + 85, "TritonTailLatencyHigh pending"), Span(T0 + 85, None, "firing")],
        thresholds=[Threshold(500.0, "P99.9 limit")],
        table_header=("time", "kind", "what"),
        table_rows=[("12:00:0%d" % i, "apply", "loaded <ranker> v1 " * 20) for i in range(table_rows)],
        notes=["measured on loopback"],
    )


@pytest.mark.slow
def test_png_is_a_real_png_of_sane_dimensions(tmp_path: Path) -> None:
    """The file starts with the PNG signature, is some kilobytes, and is wider than tall-ish bounds."""
    path = render_png(incident_report(), tmp_path / "sub" / "report.png")
    data = path.read_bytes()
    width, height = png_size(data)
    assert 800 <= width <= 2000 and 600 <= height <= 3000
    assert 20_000 < len(data) < 600_000
    pixels = imread(str(path))
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.05  # something was drawn, not a blank canvas


def test_one_panel_per_panel_name_sharing_the_time_axis() -> None:
    """latency, weights and timeout each get an axes; all share x; the latency one is on log scale."""
    fig = build_figure(incident_report(table_rows=0))
    axes = fig.get_axes()
    assert [a.get_ylabel() for a in axes] == ["latency (ms)", "weights (%)", "timeout (ms)"]
    assert axes[0].get_yscale() == "log"
    assert axes[1].get_shared_x_axes().joined(axes[0], axes[2])
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "P99.9 clients" in labels and "TritonTailLatencyHigh pending" in labels
    assert any(label.startswith("1 deploy:") for label in labels)


def test_an_alert_pending_twice_is_one_legend_entry() -> None:
    """An alert that went pending, resolved and went pending again shades twice, named once."""
    report = incident_report(table_rows=0)
    report.spans.insert(0, Span(T0 + 20, T0 + 30, "TritonTailLatencyHigh pending"))
    labels = [t.get_text() for t in build_figure(report).get_axes()[0].get_legend().get_texts()]
    assert labels.count("TritonTailLatencyHigh pending") == 1


@pytest.mark.slow
def test_table_adds_an_axes_under_the_panels() -> None:
    """Decisions rows are drawn in the picture too, cut to one line."""
    fig = build_figure(incident_report(table_rows=4))
    assert len(fig.get_axes()) == 4
    cell = fig.get_axes()[-1].tables[0].get_celld()[(1, 2)]
    assert cell.get_text().get_text().endswith("\u2026")


def test_html_embeds_the_png_and_escapes_text(tmp_path: Path) -> None:
    """One self-contained page: the picture as base64 data, the table in full, text escaped."""
    path = render_html(incident_report(), tmp_path / "report.html")
    page = path.read_text(encoding="utf-8")
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert match is not None
    width, _ = png_size(base64.b64decode(match.group(1)))
    assert width > 800
    assert "ranker &lt;tail&gt; &amp; friends" in page
    assert page.count("loaded &lt;ranker&gt; v1") >= 20  # full text, not cut like the picture
    assert "measured on loopback" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched when opened


@pytest.mark.slow
def test_empty_and_nan_series_render(tmp_path: Path) -> None:
    """No points, all-NaN values and NaN gaps are drawn as gaps or 'no data', never an error."""
    report = Report(
        title="sparse",
        series=[Series("P99.9 Prometheus", [], [], "ms"),
                Series("P99.9 clients", [T0, T0 + 1, T0 + 2], [math.nan, 3.0, math.inf], "ms"),
                Series("weight v2", [T0, T0 + 1], [math.nan, math.nan], "%", panel="weights")],
        markers=[], spans=[], thresholds=[], table_header=(), table_rows=[], notes=[],
    )
    data = render_png(report, tmp_path / "sparse.png").read_bytes()
    assert png_size(data)[0] > 800
    render_html(report, tmp_path / "sparse.html")


def test_report_with_nothing_at_all_still_renders() -> None:
    """No series, no markers: one empty latency panel saying 'no data'."""
    fig = build_figure(Report("nothing", [], [], [], [], (), [], []))
    (ax,) = fig.get_axes()
    assert any(t.get_text() == "no data" for t in ax.texts)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert buffer.getvalue()[:8] == PNG_SIGNATURE


def test_mismatched_series_is_a_bug_reported_by_name() -> None:
    """Times and values of different lengths raise, naming the series."""
    with pytest.raises(ValueError, match="'broken'"):
        finite_points(Series("broken", [T0, T0 + 1], [1.0], "ms"))


def test_layout_decisions() -> None:
    """Pure helpers: time unit by extent, log scale over two decades, stacked tags, shared colours."""
    assert time_scale(120) == (1.0, "s")
    assert time_scale(3600) == (60.0, "min")
    assert time_scale(86400) == (3600.0, "h")
    assert wants_log_scale([1.0, 600.0]) and not wants_log_scale([1.0, 50.0])
    assert not wants_log_scale([0.0, 1.0, 600.0]) and not wants_log_scale([math.nan])
    assert tag_levels([0.0, 0.5, 1.0, 50.0], extent=100.0) == [0, 1, 2, 0]
    assert y_cap([100.0] * 60 + [4500.0], [500.0]) == 1250.0 and y_cap([100.0, 600.0], [500.0]) is None
    held = [0.0] * 40 + [0.5] * 60 + [40.0]  # a share at 5x its 0.1 line for most of the run, one spike
    assert y_cap(held, [0.1]) == pytest.approx(0.6)  # the held level in view, the spike clipped
    assert y_cap([1.0], []) is None
    assert colour_keys(["P50 a", "P99.9 Prometheus", "P99.9 clients", "weight v1", "weight v2"]) == {
        "P50 a": 0, "P99.9 Prometheus": 1, "P99.9 clients": 1, "weight v1": 2, "weight v2": 3}
