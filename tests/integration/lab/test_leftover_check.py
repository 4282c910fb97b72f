"""The integration tier's leftover check itself: what it sees of the host's cgroups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab.host_snapshot import CGROUP_ROOT, cgroup_entries

pytestmark = pytest.mark.integration


def test_a_cgroup_left_at_a_hierarchys_root_is_seen_and_its_removal_too() -> None:
    hierarchy = next((h for h in sorted(CGROUP_ROOT.iterdir()) if h.name == "pids"), None)
    if hierarchy is None:
        pytest.skip("no pids cgroup hierarchy on this host")
    before = cgroup_entries()
    assert any(entry.startswith(f"mount {CGROUP_ROOT}") for entry in before), before
    probe = Path(hierarchy) / f"tabby-leftover-probe-{os.getpid()}"
    probe.mkdir()
    try:
        assert cgroup_entries() - before == {f"pids/{probe.name}"}
    finally:
        probe.rmdir()
    assert cgroup_entries() == before
