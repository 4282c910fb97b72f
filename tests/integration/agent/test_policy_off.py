"""$TABBY_POLICY=off: another engine enforces NetworkPolicy, Tabby still does the rest.

What `make conformance POLICY=kube-network-policies` runs on. natOutgoing was written
only by the policy dataplane, so with policy off a pod's traffic left the cluster
with its own address; where nothing routes back to pods (the lab's control plane,
the internet) nothing answered, and CoreDNS, which must reach the apiserver, never
became ready. The pod here sends to the node network's router, which has no route to
pods: what arrives must come from the node's address.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from datastore import kinds
from lab import netns
from lab.controlplane import ControlPlane
from tests.helpers import udp_source_seen
from tests.integration.agent.conftest import create_pod, running_agent

pytestmark = pytest.mark.integration

PORT = 9998


def test_with_policy_off_a_natoutgoing_pod_leaves_with_the_node_address(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    with running_agent(control_plane, tmp_path, "--no-policy", nat_outgoing=True) as node:
        create_pod(node.datastore, "default", "out", node.node.name)
        pod_ns = node.lab.ns("out")
        netns.add(pod_ns)
        code, result = node.cni("ADD", "cidout", pod_ns, pod=("default", "out"))
        assert code == 0, result
        pod_ip = str(ipaddress.ip_interface(result["ips"][0]["address"]).ip)
        router_ip = node.lab.gateway(0)
        try:
            seen = udp_source_seen(pod_ns, (pod_ip, 40021), node.lab.router, (router_ip, PORT))
            assert seen == node.node.ip, (seen, pod_ip)
            for save in ("iptables-nft-save", "iptables-legacy-save"):  # either backend
                table = netns.ns_exec(node.node.netns, [save, "-t", "filter"])
                assert "cali-FORWARD" not in table, save  # the other engine's, not ours
        finally:
            node.cni("DEL", "cidout", pod_ns, pod=("default", "out"))
            node.datastore.delete_raw(kinds.POD, "out", "default")
