"""The pure checks of `tabbyctl diagnose pod`, on plain data shaped like `ip -j` and the API."""

from __future__ import annotations

import json
from ipaddress import IPv4Address
from typing import Any

import pytest
from click.testing import CliRunner

from datastore import kinds
from datastore.models import (
    BlockAffinity,
    BlockAffinitySpec,
    IPAMBlock,
    IPAMHandle,
    IPAMHandleSpec,
    IPPool,
    IPPoolSpec,
    Meta,
)
from felix.wiring import host_ifname_for
from ipam.block import AllocationBlock
from ipam.report import Snapshot
from policy import make_namespace, make_pod, parse_policy
from policy.cluster_policy import parse_cluster_policy
from policy.model import ContainerPort
from tabbyctl.diagnose import (
    FAIL,
    OK,
    SKIP,
    WARN,
    Kernel,
    Where,
    check_bgp,
    check_cni_confs,
    check_host_route,
    check_host_veth,
    check_ipam,
    check_node_netns,
    check_pod,
    check_pod_eth0,
    check_pod_netns,
    check_policy,
    check_remote_route,
    check_stale_ipam,
    diagnose,
    diagnose_pod,
    find_netns_with_ip,
    find_netns_with_link,
    parse_port,
    split_key,
)

IP = "10.244.0.5"
IFNAME = "cali0123456789a"
CID = "c0ffee"
HANDLE = f"k8s-pod-network.{CID}"


def pod_obj(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "x", "name": "a", "annotations": annotations},
        "spec": {"nodeName": "node1"},
        "status": {"phase": "Running", "podIP": IP},
    }


def eth0(*cidrs: str) -> list[dict[str, Any]]:
    addr_info = []
    for cidr in cidrs:
        local, prefix = cidr.split("/")
        addr_info.append({"family": "inet", "local": local, "prefixlen": int(prefix)})
    return [{"ifname": "eth0", "addr_info": addr_info}]


# -- pod and namespaces ---------------------------------------------------------------
def test_pod_missing_unscheduled_unannotated_and_fine() -> None:
    check, facts = check_pod("x/a", None)
    assert check.result == FAIL and facts is None
    unscheduled = pod_obj()
    unscheduled["spec"] = {}
    assert check_pod("x/a", unscheduled)[0].result == FAIL
    check, _ = check_pod("x/a", pod_obj())
    assert check.result == FAIL and "annotation" in check.detail
    check, facts = check_pod(
        "x/a", pod_obj(**{"tabby.dev/podIP": f"{IP}/32", "tabby.dev/containerID": CID})
    )
    assert check.result == OK
    assert facts is not None and (facts.ip, facts.node, facts.container_id) == (IP, "node1", CID)


def test_netns_search_by_eth0_address_and_by_link() -> None:
    spaces = {"n1": eth0("172.31.0.2/24"), "p1": eth0("10.244.0.4/32"), "p2": eth0(f"{IP}/32")}
    assert find_netns_with_ip(IP, spaces) == ["p2"]
    assert find_netns_with_ip("10.9.9.9", spaces) == []
    assert find_netns_with_ip(IP, {**spaces, "p3": eth0(f"{IP}/32")}) == ["p2", "p3"]
    assert find_netns_with_link(IFNAME, {"a": ["lo"], "b": ["lo", IFNAME]}) == ["b"]
    ambiguous = check_pod_netns(None, False, "searched", ["p2", "p3"])
    assert ambiguous.result == FAIL and "p3" in ambiguous.detail
    assert check_node_netns(IFNAME, ["b"]).result == OK
    assert check_node_netns(IFNAME, []).result == OK
    assert check_node_netns(IFNAME, ["b", "c"]).result == FAIL
    assert check_pod_netns(None, False, "searched").result == FAIL
    assert check_pod_netns("p2", False, "opt").result == FAIL
    assert check_pod_netns("p2", True, "opt").result == OK


# -- veth, pod side, host route -------------------------------------------------------
def test_host_veth() -> None:
    up = {"ifname": IFNAME, "flags": ["BROADCAST", "UP", "LOWER_UP"], "operstate": "UP"}
    assert check_host_veth(IFNAME, up, "1", "n1").result == OK
    assert check_host_veth(IFNAME, None, None, "n1").result == FAIL
    down = {**up, "flags": ["BROADCAST"]}
    assert "down" in check_host_veth(IFNAME, down, "1", "n1").detail
    no_carrier = {**up, "flags": ["UP"], "operstate": "LOWERLAYERDOWN"}
    assert check_host_veth(IFNAME, no_carrier, "1", "n1").result == FAIL
    check = check_host_veth(IFNAME, up, "0", "n1")
    assert check.result == FAIL and "proxy_arp" in check.fix


