"""The soak's Services for the real kube-proxy: one per world pod, every protocol and
port of the emulated rules, pointing at exactly that pod."""

from __future__ import annotations

from ipaddress import ip_address
from pathlib import Path

import pytest

from lab.kubeproxy import kube_proxy_config
from tests.truthtable.kubeproxy import ENDPOINTSLICE, SERVICE, service_name, service_objects
from tests.truthtable.world import PORTS, PROTOCOLS, SERVICE_CIDR, SERVICE_PORT_OFFSET, World


def _world() -> World:
    world = World.create(["node1", "node2", "node3"])
    for i, key in enumerate(sorted(world.pods)):
        world.set_ip(key, f"10.244.0.{i + 2}")
    return world


def test_each_world_pod_gets_a_service_and_a_slice_that_name_it() -> None:
    world = _world()
    objects = service_objects(world)
    services = [body for kind, body in objects if kind == SERVICE]
    slices = [body for kind, body in objects if kind == ENDPOINTSLICE]
    assert len(services) == len(slices) == len(world.pods)
    for key in world.pods:
        namespace, name = key.split("/")[0], service_name(key)
        service = next(
            s for s in services if s["metadata"] == {"name": name, "namespace": namespace}
        )
        assert service["spec"]["clusterIP"] == world.cluster_ips[key]
        assert ip_address(world.cluster_ips[key]) in SERVICE_CIDR
        ports = {(p["protocol"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
        assert ports == {(pr, p + SERVICE_PORT_OFFSET, p) for pr in PROTOCOLS for p in PORTS}
        slice_ = next(
            s
            for s in slices
            if s["metadata"]["name"] == name and s["metadata"]["namespace"] == namespace
        )
        assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == name
        assert slice_["endpoints"] == [
            {
                "addresses": [world.ip(key)],
                "conditions": {"ready": True},
                "nodeName": world.placement[key],
            }
        ]
        slice_ports = {(p["name"], p["protocol"], p["port"]) for p in slice_["ports"]}
        service_ports = {
            (p["name"], p["protocol"], p["targetPort"]) for p in service["spec"]["ports"]
        }
        assert slice_ports == service_ports


def test_kube_proxy_refuses_a_mode_it_does_not_have() -> None:
    config = kube_proxy_config(
        node_name="n1", kubeconfig=Path("/k"), mode="nftables", cluster_cidr="10.244.0.0/16"
    )
    assert config["mode"] == "nftables" and config["hostnameOverride"] == "n1"
    assert config["conntrack"] == {
        "maxPerCore": 0,
        "min": 0,
        "tcpEstablishedTimeout": "0s",
        "tcpCloseWaitTimeout": "0s",
    }
    with pytest.raises(ValueError, match="kube-proxy mode 'ipvs' is not one of iptables, nftables"):
        kube_proxy_config(
            node_name="n1", kubeconfig=Path("/k"), mode="ipvs", cluster_cidr="10.244.0.0/16"
        )
