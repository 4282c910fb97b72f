"""Parsing the ExaBGP 5.0 API stream (samples captured on this machine, research notes 2.4)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from bgp.messages import (
    Ack,
    EndOfRib,
    LearnedRoute,
    PeerOpen,
    RouteUpdate,
    Shutdown,
    StateChange,
    Unparsed,
    parse_line,
)

SAMPLES = Path(__file__).with_name("samples")
A = ipaddress.IPv4Address
N = ipaddress.IPv4Network


def sample(name: str) -> str:
    """The sample as ExaBGP sends it: one line."""
    return json.dumps(json.loads((SAMPLES / name).read_text()))


def test_state_up() -> None:
    event = parse_line(sample("state-up.json"))
    assert event == StateChange(peer=A("192.168.100.3"), state="up", time=1796199525.9747944)


def test_state_connected_and_down_reasons() -> None:
    assert parse_line(sample("state-connected.json")) == StateChange(
        A("192.168.100.3"), "connected", time=1796199525.9381752
    )
    down = parse_line(sample("state-down-notification.json"))
    assert isinstance(down, StateChange)
    assert (down.peer, down.state, down.reason) == (
        A("192.168.100.1"),
        "down",
        "notification received (6,3)",
    )
    other = parse_line(sample("state-down.json"))
    assert isinstance(other, StateChange)
    assert other.reason.startswith("closing outgoing connection")


def test_update_announce_keys_next_hop() -> None:
    event = parse_line(sample("update-announce.json"))
    assert event == RouteUpdate(
        peer=A("192.168.100.1"),
        announced=(
            LearnedRoute(
                prefix=N("10.244.1.0/26"),
                next_hop=A("192.168.100.1"),
                peer=A("192.168.100.1"),
                local_pref=100,
            ),
        ),
        time=1796199526.2947707,
    )


def test_update_withdraw_has_no_next_hop() -> None:
    event = parse_line(sample("update-withdraw.json"))
    assert isinstance(event, RouteUpdate)
    assert event.peer == A("192.168.100.2")
    assert event.announced == ()
    assert event.withdrawn == (N("10.244.2.192/26"),)


def test_eor_and_shutdown() -> None:
    assert parse_line(sample("eor.json")) == EndOfRib(A("192.168.100.3"), "ipv4 unicast")
    assert parse_line(sample("shutdown.json")) == Shutdown()


def test_reflected_ebgp_and_compact_attributes() -> None:
    msg = json.loads(sample("update-announce.json"))
    update = msg["neighbor"]["message"]["update"]
    update["attribute"] = {
        "origin": "igp",
        "as-path": {"0": {"element": "as-sequence", "value": [64514, 64515]}},
        "originator-id": "10.0.0.9",
        "cluster-list": ["244.0.0.1", "244.0.0.2"],
    }
    update["announce"] = {"ipv4 unicast": {"10.0.0.9": ["10.244.9.0/26", "10.244.9.64/26"]}}
    update["withdraw"] = {"ipv4 unicast": ["10.244.8.0/26"]}
    event = parse_line(json.dumps(msg))
    assert isinstance(event, RouteUpdate)
    assert [str(r.prefix) for r in event.announced] == ["10.244.9.0/26", "10.244.9.64/26"]
    first = event.announced[0]
    assert first.as_path == (64514, 64515)
    assert first.originator_id == A("10.0.0.9")
    assert first.cluster_list == ("244.0.0.1", "244.0.0.2")
    assert first.local_pref is None
    assert event.withdrawn == (N("10.244.8.0/26"),)


def test_other_families_are_ignored() -> None:
    msg = json.loads(sample("update-announce.json"))
    msg["neighbor"]["message"]["update"]["announce"] = {
        "ipv6 unicast": {"fd00::1": [{"nlri": "fd00:1::/64"}]}
    }
    event = parse_line(json.dumps(msg))
    assert isinstance(event, RouteUpdate)
    assert event.announced == ()


@pytest.mark.parametrize(
    ("line", "expected"),
    [("done", Ack(True)), ("error", Ack(False)), ("  done\n", Ack(True))],
)
def test_acks(line: str, expected: Ack) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "192.168.100.2 ipv4 unicast 10.244.2.0/26 next-hop 192.168.100.2",
        "[]",
        "{not json",
        '{"type": "update", "neighbor": {}}',
        '{"type": "state", "neighbor": {"address": {"peer": "nope"}, "state": "up"}}',
        '{"type": "negotiated"}',
    ],
)
def test_anything_else_is_unparsed_not_an_exception(line: str) -> None:
    assert isinstance(parse_line(line), Unparsed)


def open_line(direction: str, flags: dict[str, list[str]]) -> str:
    """An OPEN as ExaBGP 5.0 prints it (exabgp/reactor/api/response/json.py `open`)."""
    msg = json.loads(sample("state-up.json"))
    msg["type"] = "open"
    del msg["neighbor"]["state"]
    msg["neighbor"]["direction"] = direction
    msg["neighbor"]["open"] = {
        "version": 4,
        "asn": 64513,
        "hold_time": 30,
        "router_id": "192.168.100.9",
        "capabilities": {
            "2": {"name": "route-refresh", "variant": "RFC"},
            "64": {
                "name": "graceful restart",
                "time": 120,
                "address-family-flags": flags,
                "restart-flags": [],
            },
        },
    }
    return json.dumps(msg)


def test_open_gives_router_id_and_restart_time_for_ipv4() -> None:
    event = parse_line(open_line("receive", {"ipv4/unicast": []}))
    assert event == PeerOpen(
        peer=A("192.168.100.3"),
        router_id=A("192.168.100.9"),
        asn=64513,
        hold_time=30,
        restart_time=120,
    )


def test_open_without_ipv4_in_gr_families_is_not_gr_and_our_own_open_is_ignored() -> None:
    event = parse_line(open_line("receive", {}))  # BIRD's default "aware" mode
    assert isinstance(event, PeerOpen)
    assert event.restart_time is None
    assert isinstance(parse_line(open_line("send", {"ipv4/unicast": []})), Unparsed)