def test_pod_eth0_address_and_default_route() -> None:
    routes = [{"dst": "default", "gateway": "169.254.1.1", "dev": "eth0"}]
    assert [c.result for c in check_pod_eth0(IP, eth0(f"{IP}/32"), routes)] == [OK, OK]
    assert [c.result for c in check_pod_eth0(IP, eth0(f"{IP}/24"), [])] == [FAIL, FAIL]
    assert [c.result for c in check_pod_eth0(IP, None, routes)] == [FAIL]


def test_host_route() -> None:
    good = [{"dst": IP, "dev": IFNAME, "protocol": "80", "scope": "link", "flags": []}]
    assert check_host_route(IP, IFNAME, good, "n1").result == OK
    assert check_host_route(IP, IFNAME, [], "n1").result == FAIL
    elsewhere = [{**good[0], "dev": "eth0"}]
    assert check_host_route(IP, IFNAME, elsewhere, "n1").result == FAIL
    foreign = [{**good[0], "protocol": "boot"}]
    assert check_host_route(IP, IFNAME, foreign, "n1").result == WARN
    blackhole_only = [{"type": "blackhole", "dst": f"{IP}/32", "protocol": "80"}]
    assert check_host_route(IP, IFNAME, blackhole_only, "n1").result == FAIL


def test_remote_route_longest_match_via_the_pods_node() -> None:
    routes = [
        {"dst": "default", "gateway": "172.31.0.1", "dev": "eth0"},
        {"dst": "10.244.0.0/26", "gateway": "172.31.0.2", "dev": "eth0", "protocol": "81"},
        {"type": "blackhole", "dst": "10.244.0.64/26", "protocol": "81"},
    ]
    assert check_remote_route(IP, "node1", "172.31.0.2", "node2", routes).result == OK
    wrong = check_remote_route(IP, "node1", "172.31.0.9", "node2", routes)
    assert wrong.result == FAIL and "not via node1" in wrong.detail
    assert check_remote_route(IP, "node1", "172.31.0.2", "node2", routes[:1]).result == FAIL
    assert check_remote_route(IP, "node1", None, "node2", routes).result == SKIP


# -- IPAM ---------------------------------------------------------------------------
def snapshot(
    *, pool: bool = True, affinity: bool = True, handle: bool = True, owner: str = "node1"
) -> Snapshot:
    block = AllocationBlock.new("10.244.0.0/26", affinity=f"host:{owner}")
    block.assign(IPv4Address(IP), HANDLE, {"namespace": "x", "pod": "a", "node": "node1"})
    block.assign(IPv4Address("10.244.0.9"), "k8s-pod-network.gone", {"namespace": "x", "pod": "z"})
    blocks = [IPAMBlock(metadata=Meta(name="10-244-0-0-26"), spec=block.to_spec())]
    pools = [IPPool(metadata=Meta(name="default"), spec=IPPoolSpec(cidr="10.244.0.0/16"))]
    affinities = [
        BlockAffinity(
            metadata=Meta(name=f"{owner}-10-244-0-0-26"),
            spec=BlockAffinitySpec(cidr="10.244.0.0/26", node=owner, state="confirmed"),
        )
    ]
    handles = [
        IPAMHandle(
            metadata=Meta(name=HANDLE),
            spec=IPAMHandleSpec(handleID=HANDLE, block={"10.244.0.0/26": 1}),
        )
    ]
    return Snapshot(
        pools=pools if pool else [],
        blocks=blocks,
        affinities=affinities if affinity else [],
        handles=handles if handle else [],
        nodes={"node1", "node2"},
        pods={("x", "a")},
    )


def by_name(checks: list[Any]) -> dict[str, str]:
    return {c.name: c.result for c in checks}


def test_ipam_all_good() -> None:
    assert by_name(check_ipam(IP, CID, "node1", snapshot())) == {
        "ipam allocation": OK,
        "ipam affinity": OK,
        "ipam pool": OK,
    }


def test_ipam_faults() -> None:
    assert by_name(check_ipam(IP, CID, "node1", snapshot(pool=False)))["ipam pool"] == FAIL
    assert by_name(check_ipam(IP, CID, "node1", snapshot(affinity=False)))["ipam affinity"] == FAIL
    assert by_name(check_ipam(IP, CID, "node1", snapshot(owner="node2")))["ipam affinity"] == WARN
    assert by_name(check_ipam(IP, CID, "node1", snapshot(handle=False)))["ipam allocation"] == FAIL
    assert by_name(check_ipam(IP, "other", "node1", snapshot()))["ipam allocation"] == FAIL
    free = check_ipam("10.244.0.7", CID, "node1", snapshot())
    assert by_name(free)["ipam allocation"] == FAIL and "free" in free[0].detail
    outside = check_ipam("10.245.0.1", CID, "node1", snapshot())
    assert [c.result for c in outside] == [FAIL]


