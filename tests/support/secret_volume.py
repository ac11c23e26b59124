"""A Kubernetes Secret volume as the kubelet lays it out, for tests of token rotation."""
from __future__ import annotations

import os
from pathlib import Path


class SecretVolume:
    """A folder laid out as the kubelet lays out a Secret volume: `key -> ..data/key`,
    `..data -> ..<version>`; `update` writes a new version folder and renames a new `..data`
    link over the old one (one atomic step, the old folder then removed)."""

    def __init__(self, root: Path, files: dict[str, str]) -> None:
        self.root, self.version = root, 0
        root.mkdir()
        self._write(files)
        for key in files:
            (root / key).symlink_to(Path("..data") / key)

    def _write(self, files: dict[str, str]) -> None:
        self.version += 1
        folder = self.root / f"..2026_12_02_{self.version}"
        folder.mkdir()
        for key, text in files.items():
            (folder / key).write_text(text)
        link = self.root / "..data_tmp"
        link.symlink_to(folder.name)
        os.replace(link, self.root / "..data")

    def update(self, files: dict[str, str]) -> None:
        old = (self.root / "..data").resolve()
        self._write(files)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
