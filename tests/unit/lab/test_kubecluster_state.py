"""The real-node lab's state file: a later `tabbyctl lab ...` process re-opens the lab
with what it was started with, whatever its own environment says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.kubecluster import KubeCluster, KubeSpec, load_lab
from lab.podlab import STATE_DIRS, clear_workdir


def _state(workdir: Path, **extra: object) -> None:
    state = {
        "mode": "kubelet",
        "spec": {
            "nodes": 2,
            "subnets": 1,
            "proxy_mode": "nftables",
            "cni": "tabby",
            "max_pods": 110,
        },
        "lab_id": None,
        "apiserver_port": 6443,
        "pods": {"a/b": {"namespace": "a", "name": "b", "node": "node1", "ip": "10.244.0.5"}},
        **extra,
    }
    (workdir / "cluster.json").write_text(json.dumps(state))


def test_a_lab_is_reopened_with_the_binaries_it_was_started_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` with TABBY_CACHE_DIR set, `tabbyctl lab down` without: down must still
    find crictl to remove the pods (it left sandboxes running when it did not)."""
    _state(tmp_path, bin_dir="/opt/k8s-bin")
    monkeypatch.setenv("TABBY_CACHE_DIR", str(tmp_path / "elsewhere"))
    cluster = load_lab(tmp_path)
    assert isinstance(cluster, KubeCluster)
    assert cluster.kubectl_argv()[0] == "/opt/k8s-bin/kubectl"
    assert cluster.spec == KubeSpec(nodes=2, proxy_mode="nftables")
    assert cluster.pods["a/b"].ip == "10.244.0.5"


def test_clearing_a_work_dir_removes_an_old_labs_state_and_keeps_other_files(
    tmp_path: Path,
) -> None:
    """An old etcd data dir would bring an earlier lab's Nodes and Pods back."""
    for name in STATE_DIRS:
        (tmp_path / name / "etcd-data").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("mine")
    clear_workdir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