def test_ipam_check_names_a_corrupt_block_instead_of_failing() -> None:
    snap = snapshot()
    bad = snap.blocks[0].spec.model_copy(update={"unallocated": "9-3"})
    snap.blocks = [snap.blocks[0].model_copy(update={"spec": bad})]
    checks = check_ipam(IP, CID, "node1", snap)
    assert [c.result for c in checks] == [FAIL]
    assert "10.244.0.0/26" in checks[0].detail and "cannot be read" in checks[0].detail


def test_stale_ipam_names_the_handle_of_a_gone_pod() -> None:
    check = check_stale_ipam(snapshot())
    assert check.result == WARN and "k8s-pod-network.gone" in check.detail
    clean = snapshot()
    clean.pods = {("x", "a"), ("x", "z")}
    assert check_stale_ipam(clean).result == OK


# -- BGP, CNI configs ----------------------------------------------------------------
def bgp_doc(*states: str) -> dict[str, Any]:
    peers = [
        {"address": f"172.31.0.{i + 3}", "node": f"node{i + 2}", "state": s, "info": s}
        for i, s in enumerate(states)
    ]
    return {"speakerRunning": True, "peers": peers}


def test_bgp() -> None:
    assert check_bgp("node1", bgp_doc("up", "up"), True).result == OK
    down = check_bgp("node1", bgp_doc("up", "down"), True)
    assert down.result == FAIL and "node3" in down.detail
    assert check_bgp("node1", None, False).result == FAIL
    assert check_bgp("node1", bgp_doc("up"), False).result == FAIL
    assert check_bgp("node1", {**bgp_doc("up"), "speakerRunning": False}, True).result == FAIL
    assert check_bgp("node1", bgp_doc(), True).result == WARN


def test_cni_confs() -> None:
    assert check_cni_confs(["10-tabby.conflist", "README"]).result == OK
    competing = check_cni_confs(["05-cilium.conflist", "10-tabby.conflist", "99-loopback.conf"])
    assert competing.result == WARN and "05-cilium.conflist" in competing.detail
    assert check_cni_confs(["10-flannel.conflist"]).result == FAIL
    assert check_cni_confs(None).result == FAIL


# -- policy -------------------------------------------------------------------------
A = make_pod("x", "a", labels={"pod": "a"}, ips=["10.244.0.5"])
B = make_pod("y", "b", labels={"pod": "b"}, ips=["10.244.1.5"], ports=[ContainerPort("http", 80)])
NAMESPACES = {"x": make_namespace("x", {"team": "x"}), "y": make_namespace("y")}


def policy(ns: str, name: str, spec: dict[str, Any]) -> Any:
    return parse_policy({"metadata": {"namespace": ns, "name": name}, "spec": spec})


def test_policy_not_isolated_allows() -> None:
    assert [c.result for c in check_policy(A, B, NAMESPACES, [], "TCP", 80)] == [OK, OK]


def test_policy_deny_names_the_isolating_policy() -> None:
    deny = policy("y", "deny-b", {"podSelector": {}, "policyTypes": ["Ingress"]})
    egress, ingress = check_policy(A, B, NAMESPACES, [deny], "TCP", 80)
    assert egress.result == OK
    assert ingress.result == FAIL and "y/deny-b" in ingress.detail and "y/deny-b" in ingress.fix


def test_policy_allow_by_namespace_and_named_port_names_the_allowing_policy() -> None:
    deny = policy("y", "a-deny", {"podSelector": {}, "policyTypes": ["Ingress"]})
    allow = policy(
        "y",
        "b-allow",
        {
            "podSelector": {"matchLabels": {"pod": "b"}},
            "ingress": [
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}],
                    "ports": [{"port": "http"}],
                }
            ],
        },
    )
    _, ingress = check_policy(A, B, NAMESPACES, [deny, allow], "TCP", 80)
    assert ingress.result == OK and "y/b-allow" in ingress.detail
    _, other_port = check_policy(A, B, NAMESPACES, [deny, allow], "TCP", 81)
    assert other_port.result == FAIL
    _, udp = check_policy(A, B, NAMESPACES, [deny, allow], "UDP", 80)
    assert udp.result == FAIL


