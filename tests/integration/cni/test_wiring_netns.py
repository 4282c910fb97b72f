"""felix.wiring against the kernel, called in-process with explicit namespaces.

The test process stays in its own namespace: every call names the node
namespace (``node_netns=``) and the pod namespace path.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from felix import wiring
from felix.constants import TABBY_POD_ROUTE_PROTO

pytestmark = pytest.mark.integration


def sh(*argv: str, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {proc.returncode} {proc.stderr}")
    return proc.stdout


@pytest.fixture
def netns() -> Iterator[tuple[str, str]]:
    tag = secrets.token_hex(3)
    node, pod = f"tbt-{tag}-wnode", f"tbt-{tag}-wpod"
    made = []
    try:
        for name in (node, pod):
            sh("ip", "netns", "add", name)
            made.append(name)
        yield node, pod
    finally:
        for name in made:
            sh("ip", "netns", "del", name, check=False)


def spec_for(pod: str, ip: str = "10.70.0.5") -> wiring.PodWiring:
    return wiring.PodWiring(
        host_ifname=wiring.host_ifname_for("default", "nginx"),
        pod_ifname="eth0",
        pod_netns=f"/var/run/netns/{pod}",
        address=ipaddress.IPv4Address(ip),
        mtu=1400,
    )


def test_host_name_matches_calico_vector() -> None:
    assert wiring.host_ifname_for("default", "nginx") == "calic440f455693"


def test_wire_is_idempotent_and_repairs(netns: tuple[str, str]) -> None:
    node, pod = netns
    spec = spec_for(pod)
    first = wiring.wire(spec, node)
    assert wiring.check(spec, node) == []
    assert wiring.wire(spec, node) == first
    sh("ip", "-n", node, "route", "del", "10.70.0.5/32")
    sh("ip", "-n", pod, "addr", "flush", "dev", "eth0")
    sh("ip", "-n", node, "link", "set", spec.host_ifname, "down")
    problems = wiring.check(spec, node)
    assert any("host route" in p for p in problems)
    assert any("lacks address" in p for p in problems)
    assert any("is down" in p for p in problems)
    assert wiring.wire(spec, node) == first
    assert wiring.check(spec, node) == []
    route = json.loads(sh("ip", "-n", node, "-j", "route", "show", "10.70.0.5/32"))[0]
    assert (route["dev"], route["protocol"]) == (spec.host_ifname, str(TABBY_POD_ROUTE_PROTO))


def test_check_names_mac_and_mtu_drift(netns: tuple[str, str]) -> None:
    node, pod = netns
    spec = spec_for(pod)
    wiring.wire(spec, node)
    sh("ip", "-n", node, "link", "set", spec.host_ifname, "address", "02:00:00:00:00:01")
    sh("ip", "-n", pod, "link", "set", "eth0", "mtu", "1300")
    problems = wiring.check(spec, node)
    assert any("MAC is 02:00:00:00:00:01" in p for p in problems)
    assert any("eth0 MTU is 1300" in p for p in problems)


def test_address_change_replaces_the_old_one(netns: tuple[str, str]) -> None:
    node, pod = netns
    wiring.wire(spec_for(pod, "10.70.0.5"), node)
    wiring.wire(spec_for(pod, "10.70.0.6"), node)
    addrs = json.loads(sh("ip", "-n", pod, "-j", "addr", "show", "dev", "eth0"))[0]["addr_info"]
    assert [a["local"] for a in addrs if a["family"] == "inet"] == ["10.70.0.6"]


def test_foreign_eth0_is_refused(netns: tuple[str, str]) -> None:
    node, pod = netns
    sh("ip", "-n", pod, "link", "add", "eth0", "type", "veth", "peer", "name", "other")
    with pytest.raises(wiring.WiringError, match="already exists"):
        wiring.wire(spec_for(pod), node)


def test_stale_host_veth_is_replaced(netns: tuple[str, str]) -> None:
    node, pod = netns
    spec = spec_for(pod)
    sh("ip", "-n", node, "link", "add", spec.host_ifname, "type", "veth", "peer", "name", "stale")
    wiring.wire(spec, node)
    assert wiring.check(spec, node) == []
    assert sh("ip", "-n", node, "link", "show", "stale", check=False) == ""


def test_route_conflict_is_reported(netns: tuple[str, str]) -> None:
    node, pod = netns
    sh("ip", "-n", node, "link", "add", "taken", "type", "veth", "peer", "name", "taken-p")
    sh("ip", "-n", node, "link", "set", "taken", "up")
    sh("ip", "-n", node, "route", "add", "10.70.0.5/32", "dev", "taken")
    with pytest.raises(wiring.WiringError, match="already routed"):
        wiring.wire(spec_for(pod), node)


def test_missing_pod_netns(netns: tuple[str, str]) -> None:
    node, _ = netns
    missing = replace(spec_for("x"), pod_netns="/var/run/netns/tbt-does-not-exist")
    with pytest.raises(wiring.NetnsMissing):
        wiring.wire(missing, node)
    assert any("does not exist" in p for p in wiring.check(missing, node))
    wiring.unwire("eth0", missing.pod_netns, None, node)  # DEL: fine


def test_unwire_removes_everything_and_repeats(netns: tuple[str, str]) -> None:
    node, pod = netns
    spec = spec_for(pod)
    wiring.wire(spec, node)
    wiring.unwire("eth0", spec.pod_netns, spec.host_ifname, node)
    wiring.unwire("eth0", spec.pod_netns, spec.host_ifname, node)
    assert sh("ip", "-n", node, "link", "show", spec.host_ifname, check=False) == ""
    assert sh("ip", "-n", node, "route", "show", "10.70.0.5/32") == ""
    assert "eth0" not in sh("ip", "-n", pod, "link")


def test_unwire_by_host_name_only(netns: tuple[str, str]) -> None:
    node, pod = netns
    spec = spec_for(pod)
    wiring.wire(spec, node)
    wiring.unwire("eth0", None, spec.host_ifname, node)
    assert "eth0" not in sh("ip", "-n", pod, "link")
