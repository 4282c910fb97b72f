"""Builders for API dicts and a World that answers "is this connection
allowed?" twice: through the compiled chains (simulator) and through the
independent oracle."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
from typing import Any

from policy import desired_state, parse_namespace, parse_pod, parse_policy
from policy.cluster_compiler import NodeAddresses, make_node
from policy.cluster_policy import parse_cluster_policy
from policy.explain import explain_connection
from tests.unit.policy.oracle import Endpoint, Oracle
from tests.unit.policy.policy_sim import Packet, Simulator


def pod_dict(
    ns: str,
    name: str,
    ip: str,
    labels: dict[str, str] | None = None,
    ports: list[tuple[str, int, str]] | None = None,
    *,
    host_network: bool = False,
) -> dict[str, Any]:
    """A Pod as the apiserver returns it; ports are (name, number, protocol)."""
    container: dict[str, Any] = {"name": "c", "image": "agnhost"}
    if ports:
        container["ports"] = [
            {"name": n, "containerPort": p, "protocol": proto} for n, p, proto in ports
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": dict(labels or {})},
        "spec": {"containers": [container], "hostNetwork": host_network},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }


def node_addresses(node: dict[str, Any]) -> NodeAddresses:
    """A Node dict as ``nodes`` peers see it (its labels and status addresses' IPs)."""
    ips = []
    for entry in (node.get("status") or {}).get("addresses") or []:
        with contextlib.suppress(ValueError):
            ips.append(str(ipaddress.ip_address(entry["address"])))
    return make_node(node["metadata"]["name"], node["metadata"].get("labels"), ips)


def ns_dict(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Namespace with the automatic name label, as the apiserver shows it."""
    all_labels = {"kubernetes.io/metadata.name": name, **(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": all_labels},
    }


def np_dict(ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy dict."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": name},
        "spec": spec,
    }


def iface_of(ns: str, name: str) -> str:
    """Host-side veth name, as the CNI plugin derives it."""
    return "cali" + hashlib.sha1(f"{ns}.{name}".encode()).hexdigest()[:11]


class World:
    """Pods (all local to one node), namespaces and policies."""

    def __init__(
        self,
        policies: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        namespaces: list[dict[str, Any]],
        family: int = 4,
        cluster_policies: list[dict[str, Any]] | None = None,
        nodes: list[dict[str, Any]] | None = None,
    ) -> None:
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        parsed_pods = [parse_pod(p) for p in pods]
        local = {iface_of(p.namespace, p.name): p for p in parsed_pods if not p.host_network}
        self.parsed_cluster = [parse_cluster_policy(c) for c in cluster_policies or []]
        self.parsed_nodes = [node_addresses(n) for n in nodes or []]
        self.state = desired_state(
            [parse_policy(p) for p in policies],
            parsed_pods,
            [parse_namespace(n) for n in namespaces],
            local,
            family,
            cluster_policies=self.parsed_cluster,
            nodes=self.parsed_nodes,
        )
        self.sim = Simulator(self.state.chains, self.state.ipsets, self.state.members)
        self.oracle = Oracle(policies, namespaces, cluster_policies, nodes)
        self.parsed_pods = {p.key: p for p in parsed_pods}
        self.parsed_policies = [parse_policy(p) for p in policies]
        self.parsed_namespaces = {n.name: n for n in map(parse_namespace, namespaces)}

    def _endpoint(self, who: str) -> Endpoint:
        """``ns/name`` of a pod, or a bare IP outside the pods."""
        pod = self.pods.get(who)
        return Endpoint(pod["status"]["podIP"], pod) if pod else Endpoint(who)

    def _iface(self, endpoint: Endpoint) -> str | None:
        """The endpoint's cali interface, if it is a (non-hostNetwork) pod."""
        pod = endpoint.pod
        if pod is None or pod["spec"].get("hostNetwork"):
            return None
        return iface_of(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def simulated(self, src: str, dst: str, proto: str, port: int) -> bool:
        """Verdict of the compiled chains for a NEW connection's first packet."""
        s, d = self._endpoint(src), self._endpoint(dst)
        pkt = Packet(s.ip, d.ip, proto.lower(), port)
        return self.sim.forward(pkt, self._iface(s), self._iface(d))

    def expected(self, src: str, dst: str, proto: str, port: int) -> bool:
        """Verdict of the oracle."""
        return self.oracle.allowed(self._endpoint(src), self._endpoint(dst), proto, port)

    def explained(self, src: str, dst: str, proto: str, port: int) -> bool | None:
        """Verdict of :func:`policy.explain_connection` (what tabbyctl tells a user), for
        a pair of pods that policy applies to; None for an address outside the pods or
        a hostNetwork pod (explain takes pods, and policy does not select host pods)."""
        pods = [self.parsed_pods.get(src), self.parsed_pods.get(dst)]
        if pods[0] is None or pods[1] is None or any(p.host_network for p in pods):
            return None
        verdicts = explain_connection(
            pods[0],
            pods[1],
            self.parsed_namespaces,
            self.parsed_policies,
            proto,
            port,
            self.parsed_cluster,
            self.parsed_nodes,
        )
        return all(v.allowed for v in verdicts)

    def verdict(self, src: str, dst: str, proto: str = "TCP", port: int = 80) -> bool:
        """The verdicts of the chains, the oracle and the explanation, which must agree."""
        sim = self.simulated(src, dst, proto, port)
        exp = self.expected(src, dst, proto, port)
        assert sim == exp, f"{src} -> {dst} {proto}/{port}: simulator {sim}, oracle {exp}"
        told = self.explained(src, dst, proto, port)
        assert told in (None, exp), f"{src} -> {dst} {proto}/{port}: explain {told}, oracle {exp}"
        return sim
