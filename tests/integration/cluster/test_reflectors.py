"""Route reflector topology: clients peer only with the reflector, and still reach each other."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.cluster import ClusterSpec, LabCluster


@pytest.fixture
def reflected(tmp_path: Path) -> Iterator[LabCluster]:
    spec = ClusterSpec(nodes=5, bgp="reflectors", reflectors=1)
    cluster = LabCluster.up(tmp_path / "lab", spec)
    try:
        yield cluster
    finally:
        cluster.down()


def _peers(cluster: LabCluster, node: str) -> list[dict[str, object]]:
    path = cluster.run_dir(node) / "bgp-status.json"
    peers: list[dict[str, object]] = json.loads(path.read_text())["peers"] if path.exists() else []
    return peers


def test_one_reflector_four_clients(reflected: LabCluster) -> None:
    reflector = reflected.nodes[0]
    clients = reflected.nodes[1:]
    pods = {n.name: reflected.create_pod("default", f"p-{n.name}", n.name) for n in reflected.nodes}

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = {c.name: [p.get("state") for p in _peers(reflected, c.name)] for c in clients}
        if all(s == ["up"] for s in states.values()):
            break
        time.sleep(0.5)
    for client in clients:
        peers = _peers(reflected, client.name)
        assert [p["address"] for p in peers] == [reflector.ip], peers  # one session: the reflector
        assert peers[0]["state"] == "up" and peers[0]["type"] == "route reflector"
    assert len(_peers(reflected, reflector.name)) == len(clients)

    for src in clients:
        for dst in clients:
            if src is not dst:
                assert reflected.can_reach(pods[src.name].key, pods[dst.name].key, attempts=5), (
                    f"{src.name} -> {dst.name}"
                )
