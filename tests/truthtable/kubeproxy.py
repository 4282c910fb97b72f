"""The world's Services through the real kube-proxy, as a cluster serves them.

The truth table's default writes kube-proxy's ClusterIP DNAT itself (fast, the same
rules every run). The soak instead creates a Service and an EndpointSlice per world
pod in the apiserver and runs the real ``kube-proxy`` (nftables mode, from the
Kubernetes build) in each node namespace that holds world pods: Service IPs are then
translated by what users run, and the policy must hold behind it. The Services have
no selector and their slices are written here (no endpointslice controller runs), so
they name exactly the world's pods.
"""

from __future__ import annotations

import time
from typing import Any

from datastore.kinds import ResourceKind
from lab import netns
from lab.cluster import POD_CIDR, LabCluster
from lab.controlplane import k8s_bin_dir
from lab.kubeproxy import kube_proxy_argv, kube_proxy_config
from lab.topology import Node
from tests.truthtable.world import PORTS, PROTOCOLS, SERVICE_PORT_OFFSET, World

SERVICE = ResourceKind("Service", "services", group="", version="v1", namespaced=True)
ENDPOINTSLICE = ResourceKind(
    "EndpointSlice", "endpointslices", group="discovery.k8s.io", version="v1", namespaced=True
)
MODE = "nftables"  # its own nft table: the same whichever iptables the host selects
MANAGED_BY = "soak.tabby.dev"
PROGRAM_TIMEOUT_S = 60.0
Obj = dict[str, Any]


def service_name(key: str) -> str:
    """The Service of world pod ``ns/name``: ``svc-name`` in the pod's namespace."""
    return f"svc-{key.split('/')[1]}"


def service_objects(world: World) -> list[tuple[ResourceKind, Obj]]:
    """A Service (the world's ClusterIP, every protocol, port+offset -> port) and its
    EndpointSlice (the pod's address) per world pod (pure)."""
    out: list[tuple[ResourceKind, Obj]] = []
    for key, cluster_ip in sorted(world.cluster_ips.items()):
        namespace, name = key.split("/")[0], service_name(key)
        pairs = [(proto, port) for proto in PROTOCOLS for port in PORTS]
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "type": "ClusterIP",
                "clusterIP": cluster_ip,
                "ports": [
                    {
                        "name": f"{proto.lower()}-{port}",
                        "protocol": proto,
                        "port": port + SERVICE_PORT_OFFSET,
                        "targetPort": port,
                    }
                    for proto, port in pairs
                ],
            },
        }
        labels = {
            "kubernetes.io/service-name": name,
            "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
        }
        endpoint = {
            "addresses": [world.ip(key)],
            "conditions": {"ready": True},
            "nodeName": world.placement[key],
        }
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "addressType": "IPv4",
            "endpoints": [endpoint],
            "ports": [
                {"name": f"{proto.lower()}-{port}", "protocol": proto, "port": port}
                for proto, port in pairs
            ],
        }
        out += [(SERVICE, service), (ENDPOINTSLICE, slice_)]
    return out


def start(cluster: LabCluster, world: World, nodes: list[Node]) -> None:
    """Create the world's Services, start kube-proxy on *nodes* (stopped by PID with
    the lab) and wait until each has programmed every ClusterIP."""
    assert cluster.lab is not None
    ds = cluster.datastore()
    for kind, body in service_objects(world):
        ds.create_raw(kind, body)
    for node in nodes:
        config = kube_proxy_config(
            node_name=node.name, kubeconfig=cluster.kubeconfig, mode=MODE, cluster_cidr=POD_CIDR
        )
        path = cluster.workdir / f"kube-proxy-{node.name}.yaml"
        argv = kube_proxy_argv(k8s_bin_dir() / "kube-proxy", path, config)
        cluster.lab.start_process(f"kube-proxy-{node.name}", node, argv)
    for node in nodes:
        wait_programmed(node, sorted(world.cluster_ips.values()))


def wait_programmed(node: Node, cluster_ips: list[str]) -> None:
    """Until kube-proxy's table in the node names every ClusterIP (its first sync)."""
    deadline = time.monotonic() + PROGRAM_TIMEOUT_S
    missing = cluster_ips
    while time.monotonic() < deadline:
        table = netns.ns_exec(node.netns, ["nft", "list", "table", "ip", "kube-proxy"], check=False)
        missing = [ip for ip in cluster_ips if ip not in table]
        if not missing:
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"kube-proxy on {node.name} did not program {len(missing)} ClusterIPs within "
        f"{PROGRAM_TIMEOUT_S:.0f} s: {', '.join(missing[:5])}"
    )
