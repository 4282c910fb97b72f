"""The soak reads IPAM only after answered DELs are torn down: the marker scan."""

from __future__ import annotations

from pathlib import Path

from felix.cni_server.journal import AddJournal
from felix.cni_server.request import CNIRequest, parse_request
from tests.soak.runner import JOURNAL, unfinished_teardowns


def _request(command: str, container_id: str) -> CNIRequest:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": "K8S_POD_NAMESPACE=soak-churn;K8S_POD_NAME=c1-0",
    }
    config = {"cniVersion": "1.1.0", "name": "k8s-pod-network", "type": "tabby"}
    return parse_request({"command": command, "env": env, "config": config})


def test_an_answered_del_is_pending_until_its_marker_is_gone(tmp_path: Path) -> None:
    journal = AddJournal(tmp_path / "node1" / JOURNAL)
    marker = journal.begin_delete(_request("DEL", "a" * 64), "cali0123456789a")
    journal.begin(_request("ADD", "b" * 64))  # an ADD in flight is not a teardown
    run_dirs = {"node1": tmp_path / "node1", "node2": tmp_path / "node2"}

    pending = unfinished_teardowns(run_dirs)
    assert len(pending) == 1 and pending[0].startswith("node1: DEL answered"), pending

    journal.forget(marker)
    assert unfinished_teardowns(run_dirs) == []
