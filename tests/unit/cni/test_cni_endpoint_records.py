"""Pure logic behind issue 21 items 3, 6, 10: endpoint records, owner recovery, one
interface per container, bounded Event text (the kernel parts are faked here; the
integration tier, tests/integration/agent/test_endpoint_state.py, uses the real ones)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from cni import shim
from felix import cni_server, wiring
from felix.cni_server import AddJournal, CNIHandlers, Endpoint, parse_request, recovery
from felix.events import event_body, sanitize
from felix.pool_allocator import PoolAllocator

NET = "k8s-pod-network"


@pytest.fixture(autouse=True)
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every kernel call faked: nothing here touches a namespace."""
    unwired: list[str] = []

    def wire(spec: wiring.PodWiring, node_netns: str | None = None) -> wiring.Wired:
        return wiring.Wired(spec.host_ifname, "ee:ee:ee:ee:ee:ee", spec.pod_ifname, "0a:0:0:0:0:1")

    def unwire(
        ifname: str, netns: str | None, host: str | None = None, node: object = None
    ) -> None:
        unwired.append(host or ifname)

    monkeypatch.setattr(wiring, "wire", wire)
    monkeypatch.setattr(wiring, "unwire", unwire)
    monkeypatch.setattr(wiring, "check", lambda spec, node_netns=None: [])
    monkeypatch.setattr(wiring, "drifted", lambda specs, node_netns=None: {})
    monkeypatch.setattr(recovery, "_pod_routes", lambda netns: ({}, {}))
    return unwired


def req(command: str = "ADD", cid: str = "c1", ifname: str = "eth0") -> cni_server.CNIRequest:
    env = {
        "CNI_CONTAINERID": cid,
        "CNI_IFNAME": ifname,
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_UID=u1",
        "CNI_PATH": "/opt/cni/bin",
    }
    conf = {"cniVersion": "1.0.0", "name": NET, "type": "tabby"}
    return parse_request({"command": command, "env": env, "config": conf})


def handlers_with(journal: AddJournal, allocator: PoolAllocator) -> CNIHandlers:
    h = CNIHandlers(allocator, journal=journal)
    h.set_synced()
    return h


def test_a_second_interface_is_refused_and_a_repeated_add_still_works(tmp_path: Path) -> None:
    h = handlers_with(AddJournal(tmp_path), PoolAllocator("10.65.0.0/24"))
    first = h.handle(req())
    with pytest.raises(shim.CNIError) as err:
        h.handle(req(ifname="eth1"))
    assert err.value.code == shim.ERR_INVALID_ENV and "eth0" in err.value.msg
    assert h.handle(req()) == first
    assert h.endpoints.get("c1", "eth1") is None


def test_recovery_re_adopts_recorded_endpoints_so_check_works_after_a_restart(
    tmp_path: Path,
) -> None:
    allocator = PoolAllocator("10.65.0.0/24")
    h = handlers_with(AddJournal(tmp_path), allocator)
    h.handle(req())
    restarted = handlers_with(AddJournal(tmp_path), allocator)  # same journal dir, empty table
    report = cni_server.recover_after_restart(restarted, owner_alive=lambda ep: True)
    assert report.adopted == [f"{NET}.c1"] and report.released == []
    assert restarted.handle(req("CHECK")) is None
    assert f"{NET}.c1" in allocator.handles()


def test_recovery_frees_an_endpoint_whose_pod_is_gone(
    tmp_path: Path, fake_kernel: list[str]
) -> None:
    allocator = PoolAllocator("10.65.0.0/24")
    h = handlers_with(AddJournal(tmp_path), allocator)
    h.handle(req())
    restarted = handlers_with(AddJournal(tmp_path), allocator)
    report = cni_server.recover_after_restart(restarted, owner_alive=lambda ep: False)
    assert report.released == [f"{NET}.c1"] and report.adopted == []
    assert f"{NET}.c1" not in allocator.handles()
    assert AddJournal(tmp_path).endpoints() == []


def test_a_lost_journal_re_adopts_routed_pods_into_the_one_endpoint_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_kernel: list[str]
) -> None:
    """The agent restarts without its run dir: a pod whose address is routed through a
    cali veth is kept, named from its IPAM attributes, and listed like any endpoint
    (policy, DEL and GC find it); an address nothing routes is released."""
    allocator = PoolAllocator("10.65.0.0/24")
    h = handlers_with(AddJournal(tmp_path / "old"), allocator)
    h.handle(req())
    h.handle(req(cid="c2"))
    wired = h.endpoints.get("c1", "eth0")
    assert wired is not None
    routes = {str(wired.address): wired.host_ifname}
    monkeypatch.setattr(recovery, "_pod_routes", lambda netns: (routes, {wired.host_ifname: 1410}))
    repaired_host_side: list[str] = []
    monkeypatch.setattr(
        wiring,
        "wire_host_side",
        lambda spec, node_netns=None: repaired_host_side.append(spec.host_ifname),
    )
    monkeypatch.setattr(
        wiring, "drifted", lambda specs, node_netns=None: {s.host_ifname: ["route"] for s in specs}
    )

    restarted = handlers_with(AddJournal(tmp_path / "lost"), allocator)
    report = cni_server.recover_after_restart(restarted)

    assert report.adopted_unrecorded == [f"{NET}.c1"]
    assert report.released == [f"{NET}.c2"] and f"{NET}.c2" not in allocator.handles()
    (ep,) = restarted.endpoints.all()
    assert (ep.network, ep.container_id, ep.ifname) == (NET, "c1", "eth0")
    assert (ep.namespace, ep.pod, ep.host_ifname) == ("default", "web", wired.host_ifname)
    assert (ep.address, ep.mtu, ep.netns) == (wired.address, 1410, "")
    # resync repairs only the node's side: the sandbox's namespace is not known
    assert repaired_host_side == [wired.host_ifname]
    restarted.handle(req("DEL"))
    assert restarted.teardowns.drain()
    assert restarted.endpoints.all() == []
    assert wired.host_ifname in fake_kernel and f"{NET}.c1" not in allocator.handles()


def test_endpoint_records_round_trip_and_drop(tmp_path: Path) -> None:
    journal = AddJournal(tmp_path)
    ep = Endpoint(
        NET, "c1", "eth0", "/run/netns/x", "cali1", ipaddress.IPv4Address("10.0.0.1"), 1500
    )
    journal.record(ep)
    assert journal.endpoints() == [ep]
    journal.drop(NET, "c1", "eth0")
    assert journal.endpoints() == []


def test_sanitize_shortens_long_tokens_control_characters_and_length() -> None:
    text = sanitize("could not assign k8s-pod-network." + "f" * 4096 + "\n\x1b[31m")
    assert "f" * 33 not in text and "k8s-pod-network.ffff" in text and "(4114 chars)" in text
    assert "\n" not in text and "\x1b" not in text
    assert len(sanitize("word " * 1000)) < 600


def test_an_event_message_is_bounded() -> None:
    body = event_body("default", "web", "FailedCreatePodNetwork", "x" * 4096, "node1")
    assert len(str(body["message"])) < 100
