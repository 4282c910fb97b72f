"""Real-node tier: kubelet, containerd and kube-proxy per node, Tabby from manifests/.

One lab serves a whole test module (bringing it up takes about a minute); the
tier's leftover check allows that lab's daemons, namespaces and mounts while it
runs, and the fixture's teardown must then remove all of them. The check finds
the lab by its fixture name: a module that needs another lab overrides
`kube_cluster` itself (test_lifecycle.py), never under another name, or a CNI call
containerd happens to run at a test's end is reported as the test's leftover.
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
