"""Which addresses a Pod stands for in policy (issue 21 item 1: no bypass by annotation).

A tenant writes a Pod's labels, annotations and spec; only kubelet writes its
status and only Tabby writes IPAM and its endpoint table. These tests build the
selector ipsets from Pod dicts as the apiserver returns them and check that no
address a tenant can choose ever becomes a member.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from policy import desired_state, parse_policy
from policy.membership import (
    AddressBook,
    LocalAddress,
    Owner,
    book_from,
    local_address,
    trusted_pod,
)

VICTIM = "10.244.1.7"  # the denied client's address
NOWHERE = AddressBook()


def _pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    ip: str | None = None,
    annotated: str | None = None,
    node: str | None = None,
    uid: str = "",
    phase: str | None = None,
    deleting: bool = False,
    host_network: bool = False,
) -> dict[str, Any]:
    """A Pod dict as the apiserver returns it (status only where kubelet wrote one)."""
    meta: dict[str, Any] = {"namespace": "x", "name": name, "labels": labels or {}}
    if uid:
        meta["uid"] = uid
    if annotated:
        meta["annotations"] = {"tabby.dev/podIP": annotated}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "hostNetwork": host_network}
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase or ("Running" if ip else "Pending")}
    if ip:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return {"metadata": meta, "spec": spec, "status": status}


def _ips(obj: dict[str, Any], book: AddressBook = NOWHERE, local: LocalAddress | None = None):
    return [str(ip) for ip in trusted_pod(obj, book, local).ips]


ALLOW_TRUSTED = parse_policy(
    {
        "metadata": {"namespace": "x", "name": "db"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "trusted"}}}]}],
        },
    }
)


def _allowed_sources(*pods: dict[str, Any], book: AddressBook = NOWHERE) -> set[str]:
    """Every address in the selector ipsets of a node hosting the db server."""
    parsed = [trusted_pod(p, book) for p in pods]
    server = trusted_pod(_pod("server", labels={"app": "db"}, ip="10.244.0.5", node="n"), book)
    state = desired_state([ALLOW_TRUSTED], [server, *parsed], [], {"caliserver": server})
    return {m for members in state.members.values() for m in members}


def test_a_rogue_pod_never_scheduled_adds_no_address_whatever_its_annotation_says() -> None:
    trusted = _pod("friend", labels={"role": "trusted"}, ip="10.244.0.9", node="node1")
    rogues = [
        _pod("rogue", labels={"role": "trusted"}, annotated=f"{VICTIM}/32"),
        _pod("rogue2", labels={"role": "trusted"}, annotated="8.8.8.8/32", node="node1"),
    ]
    assert _allowed_sources(trusted, *rogues) == {"10.244.0.9"}


def test_status_addresses_are_members_and_an_annotation_never_overrides_them() -> None:
    pod = _pod("a", ip="10.244.0.5", node="node1", annotated=f"{VICTIM}/32")
    assert _ips(pod) == ["10.244.0.5"]


def test_before_kubelet_reports_the_pod_ipam_vouches_for_its_own_allocation_only() -> None:
    book = book_from(
        {
            "10.244.2.3": Owner("x", "a", node="node2", uid="u-a"),
            VICTIM: Owner("x", "b", node="node2"),
        }
    )
    pending = _pod("a", node="node2", uid="u-a", annotated=f"{VICTIM}/32")
    assert _ips(pending, book) == ["10.244.2.3"]
    # the allocation is of another node, or of an earlier Pod of that name: not this one
    assert _ips(_pod("a", node="node1", uid="u-a"), book) == []
    assert _ips(_pod("a", node="node2", uid="u-other"), book) == []
    # never bound to a node: Tabby never wired it, nothing vouches for any address
    assert _ips(_pod("a", uid="u-a"), book) == []


def test_a_status_address_ipam_gave_to_another_pod_is_dropped() -> None:
    book = book_from({"10.244.0.5": Owner("x", "new", node="node1")})
    stale = _pod("old", ip="10.244.0.5", node="node1", phase="Running")
    assert _ips(stale, book) == []
    assert _ips(_pod("new", ip="10.244.0.5", node="node1"), book) == ["10.244.0.5"]


def test_terminating_pods_keep_only_what_ipam_still_holds_for_them() -> None:
    held = book_from({"10.244.0.5": Owner("x", "a", node="node1")})
    going = _pod("a", ip="10.244.0.5", node="node1", deleting=True)
    assert _ips(going, held) == ["10.244.0.5"]  # still running its grace period
    assert _ips(going, NOWHERE) == []  # its address was released: may be anyone's next


def test_finished_and_host_network_pods_are_never_members() -> None:
    done = _pod("job", labels={"role": "trusted"}, ip="10.244.0.5", node="n", phase="Succeeded")
    host = _pod("ds", labels={"role": "trusted"}, ip="172.31.0.11", node="n", host_network=True)
    assert _ips(done) == [] and _ips(host) == []
    assert _allowed_sources(done, host) == set()


def test_the_local_endpoint_table_is_the_truth_for_pods_wired_on_this_node() -> None:
    wired = local_address("10.244.0.5/32", "u-a")
    assert _ips(_pod("a", node="node1", uid="u-a"), local=wired) == ["10.244.0.5"]
    # an endpoint of an earlier Pod of the same name (another UID) says nothing about this one
    later = _pod("a", node="node1", uid="u-b", ip="10.244.0.6")
    assert _ips(later, local=wired) == ["10.244.0.6"]
    assert local_address("10.244.0.5").address == ipaddress.ip_address("10.244.0.5")
