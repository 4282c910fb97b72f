"""Integration tier: real kube-apiserver + etcd, real network namespaces, root.

Every test here is checked to leave no network namespace, mount, cgroup or child
process behind (beyond the session's control plane), before and after it runs, and
to leave the host's own links and routes, and its cgroup mounts' options (a
container once remounted them read-only), as they were. When several test sessions share the
machine, TABBY_LEFTOVER_CHECK=own limits the namespace check to this process's own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from datastore.client import Datastore
from lab import netns
from lab.controlplane import ControlPlane
from lab.host_snapshot import cgroup_entries
from lab.netns import list_netns


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="integration tests need root (network namespaces)")
        for item in items:
            item.add_marker(skip)


def _children(pid: int, tree: dict[int, list[int]] | None = None) -> set[int]:
    """All descendants of pid, from /proc (no psutil needed) or a snapshot of it."""
    parents = tree if tree is not None else _process_tree()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _process_tree() -> dict[int, list[int]]:
    """parent pid -> child pids, one snapshot of /proc (zombies and helpers left out)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z" or _is_python_helper(entry):
            continue
        parents.setdefault(int(ppid), []).append(int(entry.name))
    return parents


def _is_python_helper(proc: Path) -> bool:
    """multiprocessing's resource tracker lives for the whole session by design."""
    try:
        return b"multiprocessing" in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def _host_network() -> tuple[str, str]:
    """The host namespace's links and routes: tests must never change them."""

    def out(*argv: str) -> str:
        return subprocess.run(argv, check=False, capture_output=True, text=True).stdout

    links = out("ip", "-o", "link", "show")
    names = "\n".join(sorted(line.split(":")[1].strip() for line in links.splitlines()))
    return names, out("ip", "route", "show", "table", "all")


def _described(pids: set[int]) -> list[str]:
    """pid: command line, for a leftover report that says what was left."""
    out = []
    for pid in sorted(pids):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            argv = "(gone)"
        out.append(f"{pid}: {argv.strip()[:200]}")
    return out


def _mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


@pytest.fixture(scope="session", autouse=True)
def netns_dir_prepared() -> None:
    """/run/netns mounted before the first leftover snapshot (see prepare_netns_dir)."""
    if os.geteuid() == 0:
        netns.prepare_netns_dir()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver for the session, with Tabby's CRDs installed."""
    cp = ControlPlane.start(tmp_path_factory.mktemp("controlplane"))
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def datastore(control_plane: ControlPlane) -> Datastore:
    return control_plane.datastore()


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a namespace, a mount or a process behind."""
    me = os.getpid()
    netns_before, mounts_before, kids_before = set(list_netns()), _mounts(), _children(me)
    host_before, cgroups_before = _host_network(), cgroup_entries()
    yield
    # Session fixtures (the control plane) may start between before and after.
    # One snapshot of the process table for both sides: a lab's runtime starts and
    # ends processes (shims, CNI calls) all the time.
    tree = _process_tree()
    allowed: set[int] = set()
    if "control_plane" in request.fixturenames:
        cp: ControlPlane = request.getfixturevalue("control_plane")
        for pid in cp.pids_running():
            allowed |= {pid, *_children(pid, tree)}
    new_netns = set(list_netns()) - netns_before
    new_mounts = _mounts() - mounts_before
    cgroups_after = cgroup_entries()
    new_cgroups, lost_cgroups = cgroups_after - cgroups_before, cgroups_before - cgroups_after
    if "kube_cluster" in request.fixturenames:
        # A module's real-node lab outlives each test; its own teardown checks it.
        lab = request.getfixturevalue("kube_cluster")
        for pid in lab.daemon_pids():  # kubelet, containerd (its shims and containers), ...
            allowed |= {pid, *_children(pid, tree)}
        new_netns -= set(lab.namespaces())
        new_mounts = {m for m in new_mounts if not m.startswith(lab.state_prefix())}
        new_cgroups = {c for c in new_cgroups if not lab.owns_cgroup(c.split("/", 1)[-1])}
        lost_cgroups = {c for c in lost_cgroups if not lab.owns_cgroup(c.split("/", 1)[-1])}
    if os.environ.get("TABBY_LEFTOVER_CHECK") == "own":
        # Another test session shares this machine (parallel development): judge
        # namespaces by name only for those this process created.
        new_netns &= netns.CREATED
        new_mounts = {m for m in new_mounts if Path(m).name in netns.CREATED}
    new_kids = {
        p for p in _children(me, tree) - kids_before - allowed if Path(f"/proc/{p}").exists()
    }
    assert not new_netns, f"test left network namespaces behind: {sorted(new_netns)}"
    assert not new_mounts, f"test left mounts behind: {sorted(new_mounts)}"
    assert not new_cgroups, f"test left cgroups or changed cgroup mounts: {sorted(new_cgroups)}"
    assert not lost_cgroups, f"test removed cgroups or cgroup mounts: {sorted(lost_cgroups)}"
    assert not new_kids, f"test left processes behind: {_described(new_kids)}"
    assert _host_network() == host_before, "test changed the host's own links or routes"
