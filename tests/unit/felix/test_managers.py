"""The dataplane managers' one shape (felix.managers): what apply and resync each do,
with the kernel, BGP and the calculation faked (the lab tests drive the real ones)."""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import IPv4Address
from typing import Any

import pytest

from bgp.annotations import VXLAN_TUNNEL_ADDR, VXLAN_TUNNEL_MAC
from bgp.controller import ControllerStatus
from felix.managers import (
    BGPManager,
    EndpointWiring,
    NatOutgoingManager,
    PolicyManager,
    PolicySources,
    TunnelManager,
    drive,
)
from felix.managers import tunnels as tunnel_module
from felix.managers.tunnels import TunnelNode
from felix.nat_outgoing import PoolNat
from felix.tunnels import VxlanSpec, vxlan_mac
from policy import Chain, DesiredState
from policy.membership import AddressBook


class FakeController:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.speaker = None
        self.fail = False

    def update(self, inputs: Any) -> ControllerStatus:
        self.calls.append("update")
        if self.fail:
            raise RuntimeError("speaker refused its configuration")
        return ControllerStatus(newly_invalid=1)

    def resync(self) -> ControllerStatus:
        self.calls.append("resync")
        return ControllerStatus()


def _bgp() -> tuple[BGPManager, FakeController, list[int]]:
    controller = FakeController()
    invalid: list[int] = []
    manager = BGPManager(controller, lambda kind: [], invalid.append, lambda peers: None)  # type: ignore[arg-type]
    return manager, controller, invalid


def test_bgp_works_only_when_something_it_reads_changed() -> None:
    manager, controller, invalid = _bgp()
    drive(manager, resync=False)  # the first pass programs what the caches hold
    assert controller.calls == ["update"] and invalid == [1]
    manager.on_update(
        {"pods", "policies", "clusterpolicies", "endpoint-added", "endpoint-removed:cali1"}
    )
    drive(manager, resync=False)
    assert controller.calls == ["update"]  # nothing BGP reads changed
    manager.on_update({"pods", "blocks"})
    drive(manager, resync=False)
    assert controller.calls == ["update", "update"]
    drive(manager, resync=True)  # the timer: update, then re-read the kernel
    assert controller.calls[2:] == ["update", "resync"]


def test_a_failed_bgp_apply_is_done_again_by_the_retry() -> None:
    manager, controller, _ = _bgp()
    controller.fail = True
    with pytest.raises(RuntimeError):
        manager.apply()
    controller.fail = False
    manager.on_update({"retry-bgp"})
    manager.apply()
    assert controller.calls == ["update", "update"]
    manager.apply()
    assert controller.calls == ["update", "update"]


def test_endpoint_wiring_repairs_on_resync_only() -> None:
    repairs: list[int] = []
    manager = EndpointWiring(lambda: repairs.append(1) or ["cali1"])
    manager.on_update({"pods"})
    drive(manager, resync=False)
    assert repairs == []  # ADD and DEL write pods themselves
    drive(manager, resync=True)
    assert repairs == [1] and manager.repaired == ["cali1"]


class FakeCalculation:
    """Answers with a new state per pass: one more chain each time."""

    def __init__(self) -> None:
        self.afresh: list[bool] = []
        self.chains: dict[str, Chain] = {}  # kept, as the calculation keeps what it did not touch

    def compute(self, caches: Any, endpoints: Any, book: Any, fetch: Any, *, afresh: bool) -> Any:
        self.afresh.append(afresh)
        name = f"cali-tw-c{len(self.afresh) - 1}"
        self.chains = {**self.chains, name: Chain(name)}
        return DesiredState(self.chains), {"cali1": "pod"}


class FakePolicyDataplane:
    def __init__(self) -> None:
        self.writes: list[tuple[str, Any, bool]] = []
        self.hosts: list[Any] = []  # what each write was told of the nodes' addresses

    def apply_state(
        self, desired: Any, local: Any, *, pools: Any, hosts: Any, resync: bool = False
    ) -> None:
        self.writes.append(("whole", sorted(desired.chains), resync))
        self.hosts.append(hosts)

    def apply_changes(self, messages: Any, local: Any, *, pools: Any, hosts: Any) -> None:
        self.writes.append(("messages", [m.chain.name for m in messages], False))
        self.hosts.append(hosts)


