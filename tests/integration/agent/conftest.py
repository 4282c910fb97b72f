"""A lab node running the real tabby-node agent against the real apiserver."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni.install import conflist, install_shim
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import NotFound
from datastore.models import IPPool, IPPoolSpec, Meta
from lab import netns
from lab.controlplane import ControlPlane
from lab.process import ManagedProcess
from lab.topology import Lab, Node

REPO = Path(__file__).resolve().parents[3]
TABBY_NODE = Path(sys.executable).with_name("tabby-node")


@dataclass
class AgentNode:
    """One lab node with tabby-node running in it, and helpers to call the plugin."""

    lab: Lab
    node: Node
    run_dir: Path
    bin_dir: Path
    agent: ManagedProcess
    datastore: Datastore

    @property
    def socket(self) -> Path:
        return self.run_dir / "cni.sock"

    def network_config(self, version: str = "1.0.0") -> dict[str, Any]:
        config = conflist(socket=str(self.socket), chain_portmap=False, chain_bandwidth=False)
        plugin = dict(config["plugins"][0])  # type: ignore[index]
        return {"cniVersion": version, "name": config["name"], **plugin}

    def cni(
        self,
        command: str,
        container_id: str,
        pod_netns: str | None,
        *,
        pod: tuple[str, str] = ("default", "web"),
        version: str = "1.0.0",
    ) -> tuple[int, dict[str, Any]]:
        """Run the installed plugin inside the node namespace, as a runtime would."""
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": str(self.bin_dir),
            "CNI_ARGS": f"K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]};IgnoreUnknown=1",
        }
        if pod_netns:
            env["CNI_NETNS"] = f"/run/netns/{pod_netns}"
        proc = subprocess.run(
            ["ip", "netns", "exec", self.node.netns, str(self.bin_dir / "tabby")],
            input=json.dumps(self.network_config(version)),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        out = json.loads(proc.stdout) if proc.stdout.strip() else {}
        return proc.returncode, out

    def health(self, path: str) -> tuple[int, str]:
        out = netns.ns_exec(
            self.node.netns,
            [
                "curl",
                "-s",
                "-o",
                "/dev/stdout",
                "-w",
                "\n%{http_code}",
                f"http://127.0.0.1:9099{path}",
            ],
            check=False,
        )
        body, _, code = out.rpartition("\n")
        return int(code or 0), body


def create_pod(ds: Datastore, namespace: str, name: str, node: str) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }
    return ds.create_raw(kinds.POD, body)


def ensure_node(ds: Datastore, name: str, address: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"tabby.dev/ipv4-address": address}},
    }
    try:
        ds.get_raw(kinds.NODE, name)
    except NotFound:
        ds.create_raw(kinds.NODE, body)


def create_pool(ds: Datastore, *, nat_outgoing: bool = False) -> str:
    """A fresh IPPool 10.100.0.0/16 (blocks /26) for one test; its name, for clean-up."""
    pool_name = f"pool-{uuid.uuid4().hex[:6]}"
    spec = IPPoolSpec(cidr="10.100.0.0/16", block_size=26, nat_outgoing=nat_outgoing)
    ds.create(IPPool(metadata=Meta(name=pool_name), spec=spec))
    return pool_name


def agent_args(node_name: str, kubeconfig: Path, run_dir: Path, *extra: str) -> list[str]:
    """tabby-node's arguments for one lab node, then extra."""
    return [
        "--node-name",
        node_name,
        "--kubeconfig",
        str(kubeconfig),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def socket_answers(path: Path) -> bool:
    """A socket file alone proves nothing after a SIGKILL: the dead agent's stays."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def start_agent(
    lab: Lab,
    node: Node,
    name: str,
    argv: list[str],
    sock: Path,
    *,
    ready: Callable[[Path], bool] = socket_answers,
    keep_mounts: bool = False,
) -> ManagedProcess:
    """Start tabby-node (argv) in a lab node; wait up to 60 s until ready(sock)."""
    env = {"PYTHONPATH": str(REPO)}
    proc = lab.start_process(name, node, argv, env=env, keep_mounts=keep_mounts)
    deadline = time.monotonic() + 60
    while not ready(sock):
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"tabby-node did not start:\n{proc.log_tail(40)}")
        time.sleep(0.1)
    return proc


@contextlib.contextmanager
def running_agent(
    control_plane: ControlPlane, tmp_path: Path, *extra: str, nat_outgoing: bool = False
) -> Iterator[AgentNode]:
    """One lab node with tabby-node (its arguments, then *extra*) and a fresh pool;
    everything removed afterwards, whatever happened."""
    ds = control_plane.datastore()
    pool_name = create_pool(ds, nat_outgoing=nat_outgoing)
    lab = Lab.create(nodes=1)
    node = lab.node("node1")
    node_name = f"{node.name}-{lab.lab_id}"
    ensure_node(ds, node_name, str(node.address))
    run_dir, bin_dir = tmp_path / "run", tmp_path / "bin"
    install_shim(bin_dir, sys.executable)
    try:
        lab.relay_apiserver(node, control_plane.expose_unix_socket(), control_plane.apiserver_port)
        argv = [str(TABBY_NODE), *agent_args(node_name, control_plane.kubeconfig, run_dir, *extra)]
        agent = start_agent(lab, node, "tabby-node", argv, run_dir / "cni.sock", ready=Path.exists)
        yield AgentNode(lab, node, run_dir, bin_dir, agent, ds)
    finally:
        lab.teardown()
        _delete_pool_data(ds, pool_name, node_name)


@pytest.fixture
def agent_node(control_plane: ControlPlane, tmp_path: Path) -> Iterator[AgentNode]:
    with running_agent(control_plane, tmp_path) as node:
        yield node


def _delete_pool_data(ds: Datastore, pool_name: str, node_name: str) -> None:
    """Leave the shared apiserver as we found it for the next test."""
    for kind in (kinds.IPAMBLOCK, kinds.BLOCKAFFINITY, kinds.IPAMHANDLE):
        for item in ds.list_raw(kind)[0]:
            ds.delete_raw(kind, item["metadata"]["name"])
    ds.delete_raw(kinds.IPPOOL, pool_name)
    ds.delete_raw(kinds.NODE, node_name)
