"""A ServiceAccount volume laid out as kubelet writes it, for in-cluster tests."""

from __future__ import annotations

import os
from pathlib import Path


class Mount:
    """A ServiceAccount volume as kubelet's atomic writer lays it out: `token` and
    `ca.crt` are symlinks through `..data`, which is swapped to a new timestamped
    directory at each rotation."""

    def __init__(
        self,
        root: Path,
        token: str = "first-token",
        ca_pem: str = "not read until a connection is made\n",
    ) -> None:
        self.root = root
        self.ca_pem = ca_pem
        self.generation = 0
        root.mkdir()
        self.write(token)
        for name in ("token", "ca.crt"):
            (root / name).symlink_to(f"..data/{name}")

    def write(self, token: str) -> None:
        """Rotate: a new directory with both files, then one rename of `..data`."""
        self.generation += 1
        target = self.root / f"..gen_{self.generation}"
        target.mkdir()
        (target / "token").write_text(token)
        (target / "ca.crt").write_text(self.ca_pem)
        link = self.root / "..data_tmp"
        link.symlink_to(target.name)
        os.replace(link, self.root / "..data")
