"""Tabby driven by a real containerd over CRI, as kubelet would drive it.

One lab node runs the real ``tabby-node`` agent (against the session's apiserver) and
a real containerd whose CNI dirs hold the installed ``tabby`` plugin and its conflist,
chained with the reference ``portmap`` and ``bandwidth``. ``RunPodSandbox`` through
crictl must give the sandbox a Tabby-wired eth0; ``StopPodSandbox`` must release it.
The point over the plugin-level tests: containerd, not the test, creates the netns and
calls the plugin, so what is checked is the contract a real runtime relies on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cni.install import conflist, install_config, install_shim
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError
from datastore.models import IPAMHandle, IPPool, IPPoolSpec, Meta
from felix.wiring import host_ifname_for
from lab import netns
from lab.controlplane import ControlPlane, k8s_bin_dir
from lab.runtime import Containerd
from lab.topology import Lab, Node
from tests.helpers import wait_for
from tests.integration.agent.conftest import (
    TABBY_NODE,
    _delete_pool_data,
    agent_args,
    ensure_node,
    start_agent,
)
from tests.integration.runtime.conftest import REFERENCE_PLUGINS

pytestmark = pytest.mark.integration

POOL = "10.100.0.0/16"
NETWORK = "k8s-pod-network"


@dataclass
class TabbyRuntimeNode:
    """A lab node with tabby-node and containerd, sharing the node's CNI dirs."""

    lab: Lab
    node: Node
    node_name: str
    runtime: Containerd
    datastore: Datastore
    run_dir: Path


@pytest.fixture
def tabby_runtime_node(
    control_plane: ControlPlane, pause_archive: Path, tmp_path: Path
) -> Iterator[TabbyRuntimeNode]:
    """agent_node's agent plus node_with_containerd's runtime, in one lab node.

    containerd is stopped first (its pod removal runs CNI DEL, which needs the agent),
    then the lab (agent, relay, namespaces), then the apiserver objects.
    """
    ds = control_plane.datastore()
    pool_name = f"pool-{uuid.uuid4().hex[:6]}"
    ds.create(IPPool(metadata=Meta(name=pool_name), spec=IPPoolSpec(cidr=POOL, block_size=26)))
    lab = Lab.create(nodes=1)
    node = lab.node("node1")
    node_name = f"{node.name}-{lab.lab_id}"
    ensure_node(ds, node_name, str(node.address))
    run_dir, bin_dir, conf_dir = tmp_path / "run", tmp_path / "cni-bin", tmp_path / "cni-conf"
    install_shim(bin_dir, sys.executable)
    for plugin in ("loopback", "portmap", "bandwidth"):
        shutil.copy2(REFERENCE_PLUGINS / plugin, bin_dir / plugin)
    install_config(conf_dir, conflist(socket=str(run_dir / "cni.sock")))
    runtime = Containerd(
        lab,
        node,
        tmp_path / "containerd",
        cni_bin_dir=bin_dir,
        cni_conf_dir=conf_dir,
        crictl=k8s_bin_dir() / "crictl",
    )
    try:
        lab.relay_apiserver(node, control_plane.expose_unix_socket(), control_plane.apiserver_port)
        start_agent(
            lab,
            node,
            "tabby-node",
            [
                str(TABBY_NODE),
                *agent_args(node_name, control_plane.kubeconfig, run_dir, "--no-bgp"),
            ],
            run_dir / "cni.sock",
            # The agent opens the sandbox netns by the path containerd gives; containerd
            # bind-mounts it after the agent started, and `ip netns exec`'s own mount
            # namespace does not receive that mount on a host whose / is private (the
            # file is then empty: setns fails with EINVAL). A DaemonSet needs the same:
            # the runtime's netns dir with mountPropagation HostToContainer.
            keep_mounts=True,
        )
        runtime.start(pause_archive)
        yield TabbyRuntimeNode(lab, node, node_name, runtime, ds, run_dir)
    finally:
        runtime.stop()
        lab.teardown()
        _unmount_sandbox_netns(tmp_path / "containerd")
        _delete_pool_data(ds, pool_name, node_name)


