"""Shared set-up for the lab-cluster tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from lab.cluster import ClusterSpec, LabCluster


@contextlib.contextmanager
def cluster_up(tmp_path: Path, spec: ClusterSpec) -> Iterator[LabCluster]:
    """A lab cluster under tmp_path/lab, brought down however the block ends."""
    cluster = LabCluster.up(tmp_path / "lab", spec)
    try:
        yield cluster
    finally:
        cluster.down()