def test_policy_writes_messages_between_passes_and_the_whole_state_on_resync() -> None:
    calculation, dataplane = FakeCalculation(), FakePolicyDataplane()
    sources = PolicySources(
        caches={},
        local_endpoints=dict,
        address_book=AddressBook,
        fetch_pod=lambda namespace, name: None,
        pools=lambda: ["pool"],
        hosts=lambda: ["10.0.0.1"],
    )
    manager = PolicyManager(calculation, dataplane, sources)  # type: ignore[arg-type]
    drive(manager, resync=False)  # nothing written yet: the whole state
    drive(manager, resync=False)  # then only what changed
    drive(manager, resync=True)  # the timer: afresh, the kernel re-read
    drive(manager, resync=False)
    assert calculation.afresh == [False, False, True, False]
    assert dataplane.writes == [
        ("whole", ["cali-tw-c0"], False),
        ("messages", ["cali-tw-c1"], False),
        ("whole", ["cali-tw-c0", "cali-tw-c1", "cali-tw-c2"], True),
        ("messages", ["cali-tw-c3"], False),
    ]
    assert dataplane.hosts == [["10.0.0.1"]] * 4  # every write knows the nodes' addresses


VXLAN_POOL = {"metadata": {"name": "p"}, "spec": {"cidr": "10.244.0.0/16", "vxlanMode": "Always"}}


def _tunnels(
    monkeypatch: pytest.MonkeyPatch, pools: list[dict[str, Any]], held: bool
) -> tuple[TunnelManager, list[VxlanSpec], list[Mapping[str, str]], list[str]]:
    made: list[VxlanSpec] = []
    annotated: list[Mapping[str, str]] = []
    asked: list[str] = []
    monkeypatch.setattr(tunnel_module, "ensure_vxlan", lambda netlink, spec: made.append(spec))
    monkeypatch.setattr(tunnel_module, "holds_address", lambda blocks, address, handle: held)

    def tunnel_address(kind: str) -> IPv4Address:
        asked.append(kind)
        return IPv4Address(f"10.244.0.{len(asked)}")

    objects = {"pools": pools, "blocks": []}
    manager = TunnelManager(
        TunnelNode("node1", "172.31.0.11/24", 1500),
        lambda kind: objects[kind],
        tunnel_address,
        annotated.append,
        lambda: None,
    )
    return manager, made, annotated, asked


def test_tunnels_are_made_for_encapsulating_pools_and_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager, made, annotated, asked = _tunnels(monkeypatch, [VXLAN_POOL], held=True)
    drive(manager, resync=False)
    drive(manager, resync=True)  # the device is checked against the kernel every pass
    assert asked == ["vxlan"]  # the address IPAM still grants is kept
    assert [(s.address, s.local_ip, s.mtu) for s in made] == [
        (IPv4Address("10.244.0.1"), "172.31.0.11", 1450)
    ] * 2
    assert annotated[-1] == {VXLAN_TUNNEL_ADDR: "10.244.0.1", VXLAN_TUNNEL_MAC: vxlan_mac("node1")}


def test_a_tunnel_address_ipam_took_back_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager, made, _, asked = _tunnels(monkeypatch, [VXLAN_POOL], held=False)
    manager.apply()
    manager.apply()
    assert asked == ["vxlan", "vxlan"] and made[-1].address == IPv4Address("10.244.0.2")


def test_no_tunnel_without_an_encapsulating_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = {"metadata": {"name": "p"}, "spec": {"cidr": "10.244.0.0/16"}}
    manager, made, annotated, asked = _tunnels(monkeypatch, [plain], held=True)
    manager.apply()
    assert made == [] and annotated == [] and asked == []


class FakeNat:
    def __init__(self) -> None:
        self.calls: list[tuple[list[PoolNat], bool]] = []

    def apply(self, pools: list[PoolNat], *, resync: bool = False) -> None:
        self.calls.append((list(pools), resync))


def test_nat_outgoing_alone_writes_when_the_pools_change_and_repairs_on_resync() -> None:
    pools = [PoolNat("10.244.0.0/16", True)]
    nat = FakeNat()
    manager = NatOutgoingManager(nat, lambda: list(pools))  # type: ignore[arg-type]
    drive(manager, resync=False)
    drive(manager, resync=False)  # the same pools: nothing to write
    assert nat.calls == [([PoolNat("10.244.0.0/16", True)], False)]
    pools.append(PoolNat("10.96.0.0/12", False))
    manager.on_update({"pools"})
    drive(manager, resync=False)
    drive(manager, resync=True)  # the timer's resync writes whatever the kernel holds
    assert [resync for _, resync in nat.calls] == [False, False, True]
    assert nat.calls[-1][0] == sorted(pools, key=lambda p: p.cidr)
