"""`tabbyctl node status` rendering, from status files written the way the speaker does."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from tabbyctl.node import (
    format_since,
    md5_counters,
    node,
    process_running,
    status_data,
    status_rows,
)

TODAY = dt.datetime(2026, 12, 2, 17, 38, 47).timestamp()
LAST_YEAR = dt.datetime(2025, 11, 25, 9, 0, 0).timestamp()


def doc(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "version": 1,
        "node": "n1",
        "agentPid": os.getpid(),
        "speakerPid": 4242,
        "speakerRunning": True,
        "stopped": False,
        "routerId": "10.0.0.1",
        "asNumber": 64512,
        "peers": [
            {
                "address": "10.0.0.12",
                "type": "node-to-node mesh",
                "state": "start",
                "since": LAST_YEAR,
                "info": "Connect",
            },
            {
                "address": "10.0.0.2",
                "type": "node-to-node mesh",
                "state": "up",
                "since": TODAY,
                "info": "Established",
            },
            {
                "address": "192.168.5.5",
                "type": "node specific",
                "state": "up",
                "since": TODAY,
                "info": "Established",
            },
        ],
    }
    base.update(overrides)
    return base


def run(tmp_path: Path, document: dict[str, Any] | None, *args: str) -> click.testing.Result:
    path = tmp_path / "bgp-status.json"
    if document is not None:
        path.write_text(json.dumps(document))
    group = click.Group(commands={"node": node})
    return CliRunner().invoke(group, ["node", "status", "--status-file", str(path), *args])


def test_table_like_calicoctl(tmp_path: Path) -> None:
    result = run(tmp_path, doc())
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Tabby process is running."
    assert lines[2] == "IPv4 BGP status"
    header = next(line for line in lines if "PEER ADDRESS" in line)
    assert [c.strip() for c in header.strip("│┃|").split("┃")] == [
        "PEER ADDRESS",
        "PEER TYPE",
        "STATE",
        "SINCE",
        "INFO",
    ]
    body = [line for line in lines if "10.0.0." in line or "192.168" in line]
    assert ["10.0.0.2" in body[0], "10.0.0.12" in body[1], "192.168.5.5" in body[2]] == [
        True,
        True,
        True,
    ]
    assert "Established" in body[0]
    assert "2025-11-25" in body[1]
    assert "node specific" in body[2]
    assert lines[-2:] == ["IPv6 BGP status", "No IPv6 peers found."]


def test_json_output(tmp_path: Path) -> None:
    result = run(tmp_path, doc(), "-o", "json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["running"] is True
    assert data["speakerRunning"] is True
    assert [p["address"] for p in data["peers"]] == ["10.0.0.2", "10.0.0.12", "192.168.5.5"]
    assert data["statusFile"].endswith("bgp-status.json")


def test_not_running_without_a_status_file(tmp_path: Path) -> None:
    result = run(tmp_path, None)
    assert result.exit_code == 1
    assert "Tabby process is not running." in result.output
    data = json.loads(run(tmp_path, None, "-o", "json").output)
    assert data == {"running": False, "statusFile": str(tmp_path / "bgp-status.json"), "peers": []}


def test_not_running_when_stopped_or_pid_gone(tmp_path: Path) -> None:
    assert "not running" in run(tmp_path, doc(stopped=True)).output
    assert not process_running(doc(agentPid=2**22 + 12345))
    assert not process_running(doc(agentPid="x"))
    assert process_running(doc())


@pytest.mark.skipif(os.geteuid() != 0, reason="a new PID namespace needs root")
def test_an_agent_in_its_own_pid_namespace_is_found_there() -> None:
    """The DaemonSet's agent writes its pod-namespace PID (often 1); the node's view differs."""
    child = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "30"])
    inner: list[int] = []
    try:
        namespace = None
        deadline = time.monotonic() + 5
        while namespace is None and time.monotonic() < deadline:
            for pid in _children_of(child.pid):
                inode = os.stat(f"/proc/{pid}/ns/pid").st_ino
                if inode != os.stat("/proc/self/ns/pid").st_ino:
                    namespace, inner = inode, [pid]
            time.sleep(0.05)
        assert namespace is not None, "sleep never started in its own PID namespace"
        assert process_running(doc(agentPid=1, pidNamespace=namespace))
        assert not process_running(doc(agentPid=2, pidNamespace=namespace))
    finally:
        for pid in inner:  # the namespace's init; unshare then exits
            os.kill(pid, 9)
        child.kill()
        child.wait()
    assert settles_false(lambda: process_running(doc(agentPid=1, pidNamespace=namespace)))


def settles_false(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not check():
            return True
        time.sleep(0.05)
    return False


def _children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_speaker_down_and_no_peers(tmp_path: Path) -> None:
    result = run(tmp_path, doc(speakerRunning=False))
    assert result.exit_code == 0
    assert "The BGP backend process (ExaBGP) is not running." in result.output
    assert "PEER ADDRESS" not in result.output
    result = run(tmp_path, doc(peers=[]))
    assert "No IPv4 peers found." in result.output


def test_rows_and_since() -> None:
    assert status_rows(doc(), now=TODAY)[0] == [
        "10.0.0.2",
        "node-to-node mesh",
        "up",
        "17:38:47",
        "Established",
    ]
    assert format_since(LAST_YEAR, now=TODAY) == "2025-11-25"
    assert format_since(None) == ""
    assert status_data(doc(), Path("/x"))["node"] == "n1"


@pytest.mark.parametrize("content", ["not json", "[1, 2]"])
def test_unreadable_file_means_not_running(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bgp-status.json"
    path.write_text(content)
    group = click.Group(commands={"node": node})
    result = CliRunner().invoke(group, ["node", "status", "--status-file", str(path)])
    assert result.exit_code == 1
    assert "not running" in result.output


def test_a_session_down_with_a_password_shows_the_kernels_md5_evidence(tmp_path: Path) -> None:
    """Issue 40: a wrong password keeps the session down, and node status says so."""
    down = {"address": "10.0.0.9", "type": "global", "state": "start", "info": "Connect",
            "passwordKey": "tor"}  # fmt: skip
    up = {"address": "10.0.0.2", "type": "node-to-node mesh", "state": "up",
          "info": "Established", "passwordKey": "mesh"}  # fmt: skip
    rows = status_rows({"peers": [down, up]}, md5={"TCPMD5Failure": 3, "TCPMD5NotFound": 1})
    assert rows[0][4] == "Established"  # up: nothing to say
    assert rows[1][4] == (
        "Connect, TCP MD5 password 'tor': 4 segments failed the MD5 check here"
        " (a wrong or missing password on one side)"
    )
    assert status_rows({"peers": [down]}, md5={})[0][4] == (
        "Connect, TCP MD5 password 'tor': no answer signed with it yet"
    )
    netstat = tmp_path / "netstat"
    netstat.write_text(
        "TcpExt: SyncookiesSent TCPMD5NotFound TCPMD5Unexpected TCPMD5Failure\n"
        "TcpExt: 0 2 0 5\n"
        "IpExt: InNoRoutes\nIpExt: 0\n"
    )
    counters = md5_counters(netstat)
    assert counters == {"TCPMD5Failure": 5, "TCPMD5NotFound": 2, "TCPMD5Unexpected": 0}
    assert md5_counters(tmp_path / "absent") == {}
