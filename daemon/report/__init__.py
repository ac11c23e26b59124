"""Reports people look at: a timeline of series, markers and spans over a decisions table.

Rendered with matplotlib (PNG) and wrapped in one self-contained HTML page. The demo and the
backtest CLI build a `Report` and hand it here; nothing in this room does I/O but writing the file.
"""
from daemon.report.model import Marker, Report, Series, Span, Threshold
from daemon.report.render import render_html, render_png

__all__ = ["Marker", "Report", "Series", "Span", "Threshold", "render_html", "render_png"]
