"""The truth table's world as plain API dicts: namespaces x, y, z; pods a, b, c.

This is the *model* side: the dicts the independent oracle
(``tests/unit/policy/oracle.py``, which shares no code with ``policy/``) reads to
say what must happen, kept in step with what the harness writes to the
apiserver. Pure: no kernel, no apiserver.

Each pod serves TCP, UDP and SCTP on ports 80 and 81 and names them
``serve-<port>-<proto>`` as the upstream e2e pods do. Every pod also names one
port ``alt``, which differs per pod (81/TCP on pods named ``b``, 80/TCP on the
others), so that a named port only means something once resolved on the
destination pod. Each pod has an emulated Service: a ClusterIP whose ports are
the pod's ports plus :data:`SERVICE_PORT_OFFSET` (a probe to ``<clusterIP>:1080``
reaches the pod on 80), so policy must decide on the translated address *and*
port.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.unit.policy.oracle import Endpoint, Oracle

NAMESPACES = ("x", "y", "z")
POD_NAMES = ("a", "b", "c")
PORTS = (80, 81)
PROTOCOLS = ("TCP", "UDP", "SCTP")
SERVICE_PORT_OFFSET = 1000
SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/16")
CLUSTER_IP_BASE = 200  # ClusterIPs from 10.96.0.200: clear of kube-dns (.10) on real nodes
NAME_LABEL = "kubernetes.io/metadata.name"

Obj = dict[str, Any]


def container_ports(pod: str) -> list[Obj]:
    """serve-<port>-<proto> for every port and protocol, plus the per-pod ``alt``."""
    ports = [
        {"name": f"serve-{port}-{proto.lower()}", "containerPort": port, "protocol": proto}
        for port in PORTS
        for proto in PROTOCOLS
    ]
    ports.append({"name": "alt", "containerPort": 81 if pod == "b" else 80, "protocol": "TCP"})
    return ports


@dataclass(frozen=True)
class Cell:
    """One probe: from a pod to a pod, directly or through its Service."""

    src: str  # ns/name
    dst: str  # ns/name
    protocol: str  # TCP | UDP | SCTP
    port: int  # the pod's (target) port
    via: str  # "pod" | "svc"

    @property
    def key(self) -> str:
        return f"{self.src}>{self.dst}:{self.protocol.lower()}/{self.port}/{self.via}"


@dataclass
class World:
    """Namespaces, pods (with addresses once wired), policies and Services."""

    placement: dict[str, str]  # ns/name -> node
    namespaces: dict[str, Obj] = field(default_factory=dict)
    pods: dict[str, Obj] = field(default_factory=dict)
    policies: dict[str, Obj] = field(default_factory=dict)
    cluster_policies: dict[str, Obj] = field(default_factory=dict)
    cluster_ips: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, nodes: list[str]) -> World:
        """Pods spread round-robin over the nodes, so same- and cross-node pairs exist."""
        keys = [f"{ns}/{name}" for ns in NAMESPACES for name in POD_NAMES]
        world = cls({key: nodes[i % len(nodes)] for i, key in enumerate(keys)})
        for ns in NAMESPACES:
            world.namespaces[ns] = {"metadata": {"name": ns, "labels": {NAME_LABEL: ns}}}
        for i, key in enumerate(keys):
            ns, name = key.split("/")
            world.pods[key] = {
                "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
                "spec": {"containers": [{"name": "main", "ports": container_ports(name)}]},
                "status": {},
            }
            world.cluster_ips[key] = str(SERVICE_CIDR.network_address + CLUSTER_IP_BASE + i)
        return world

    # -- facts -------------------------------------------------------------------------
    def ip(self, key: str) -> str:
        """The pod's address (set once it is wired)."""
        return str(self.pods[key]["status"]["podIP"])

    def set_ip(self, key: str, ip: str) -> None:
        self.pods[key]["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}

    def same_node(self, a: str, b: str) -> bool:
        return self.placement[a] == self.placement[b]

    def target(self, cell: Cell) -> tuple[str, int]:
        """Where the probe is sent: the pod itself, or its Service address and port."""
        if cell.via == "pod":
            return self.ip(cell.dst), cell.port
        return self.cluster_ips[cell.dst], cell.port + SERVICE_PORT_OFFSET

    # -- changes (mirrored to the apiserver by the harness) ----------------------------
    def apply_policy(self, policy: Obj) -> None:
        meta = policy["metadata"]
        self.policies[f"{meta['namespace']}/{meta['name']}"] = policy

    def delete_policy(self, namespace: str, name: str) -> None:
        self.policies.pop(f"{namespace}/{name}", None)

    def apply_cluster_policy(self, policy: Obj) -> None:
        self.cluster_policies[policy["metadata"]["name"]] = policy

    def delete_cluster_policy(self, name: str) -> None:
        self.cluster_policies.pop(name, None)

    def label_pod(self, key: str, labels: dict[str, str | None]) -> None:
        current = self.pods[key]["metadata"]["labels"]
        for k, v in labels.items():
            if v is None:
                current.pop(k, None)
            else:
                current[k] = v

    def label_namespace(self, name: str, labels: dict[str, str | None]) -> None:
        current = self.namespaces[name]["metadata"]["labels"]
        for k, v in labels.items():
            if v is None:
                current.pop(k, None)
            else:
                current[k] = v

    def snapshot_labels(self) -> tuple[dict[str, Obj], dict[str, Obj]]:
        """Pod and namespace labels, to restore between cases."""
        pods = {k: copy.deepcopy(p["metadata"]["labels"]) for k, p in self.pods.items()}
        nss = {k: copy.deepcopy(n["metadata"]["labels"]) for k, n in self.namespaces.items()}
        return pods, nss

    # -- expectations ------------------------------------------------------------------
    def cells(self) -> Iterator[Cell]:
        """Every ordered pair of distinct pods, every port and protocol, both ways in."""
        for src in self.pods:
            for dst in self.pods:
                if src == dst:
                    continue  # self-traffic is left out, as upstream does
                for proto in PROTOCOLS:
                    for port in PORTS:
                        for via in ("pod", "svc"):
                            yield Cell(src, dst, proto, port, via)

    def oracle(self) -> Oracle:
        return Oracle(
            list(self.policies.values()),
            list(self.namespaces.values()),
            list(self.cluster_policies.values()),
        )

    def expected(self) -> dict[Cell, bool]:
        """The oracle's verdict for every cell: decided on the pod behind the Service."""
        oracle = self.oracle()
        out = {}
        for cell in self.cells():
            src, dst = self.pods[cell.src], self.pods[cell.dst]
            out[cell] = oracle.allowed(
                Endpoint(self.ip(cell.src), src),
                Endpoint(self.ip(cell.dst), dst),
                cell.protocol,
                cell.port,
            )
        return out
