"""Fail when the product packages hold the same logic twice: a stretch of identical code MIN_LINES
lines long or longer.

Pure Python (the standard library's tokenizer), so `make test` needs nothing new. Each module is cut
into logical lines with comments, docstrings, blank lines and indentation dropped, and whitespace
inside a line normalised (tokens joined by one space): a block copied and re-indented still matches;
a renamed variable does not (that is a different line). Import lines are left out (two modules
importing alike share no logic). Stretches of at least SEED consecutive identical logical lines found
in two places are grown to their longest, and reported when both copies span MIN_LINES lines of
code or more (the physical lines of their statements: blank, comment and docstring lines are not code).

    python scripts/check_duplicates.py            # the product packages
    python scripts/check_duplicates.py PATH ...   # these files or directories only
"""
from __future__ import annotations

import io
import sys
import tokenize
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_PACKAGES = ("core", "daemon", "detectors", "actions", "policies")
MIN_LINES = 8
SEED = 3  # logical lines: shorter shared runs (a `return None`, two assignments) are not searched
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}


@dataclass(frozen=True)
class Line:
    """One logical line: its normalised text and the physical line it starts on."""

    text: str
    start: int
    end: int  # its last physical line

    @property
    def span(self) -> int:
        return self.end - self.start + 1


def logical_lines(source: str) -> list[Line]:
    """The module's logical lines that carry logic (no docstring, import, comment or blank line)."""
    out: list[Line] = []
    tokens: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _SKIPPED:
            continue
        if tok.type != tokenize.NEWLINE:
            tokens.append(tok)
            continue
        if tokens and not _trivial(tokens):
            out.append(Line(" ".join(t.string for t in tokens), tokens[0].start[0], tokens[-1].end[0]))
        tokens = []
    return out


def _trivial(tokens: list[tokenize.TokenInfo]) -> bool:
    if len(tokens) == 1 and tokens[0].type == tokenize.STRING:
        return True  # a docstring (or a bare string statement)
    return tokens[0].string in ("import", "from") and any(t.string == "import" for t in tokens)


@dataclass(frozen=True)
class Copy:
    """A stretch of code found in two places: (path, first physical line) each, and its length in lines
    of code (the shorter copy's)."""

    first: tuple[Path, int]
    second: tuple[Path, int]
    length: int


def duplicates(files: dict[Path, list[Line]], min_lines: int = MIN_LINES, seed: int = SEED) -> list[Copy]:
    """Every maximal stretch of identical logical lines, found twice, whose copies both span at least
    `min_lines` lines of code."""
    seen: dict[tuple[str, ...], list[tuple[Path, int]]] = defaultdict(list)
    for path, lines in files.items():
        for i in range(len(lines) - seed + 1):
            seen[tuple(line.text for line in lines[i:i + seed])].append((path, i))
    pairs: set[tuple[tuple[Path, int], tuple[Path, int]]] = set()
    for places in seen.values():
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (pa, ia), (pb, ib) = places[a], places[b]
                if pa != pb or abs(ia - ib) >= seed:  # overlapping windows of one run are no copy
                    pairs.add((places[a], places[b]))
    found: list[Copy] = []
    for (pa, ia), (pb, ib) in sorted(pairs, key=lambda p: (str(p[0][0]), p[0][1], str(p[1][0]), p[1][1])):
        if ((pa, ia - 1), (pb, ib - 1)) in pairs:
            continue  # inside a stretch already counted from its start
        run = seed
        while ((pa, ia + run - seed + 1), (pb, ib + run - seed + 1)) in pairs:
            run += 1
        length = min(sum(line.span for line in files[pa][ia:ia + run]),
                     sum(line.span for line in files[pb][ib:ib + run]))
        if length >= min_lines:
            found.append(Copy((pa, files[pa][ia].start), (pb, files[pb][ib].start), length))
    return found


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [ROOT / p for p in PRODUCT_PACKAGES]
    paths = sorted({p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py"))})
    files = {p: logical_lines(p.read_text(encoding="utf-8")) for p in paths}
    found = duplicates(files)

    def show(place: tuple[Path, int]) -> str:
        path, line = place
        return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"

    for copy in found:
        print(f"{show(copy.first)} and {show(copy.second)}: {copy.length} identical lines of code")
    if found:
        print(f"check_duplicates: {len(found)} stretch(es) of {MIN_LINES}+ identical lines of code: share them")
        return 1
    print(f"check_duplicates: no {MIN_LINES}+ identical lines of code twice in {len(paths)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