def test_policy_egress_ip_block_and_port_range() -> None:
    egress = policy(
        "x",
        "out",
        {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}}],
                    "ports": [{"port": 8000, "endPort": 9000}],
                },
                {"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}]},
            ],
        },
    )
    # the except removes B's address; the pod selector is the policy's own namespace (x)
    result, _ = check_policy(A, B, NAMESPACES, [egress], "TCP", 8080)
    assert result.result == FAIL and "x/out" in result.detail
    b_in_ip_block = make_pod("y", "b", labels={"pod": "b"}, ips=["10.244.2.5"])
    assert check_policy(A, b_in_ip_block, NAMESPACES, [egress], "TCP", 8080)[0].result == OK
    assert check_policy(A, b_in_ip_block, NAMESPACES, [egress], "TCP", 9001)[0].result == FAIL


# -- parsing, and the whole walk with fakes -------------------------------------------
def test_parse_port_and_key() -> None:
    assert parse_port("80") == (80, "TCP")
    assert parse_port("53/udp") == (53, "UDP")
    for bad in ("http", "0/TCP", "80/ICMP"):
        with pytest.raises(ValueError):
            parse_port(bad)
    assert split_key("x/a") == ("x", "a")
    assert split_key("a") == ("default", "a")


def test_missing_pod_skips_the_rest(ds: Any) -> None:
    checks = diagnose_pod(ds, "x/nope", Where(), Kernel(runner=lambda argv: None))
    assert [c.result for c in checks] == [FAIL, SKIP]


def test_cli_exit_code_and_json(ds: Any) -> None:
    class Obj:
        datastore = ds

    result = CliRunner().invoke(diagnose, ["pod", "x/nope", "-o", "json"], obj=Obj())
    assert result.exit_code == 1
    assert '"result": "FAIL"' in result.output
    bad_port = CliRunner().invoke(diagnose, ["pod", "x/a", "--port", "x"], obj=Obj())
    assert bad_port.exit_code == 2


def test_walk_with_a_fake_kernel(ds: Any, tmp_path: Any) -> None:
    """The gathering glue: which namespace each `ip -j` call reads, and the rows it yields."""
    ds.create_raw(
        kinds.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            **pod_obj(**{"tabby.dev/podIP": f"{IP}/32", "tabby.dev/containerID": CID}),
        },
    )
    ifname = host_ifname_for("x", "a")
    sandbox = tmp_path / "sandbox"
    sandbox.write_text("")
    answers = {
        ("ip", "-n", "n1", "-j", "link", "show", "dev", ifname): [
            {"ifname": ifname, "flags": ["UP", "LOWER_UP"], "operstate": "UP"}
        ],
        ("ip", "-n", "sandbox", "-j", "addr", "show", "dev", "eth0"): eth0(f"{IP}/32"),
        ("ip", "-n", "sandbox", "-j", "route", "show"): [
            {"dst": "default", "gateway": "169.254.1.1", "dev": "eth0"}
        ],
        ("ip", "-n", "n1", "-j", "route", "show"): [
            {"dst": IP, "dev": ifname, "protocol": "80", "scope": "link"}
        ],
        ("ip", "-n", "n2", "-j", "route", "show"): [],
    }

    def runner(argv: Any) -> str | None:
        if argv[:3] == ["ip", "netns", "exec"]:
            return "1\n"
        answer = answers.get(tuple(argv))
        return None if answer is None else json.dumps(answer)

    where = Where(node_netns="n1", pod_netns=str(sandbox), other_nodes={"node2": "n2"})
    checks = {c.name: c.result for c in diagnose_pod(ds, "x/a", where, Kernel(runner))}
    assert checks["pod netns"] == checks["host veth"] == checks["host route"] == OK
    assert checks["pod eth0"] == checks["pod default route"] == OK
    assert checks["ipam allocation"] == FAIL  # the memory datastore has no IPAM objects
    assert checks["route on node2"] == SKIP  # no node address annotation
    assert checks["bgp sessions"] == SKIP


def test_an_admin_deny_points_at_the_cluster_policy_not_a_networkpolicy_rule() -> None:
    allow = policy("y", "open", {"podSelector": {}, "ingress": [{}]})
    admin = parse_cluster_policy({
        "metadata": {"name": "tenants"},
        "spec": {"tier": "Admin", "priority": 3, "subject": {"namespaces": {}},
                 "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]},
    })  # fmt: skip
    egress, ingress = check_policy(A, B, NAMESPACES, [allow], "TCP", 80, [admin])
    assert ingress.result == FAIL and "Admin ClusterNetworkPolicy tenants" in ingress.detail
    assert "clusternetworkpolicy/tenants" in ingress.fix and "networkpolicy -o" not in ingress.fix
    assert egress.result == OK  # the policy has no egress rules