def _unmount_sandbox_netns(workdir: Path) -> None:
    """containerd keeps a sandbox's netns mount while its CNI DEL fails (e.g. a broken
    agent); the leftover check only knows lab namespaces, so clear ours here."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4]
        if target.startswith(f"{workdir}/"):
            subprocess.run(["umount", "-l", target], check=False)


def _create_pod(ds: Datastore, namespace: str, name: str, node_name: str) -> None:
    """containerd knows no Pod objects; the agent annotates this one (as kubelet's)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox"}]},
    }
    ds.create_raw(kinds.POD, body)


def _handles(ds: Datastore, sandbox: str) -> list[IPAMHandle]:
    return [
        h
        for h in ds.list(IPAMHandle)
        if h.spec.handle_id == f"{NETWORK}.{sandbox}" and any(h.spec.block.values())
    ]


def test_run_pod_sandbox_through_containerd_is_wired_by_tabby_and_stop_releases_it(
    tabby_runtime_node: TabbyRuntimeNode,
) -> None:
    t = tabby_runtime_node
    ds, runtime, node_ns = t.datastore, t.runtime, t.node.netns
    name = f"web-{t.lab.lab_id}"
    _create_pod(ds, "default", name, t.node_name)
    try:
        sandbox = runtime.run_pod_sandbox(name, "default")
        netns_path = runtime.pod_netns_path(sandbox)
        inspect = runtime.inspect_pod(sandbox)

        # The pod side, seen from inside the sandbox's own netns.
        def in_pod(*args: str) -> str:
            return netns.run(["nsenter", f"--net={netns_path}", "ip", *args])

        eth0 = in_pod("-4", "-o", "addr", "show", "eth0")
        address = ipaddress.ip_interface(eth0.split()[3]).ip
        assert address in ipaddress.ip_network(POOL), eth0
        assert f"{address}/32" in eth0
        assert "default via 169.254.1.1 dev eth0" in in_pod("route", "show")
        assert "inet 127.0.0.1/8" in in_pod("-4", "addr", "show", "lo")  # loopback ran too

        # The node side: Tabby's /32 route through the pod's cali veth.
        host = host_ifname_for("default", name)
        route = netns.ip(node_ns, "route", "show", f"{address}/32")
        assert f"dev {host}" in route and "proto 80" in route, route

        # The plugin ran inside the netns containerd made first: the result containerd
        # recorded names it, and the sandbox's pause process lives in it.
        cni_result = inspect["info"]["cniResult"]["Interfaces"]["eth0"]
        assert cni_result["Sandbox"] == netns_path, json.dumps(inspect["info"]["cniResult"])
        assert [c["IP"] for c in cni_result["IPConfigs"]] == [str(address)]
        pause_pid = inspect["info"]["pid"]
        assert os.stat(f"/proc/{pause_pid}/ns/net").st_ino == os.stat(netns_path).st_ino

        # IPAM and the Pod object in the apiserver.
        assert len(_handles(ds, sandbox)) == 1
        annotations = ds.get_raw(kinds.POD, name, "default")["metadata"]["annotations"]
        assert annotations["tabby.dev/podIP"] == f"{address}/32"
        assert annotations["tabby.dev/containerID"] == sandbox

        # StopPodSandbox runs CNI DEL: address released, veth and route gone (the
        # agent answers DEL first and finishes the teardown right after).
        runtime.crictl("stopp", sandbox)
        wait_for(lambda: _handles(ds, sandbox) == [], what="the address released")
        assert host not in netns.ip(node_ns, "-o", "link", "show")
        assert f"{address}" not in netns.ip(node_ns, "route", "show")
        runtime.crictl("rmp", sandbox)
        assert runtime.pods() == []
    finally:
        with contextlib.suppress(DatastoreError):
            ds.delete_raw(kinds.POD, name, "default")
