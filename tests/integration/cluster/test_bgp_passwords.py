"""BGP passwords through the agent (issue 40): the Secret tabby-bgp-passwords and the
BGPConfiguration's nodeMeshPassword, watched by real agents on a two-node lab.

The mesh is keyed once the Secret and the reference exist, re-keyed when the Secret
changes (the sessions come up again, counted), and left out, never unkeyed, while the
key is missing. tests/integration/bgp/test_bgp_passwords.py shows the kernel refusing
a wrong key; this shows the path from the Secret to ExaBGP.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bgp.config import BGP_SECRET, BGP_SECRET_NAMESPACE
from datastore import kinds
from datastore.errors import NotFound
from lab.cluster import ClusterSpec, LabCluster
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LabCluster]:
    lab = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=2))
    try:
        yield lab
    finally:
        with contextlib.suppress(NotFound):
            lab.datastore().delete_raw(kinds.SECRET, BGP_SECRET, BGP_SECRET_NAMESPACE)
        lab.down()


def _peers(cluster: LabCluster, node: str) -> list[dict[str, Any]]:
    path = cluster.run_dir(node) / "bgp-status.json"
    return list(json.loads(path.read_text())["peers"]) if path.exists() else []


def _config(cluster: LabCluster, node: str) -> str:
    path = cluster.run_dir(node) / "bgp" / "exabgp.conf"
    return path.read_text() if path.exists() else ""


def _keyed_and_up(cluster: LabCluster, password: str) -> bool:
    """Every node's one mesh session keyed with *password* and established."""
    line = f"md5-password {base64.b64encode(password.encode()).decode()};"
    for node in cluster.nodes:
        peers = _peers(cluster, node.name)
        if line not in _config(cluster, node.name):
            return False
        if [(p["state"], p.get("passwordKey")) for p in peers] != [("up", "mesh")]:
            return False
    return True


def _secret(cluster: LabCluster, data: dict[str, str]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": BGP_SECRET, "namespace": BGP_SECRET_NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    ds = cluster.datastore()
    try:
        current = ds.get_raw(kinds.SECRET, BGP_SECRET, BGP_SECRET_NAMESPACE)
    except NotFound:
        ds.create_raw(kinds.SECRET, body)
        return
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    ds.replace_raw(kinds.SECRET, body)


def test_the_mesh_is_keyed_from_the_secret_and_rekeyed_when_it_changes(
    cluster: LabCluster,
) -> None:
    a, b = cluster.nodes
    pods = [cluster.create_pod("default", f"p-{n.name}", n.name) for n in cluster.nodes]
    wait_for(lambda: all(_peers(cluster, n.name) for n in cluster.nodes), timeout=60, what="up")
    ds = cluster.datastore()
    _secret(cluster, {"mesh": "first key"})
    ref = {"secretKeyRef": {"name": BGP_SECRET, "key": "mesh"}}
    ds.patch_raw(kinds.BGPCONFIGURATION, "default", {"spec": {"nodeMeshPassword": ref}})
    wait_for(lambda: _keyed_and_up(cluster, "first key"), timeout=90, what="keyed mesh up")
    assert cluster.can_reach(pods[0].key, pods[1].key, attempts=5)
    for node in cluster.nodes:
        config_file = cluster.run_dir(node.name) / "bgp" / "exabgp.conf"
        assert config_file.stat().st_mode & 0o777 == 0o600
        assert "first key" not in config_file.read_text()
    sessions = {n.name: _peers(cluster, n.name)[0]["sessions"] for n in cluster.nodes}

    # Rotated: a new session with the new key, on both nodes.
    _secret(cluster, {"mesh": "second key"})
    wait_for(lambda: _keyed_and_up(cluster, "second key"), timeout=90, what="re-keyed mesh up")
    wait_for(
        lambda: all(_peers(cluster, n.name)[0]["sessions"] > sessions[n.name] for n in (a, b)),
        timeout=90,
        what="sessions re-established",
    )
    assert cluster.can_reach(pods[0].key, pods[1].key, attempts=5)

    # The key gone: the mesh is left out of ExaBGP's configuration, not run unkeyed.
    _secret(cluster, {"other": "x"})
    wait_for(
        lambda: all(_peers(cluster, n.name) == [] for n in cluster.nodes),
        timeout=60,
        what="mesh sessions left out",
    )
    assert all("md5" not in _config(cluster, n.name) for n in cluster.nodes)
    assert not any(
        re.search(r"^neighbor \d", _config(cluster, n.name), re.M) for n in cluster.nodes
    )
    _secret(cluster, {"mesh": "second key"})
    wait_for(lambda: _keyed_and_up(cluster, "second key"), timeout=90, what="mesh back")
