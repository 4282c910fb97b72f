"""BGP passwords (TCP MD5, issue 40): who gets which, and how ExaBGP is told (pure)."""

from __future__ import annotations

import base64
from typing import Any

from bgp.config import BGP_SECRET, compute_plan, render_exabgp_config
from datastore.models import BGPConfiguration, BGPPeer
from felix.managers.bgp import secret_values
from tests.unit.bgp.test_bgp_config import HELPER, NODES, node

MESH_REF = {"secretKeyRef": {"name": BGP_SECRET, "key": "mesh"}}
TOR_REF = {"secretKeyRef": {"name": BGP_SECRET, "key": "tor"}}


def _plan(passwords: dict[str, str], mesh: Any = MESH_REF, tor: Any = TOR_REF) -> Any:
    config = BGPConfiguration.model_validate(
        {"metadata": {"name": "default"}, "spec": {"nodeMeshPassword": mesh} if mesh else {}}
    )
    spec = {"peerIP": "10.0.0.9", "asNumber": 65000, **({"password": tor} if tor else {})}
    tor_peer = BGPPeer.model_validate({"metadata": {"name": "tor"}, "spec": spec})
    plan = compute_plan(config, NODES, [tor_peer], "n1", passwords=passwords)
    assert plan is not None
    return plan


def test_mesh_and_bgppeer_sessions_get_their_own_keys() -> None:
    plan = _plan({"mesh": "m3sh", "tor": "t0r"})
    keys = {str(p.address): (p.password, p.password_key) for p in plan.peers}
    assert keys == {
        "10.0.0.2": ("m3sh", "mesh"),
        "10.0.0.3": ("m3sh", "mesh"),
        "10.0.0.9": ("t0r", "tor"),
    }
    assert plan.problems == ()
    assert "m3sh" not in repr(plan.peers)  # never in a log line


def test_no_reference_means_no_password() -> None:
    plan = _plan({"mesh": "m3sh"}, mesh=None, tor=None)
    assert all(p.password is None for p in plan.peers)
    assert "md5" not in render_exabgp_config(plan, HELPER)


def test_a_missing_key_leaves_those_sessions_out_and_says_why() -> None:
    """Never a session without the password the operator asked for."""
    plan = _plan({"mesh": "m3sh"})
    assert [str(p.address) for p in plan.peers] == ["10.0.0.2", "10.0.0.3"]
    [problem] = plan.problems
    assert "bgppeer/tor password" in problem
    assert f"Secret kube-system/{BGP_SECRET} has no key 'tor'" in problem
    assert "sessions with 10.0.0.9 are not configured" in problem
    plan = _plan({"tor": "t0r"})
    assert [str(p.address) for p in plan.peers] == ["10.0.0.9"]
    assert "nodeMeshPassword" in plan.problems[0] and "10.0.0.2, 10.0.0.3" in plan.problems[0]


def test_another_secret_or_an_overlong_password_is_refused() -> None:
    other = {"secretKeyRef": {"name": "mine", "key": "tor"}}
    plan = _plan({"mesh": "m", "tor": "t"}, tor=other)
    assert f"read from Secret kube-system/{BGP_SECRET} only, not 'mine'" in plan.problems[0]
    plan = _plan({"mesh": "m" * 81, "tor": "t"})
    assert "is 81 bytes; a TCP MD5 password is 1 to 80" in plan.problems[0]
    assert _plan({"mesh": "m" * 80, "tor": "t"}).problems == ()


def test_rendered_as_base64_so_any_character_is_safe() -> None:
    tricky = 'p "a;s} s\n'
    plan = _plan({"mesh": tricky, "tor": "t0r"})
    text = render_exabgp_config(plan, HELPER)
    encoded = base64.b64encode(tricky.encode()).decode()
    assert text.count(f"    md5-password {encoded};") == 2
    assert text.count("    md5-base64 true;") == 3
    assert tricky not in text


def test_a_reflector_session_uses_the_mesh_password() -> None:
    reflector = node("n9", "10.0.0.9/24", RR_CLUSTER_ID="244.0.0.1")
    config = BGPConfiguration.model_validate(
        {"metadata": {"name": "default"}, "spec": {"nodeMeshPassword": MESH_REF}}
    )
    plan = compute_plan(config, [*NODES, reflector], [], "n1", passwords={"mesh": "m3sh"})
    assert plan is not None
    assert [(str(p.address), p.password) for p in plan.peers] == [("10.0.0.9", "m3sh")]


def test_the_secret_is_decoded_and_bad_values_left_out() -> None:
    secret = {
        "metadata": {"name": BGP_SECRET},
        "data": {
            "mesh": base64.b64encode(b"m3sh").decode(),
            "binary": base64.b64encode(b"\xff\xfe").decode(),
            "garbled": "not base64!",
        },
    }
    assert secret_values([secret]) == {"mesh": "m3sh"}
    assert secret_values([]) == {}
