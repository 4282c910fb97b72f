"""The Speaker's bridge logic without ExaBGP: config file, API lines, callbacks, status file.

No process is started here (start() is never called); the real process is covered in
tests/integration/bgp.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path

import pytest

from bgp import annotations as ann
from bgp.config import compute_plan
from bgp.messages import LearnedRoute
from bgp.speaker import HELPER, Speaker, SpeakerOptions, default_status_path, exabgp_env

N = ipaddress.IPv4Network
NODES = [
    {"metadata": {"name": "n1", "annotations": {ann.IPV4_ADDRESS: "10.0.0.1/24"}}},
    {"metadata": {"name": "n2", "annotations": {ann.IPV4_ADDRESS: "10.0.0.2/24"}}},
]


def make(tmp_path: Path) -> tuple[Speaker, list[list[LearnedRoute]]]:
    plan = compute_plan(None, NODES, [], "n1")
    assert plan is not None
    seen: list[list[LearnedRoute]] = []
    options = SpeakerOptions(workdir=tmp_path / "w", status_file=tmp_path / "st" / "s.json")
    return Speaker(plan, options, on_routes=seen.append), seen


def line(kind: str, body: str) -> str:
    head = '{"exabgp": "5.0.0", "time": 5.0, "type": "' + kind + '", "neighbor": {"address": '
    return head + '{"local": "10.0.0.1", "peer": "10.0.0.2"}, ' + body + "}}"


UP = line("state", '"state": "up"')
DOWN = line("state", '"state": "down", "reason": "closing connection"')
ANNOUNCE = line(
    "update",
    '"direction": "receive", "message": {"update": {"attribute": {"origin": "igp"}, '
    '"announce": {"ipv4 unicast": {"10.0.0.2": [{"nlri": "10.244.2.0/26"}]}}}}',
)


def test_config_written_once_with_the_helper_and_socket(tmp_path: Path) -> None:
    speaker, _ = make(tmp_path)
    text = speaker.options.config_file.read_text()
    assert f"run {speaker.options.python} -S {HELPER} {tmp_path / 'w' / 'api.sock'};" in text
    assert "neighbor 10.0.0.2 {" in text
    plan = compute_plan(None, NODES, [], "n1")
    assert plan is not None
    assert speaker._write_config(plan) is False  # unchanged text: no reload needed


def test_api_lines_drive_routes_callback_and_status_file(tmp_path: Path) -> None:
    speaker, seen = make(tmp_path)
    sent: list[bytes] = []
    ours, theirs = socket.socketpair()
    speaker._conn = ours
    try:
        speaker.announce([N("10.244.1.0/26")])
        speaker._handle_line(UP)
        speaker._handle_line(ANNOUNCE)
        speaker._handle_line("done")
        speaker._handle_line("error")
        speaker._handle_line("garbage")
        theirs.settimeout(1)
        sent.append(theirs.recv(65536))
    finally:
        ours.close()
        theirs.close()
    commands = sent[0].decode().splitlines()
    assert commands == [
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop self",
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop self",
        "neighbor 10.0.0.2 announce eor ipv4 unicast",
    ]
    assert [[str(r.prefix) for r in routes] for routes in seen] == [["10.244.2.0/26"]]
    assert speaker.errors == 1
    doc = json.loads((tmp_path / "st" / "s.json").read_text())
    assert doc["node"] == "n1"
    assert doc["announced"] == ["10.244.1.0/26"]
    assert doc["learnedRoutes"] == 1
    assert doc["speakerRunning"] is False
    assert [(p["address"], p["state"], p["info"]) for p in doc["peers"]] == [
        ("10.0.0.2", "up", "Established")
    ]

    speaker._conn = None  # relay gone: commands are dropped, state still follows events
    speaker._handle_line(DOWN)
    assert seen[-1] == []
    doc = json.loads((tmp_path / "st" / "s.json").read_text())
    assert doc["peers"][0]["info"] == "Active: closing connection"


def test_environment_and_default_paths() -> None:
    env = exabgp_env({"PATH": "/bin"}, log_level="DEBUG")
    assert env["exabgp_daemon_user"] == "root"
    assert env["exabgp_api_cli"] == "false"
    assert env["exabgp_log_level"] == "DEBUG"
    assert env["PATH"] == "/bin"
    assert default_status_path() == Path("/run/tabby/bgp-status.json")
    assert default_status_path(Path("/run/x")) == Path("/run/x/bgp-status.json")


def test_a_workdir_too_deep_for_a_unix_socket_is_refused(tmp_path: Path) -> None:
    plan = compute_plan(None, NODES, [], "n1")
    assert plan is not None
    deep = tmp_path / ("d" * 120)
    with pytest.raises(ValueError, match="too long for a unix socket"):
        Speaker(plan, SpeakerOptions(workdir=deep))
    assert not deep.exists()
