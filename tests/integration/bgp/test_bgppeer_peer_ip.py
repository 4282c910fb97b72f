"""BGPPeer `peerIP`: the apiserver (the CRD) and the agent's parser agree on every form.

Issue 21 item 10: `ip:port` was parsed by bgp/config.py but refused by the CRD. Now
both take `10.0.0.1` and `10.0.0.1:1179` (IPv4, port 1-65535) and both refuse the
rest, IPv6 included (`fd00::1`, Calico's `[fd00::1]:179`), the CRD with a message
saying which form it wants.
"""

from __future__ import annotations

import uuid

import pytest

from bgp.config import parse_peer_ip
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import Invalid

pytestmark = pytest.mark.integration

ACCEPTED = ["10.0.0.1", "10.0.0.1:1179", "192.168.5.5:179", "10.0.0.1:1", "10.0.0.1:65535"]
REFUSED = [
    "10.0.0.1:0",
    "10.0.0.1:65536",
    "10.0.0.1:99999",
    "10.0.0.1:123456",
    "10.0.0.1:",
    "10.0.0.1:x",
    "10.0.0.1:179:1",
    "10.1.1",
    "010.0.0.1",
    " 10.0.0.1",
    "10.0.0.1 :179",
    "peer.example:179",
    "fd00::1",
    "[fd00::1]:179",
]


def _server_accepts(ds: Datastore, peer_ip: str) -> tuple[bool, str]:
    name = f"peerip-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "crd.tabby.dev/v1",
        "kind": "BGPPeer",
        "metadata": {"name": name},
        "spec": {"peerIP": peer_ip, "asNumber": 65000},
    }
    try:
        ds.create_raw(kinds.BGPPEER, body)
    except Invalid as err:
        return False, str(err)
    ds.delete_raw(kinds.BGPPEER, name)
    return True, ""


def _parser_accepts(peer_ip: str) -> bool:
    try:
        parse_peer_ip(peer_ip)
    except ValueError:
        return False
    return True


def test_the_crd_and_the_parser_take_the_same_peer_ip_forms(datastore: Datastore) -> None:
    verdicts = {raw: _server_accepts(datastore, raw) for raw in ACCEPTED + REFUSED}
    wrong = {
        raw: (accepted, _parser_accepts(raw), message)
        for raw, (accepted, message) in verdicts.items()
        if accepted != (raw in ACCEPTED) or _parser_accepts(raw) != (raw in ACCEPTED)
    }
    assert not wrong, f"peerIP form: (apiserver accepts, parser accepts, message): {wrong}"
    assert parse_peer_ip("10.0.0.1:1179") == parse_peer_ip("10.0.0.1", 1179)


def test_the_crd_says_which_form_it_wants(datastore: Datastore) -> None:
    accepted, message = _server_accepts(datastore, "[fd00::1]:179")
    assert not accepted
    assert "IPv4 address, optionally with a port" in message, message
    accepted, message = _server_accepts(datastore, "10.0.0.1:70000")
    assert not accepted
    assert "port in peerIP must be from 1 to 65535" in message, message
