"""Real-node tier: kubelet, containerd and kube-proxy per node, Tabby from manifests/.

One lab serves a whole test module (bringing it up takes about a minute); the
tier's leftover check allows that lab's daemons, namespaces and mounts while it
runs, and the fixture's teardown must then remove all of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.kubecluster import KubeCluster, KubeSpec


def kube_lab(tmp_path_factory: pytest.TempPathFactory, spec: KubeSpec) -> Iterator[KubeCluster]:
    workdir = tmp_path_factory.mktemp("kubelab")
    cluster = KubeCluster.up(workdir, spec)
    try:
        yield cluster
    finally:
        cluster.down()
        assert not cluster.lab or not cluster.lab.namespaces(), "lab namespaces left"


@pytest.fixture(scope="module")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """Three real nodes on one subnet with Tabby installed from manifests/."""
    nodes = int(os.environ.get("TABBY_TEST_NODES", "3"))
    yield from kube_lab(tmp_path_factory, KubeSpec(nodes=nodes))


def sandbox_state_dir(cluster: KubeCluster) -> Path:
    assert cluster.lab is not None
    return cluster.lab.state_dir
