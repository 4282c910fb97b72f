"""Real-node tier: kubelet, containerd and kube-proxy per node, Tabby from manifests/.

A lab takes about 45 s to bring up, so modules share them: each module names the lab
it needs (a `KubeSpec`), the tier keeps the last one running, and the next module
that asks for the same spec gets it as it was left (modules therefore use namespaces
of their own). The modules are ordered so that equal specs follow each other, and
test_lifecycle.py, which deletes a node and replaces agents, runs last on its lab.

The tier's leftover check allows the running lab's daemons, namespaces, mounts and
cgroups; it finds the lab by its fixture name, so a module that needs another lab
overrides `kube_cluster` itself (through `shared_lab`), never under another name, or
a CNI call containerd happens to run at a test's end is reported as the test's
leftover. The last lab is removed, and checked gone, when the tier ends.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import yaml

from lab.kubecluster import KubeCluster, KubeSpec

# Modules in the order their labs allow sharing (the rest keep pytest's order, first).
LAST_MODULES = ("test_services.py", "test_lifecycle.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """real_nodes and services[iptables] share a lab, services[nftables] and lifecycle
    another; lifecycle, which deletes a node, comes last. (The hook sees the whole
    session's items: only this tier's are reordered, in the places they held.)"""
    del config
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if item.path.parent == here]

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LAST_MODULES.index(name) + 1 if name in LAST_MODULES else 0

    ordered = sorted((items[i] for i in places), key=rank)  # stable within a module
    for place, item in zip(places, ordered, strict=True):
        items[place] = item


class LabPool:
    """At most one running lab, kept for the next module that asks for its spec."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.spec: KubeSpec | None = None
        self.cluster: KubeCluster | None = None

    def get(self, spec: KubeSpec) -> KubeCluster:
        if self.cluster is not None and self.spec == spec:
            return self.cluster
        self.close()
        self.cluster = KubeCluster.up(self.tmp_path_factory.mktemp("kubelab"), spec)
        self.spec = spec
        return self.cluster

    def close(self) -> None:
        cluster, self.cluster, self.spec = self.cluster, None, None
        if cluster is not None:
            cluster.down()
            assert not cluster.lab or not cluster.lab.namespaces(), "lab namespaces left"


@pytest.fixture(scope="package")
def lab_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPool]:
    pool = LabPool(tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


def shared_lab(pool: LabPool, spec: KubeSpec) -> Iterator[KubeCluster]:
    """The module's lab: the running one when its spec matches."""
    yield pool.get(spec)


@pytest.fixture(scope="module")
def kube_cluster(lab_pool: LabPool) -> Iterator[KubeCluster]:
    """Three real nodes on one subnet with Tabby installed from manifests/."""
    nodes = int(os.environ.get("TABBY_TEST_NODES", "3"))
    yield from shared_lab(lab_pool, KubeSpec(nodes=nodes))


def sandbox_state_dir(cluster: KubeCluster) -> Path:
    assert cluster.lab is not None
    return cluster.lab.state_dir


def web_service(cluster: KubeCluster, namespace: str) -> str:
    """Service `web` (port 80 -> the agnhost pods' 8080, selector app=web); its ClusterIP."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(service))
    found = json.loads(cluster.kubectl("-n", namespace, "get", "svc", "web", "-o", "json"))
    return str(found["spec"]["clusterIP"])


def service_answers(cluster: KubeCluster, client: str, address: str, tries: int = 20) -> set[str]:
    """Which backends answer `GET /hostname` on address:80 from the client pod."""
    seen = set()
    for _ in range(tries):
        got = cluster.exec(client, ["curl", "-s", "-m", "2", f"http://{address}/hostname"])
        if got.returncode == 0:
            seen.add(got.stdout.strip())
    return seen


Kubectl = Callable[..., CompletedProcess[str]]


def as_token(cluster: KubeCluster, token: str, workdir: Path) -> Kubectl:
    """kubectl as the holder of *token* alone (no client certificate beside it, which the
    apiserver would authenticate first): what a thief of a ServiceAccount token runs."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": server}],
        "users": [{"name": "thief", "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "thief"}}],
        "current-context": "lab",
    }
    path = workdir / f"kubeconfig-{len(list(workdir.glob('kubeconfig-*')))}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    binary = cluster.kubectl_argv()[0]

    def kubectl(*args: str, stdin: str | None = None) -> CompletedProcess[str]:
        argv = [binary, f"--kubeconfig={path}", *args]
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=60, check=False
        )

    return kubectl
