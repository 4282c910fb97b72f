"""The truth table's pure parts: SCTP packets, kube-proxy rules, cases vs the compiler.

The last test runs every step of every bench case through the compiled chains
(the iptables interpreter in ``policy_sim``) and through the oracle, so a
compiler/oracle disagreement shows up here, before any packet is sent.
"""

from __future__ import annotations

import socket
import struct

import pytest

from tests.truthtable.cases import CASES, FEATURES, QUICK, uncovered
from tests.truthtable.harness import service_rules
from tests.truthtable.podagent import (
    SCTP_INIT,
    crc32c,
    init_chunk,
    parse_sctp,
    sctp_packet,
)
from tests.truthtable.runner import perform
from tests.truthtable.world import SERVICE_PORT_OFFSET, Cell, World
from tests.unit.policy.policy_world import World as SimWorld


def _world() -> World:
    world = World.create(["node1", "node2"])
    for i, key in enumerate(world.pods):
        world.set_ip(key, f"10.244.{i % 2}.{i + 1}")
    return world


def test_crc32c_matches_the_rfc_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_sctp_init_carries_its_checksum_little_endian_and_parses_back() -> None:
    packet = sctp_packet(40000, 80, 0, init_chunk(SCTP_INIT, 0xDEADBEEF, 7))
    zeroed = packet[:8] + b"\0\0\0\0" + packet[12:]
    assert struct.unpack("<I", packet[8:12])[0] == crc32c(zeroed)
    ip_header = bytes([0x45]) + bytes(11) + socket.inet_aton("10.244.0.1") + bytes(4)
    assert parse_sctp(ip_header + packet) == ("10.244.0.1", 40000, 80, 0, SCTP_INIT, 0xDEADBEEF)


def test_services_dnat_every_port_and_protocol_to_the_pod() -> None:
    world = _world()
    rules = service_rules(world)
    ip = world.cluster_ips["x/a"]
    for proto in ("tcp", "udp", "sctp"):
        line = (
            f"-A KUBE-SERVICES -d {ip}/32 -p {proto} -m {proto} --dport {80 + SERVICE_PORT_OFFSET}"
        )
        assert line in rules
    assert f"--to-destination {world.ip('x/a')}:81" in rules
    assert "-A PREROUTING -m comment --comment kubernetes-services -j KUBE-SERVICES" in rules


def test_the_world_has_same_and_cross_node_pairs_and_service_cells() -> None:
    world = _world()
    cells = list(world.cells())
    assert len(cells) == 9 * 8 * 3 * 2 * 2
    assert any(world.same_node(c.src, c.dst) for c in cells)
    assert any(not world.same_node(c.src, c.dst) for c in cells)
    assert world.target(Cell("x/a", "y/b", "TCP", 80, "svc")) == (world.cluster_ips["y/b"], 1080)


def test_every_feature_of_the_issue_is_covered_by_some_case() -> None:
    assert not uncovered()
    assert {t for c in CASES for t in c.tags} <= set(FEATURES)
    assert set(QUICK) <= {c.name for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_compiled_chains_agree_with_the_oracle_on_every_step(case: object) -> None:
    world = _world()
    steps = case.build(world)  # type: ignore[attr-defined]
    blocked = 0
    for index, step in enumerate(steps, start=1):
        for action in step.actions:
            perform(world, action)
        sim = SimWorld(
            list(world.policies.values()),
            list(world.pods.values()),
            list(world.namespaces.values()),
            cluster_policies=list(world.cluster_policies.values()),
        )
        expected = world.expected()
        for cell, allowed in expected.items():
            if cell.via == "svc":
                continue  # the same decision: policy sees the translated address
            got = sim.simulated(cell.src, cell.dst, cell.protocol, cell.port)
            assert got == allowed, f"step {index} ({step.what}): {cell.key} compiled {got}"
        blocked += sum(not v for v in expected.values())
    # a case that never closes a cell would prove nothing
    assert blocked or case.name == "baseline"  # type: ignore[attr-defined]
