"""The demo's console: timeline lines, and a live progress line that rewrites itself on a terminal
(plain lines every few seconds when output goes to a file or a pipe)."""
from __future__ import annotations

import sys
from typing import TextIO

from lab.scenarios.timeline import Progress, progress_text

PLAIN_EVERY_SECONDS = 10.0
"""Without a terminal, a progress line this often (and at each phase change), not a flood."""


class Console:
    """Writes timeline events and the progress line without one garbling the other."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._shown = False
        self._last_plain: tuple[str, float] | None = None

    def event(self, elapsed_seconds: float, text: str) -> None:
        """One timeline line, kept on screen."""
        self._clear()
        self.stream.write(f"[{elapsed_seconds:6.1f}s] {text}\n")
        self.stream.flush()

    def progress(self, p: Progress) -> None:
        """Rewrite the live line (terminal) or print one now and then (no terminal)."""
        line = progress_text(p)
        if self.live:
            self.stream.write("\r\x1b[2K" + line)
            self._shown = True
        elif (self._last_plain is None or self._last_plain[0] != p.phase
              or p.elapsed_seconds - self._last_plain[1] >= PLAIN_EVERY_SECONDS):
            self.stream.write(line + "\n")
            self._last_plain = (p.phase, p.elapsed_seconds)
        self.stream.flush()

    def text(self, text: str) -> None:
        """Plain output (the summary at the end)."""
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = False
