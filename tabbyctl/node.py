"""`tabbyctl node status`: the BGP view of one node, like `calicoctl node status`.

The node agent's speaker (bgp.speaker) rewrites a JSON status file on every peer
state change, by default `/run/tabby/<node>/bgp-status.json`:

    {"version": 1, "node": "n1", "agentPid": 123, "speakerPid": 456,
     "speakerRunning": true, "stopped": false, "routerId": "10.0.0.1",
     "asNumber": 64512, "updated": 1796199526.3, "announced": ["10.244.1.0/26"],
     "learnedRoutes": 3,
     "peers": [{"address": "10.0.0.2", "type": "node-to-node mesh", "asNumber": 64512,
                "node": "n2", "state": "up", "since": 1796199525.9,
                "info": "Established", "routesReceived": 1, "rrClient": false}]}

A peer whose session has a TCP MD5 password (``passwordKey``, the key of the BGP
password Secret) and is not up says so in INFO, with the kernel's count of TCP
segments that failed the MD5 check in this network namespace (`/proc/net/netstat`,
TcpExt TCPMD5Failure and TCPMD5NotFound): a wrong or missing password on one side
shows there, since the kernel drops those segments before BGP sees them.

A file is read rather than a socket so that the command works while the agent is
busy or gone (the file then tells what it last saw, and the PID check says it is
not running). Rendering is split from reading so it is tested with plain data.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import click

from bgp.speaker import default_status_path
from tabbyctl.output import emit_data, emit_table, fail, output_option

COLUMNS = ("PEER ADDRESS", "PEER TYPE", "STATE", "SINCE", "INFO")


@click.group("node")
def node() -> None:
    """Inspect the Tabby node agent on this host."""


@node.command("status")
@click.option(
    "--run-dir",
    envvar="TABBY_RUN_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/run/tabby"),
    show_default=True,
    help="The node agent's run directory (tabby-node --run-dir).",
)
@click.option(
    "--status-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Status file written by the agent [default: <run-dir>/bgp-status.json].",
)
@output_option
def status(run_dir: Path, status_file: Path | None, output: str) -> None:
    """Whether the Tabby process runs, and the state of each BGP peer."""
    path = status_file or default_status_path(run_dir)
    doc = load_status(path)
    if output != "table":
        emit_data(status_data(doc, path), output)
        return
    if doc is None or not process_running(doc):
        fail("Tabby process is not running.", code=1)
        return
    click.echo("Tabby process is running.")
    if not doc.get("speakerRunning"):
        click.echo("\nThe BGP backend process (ExaBGP) is not running.")
        return
    rows = status_rows(doc, md5=md5_counters())
    click.echo("\nIPv4 BGP status")
    if rows:
        emit_table(None, COLUMNS, rows)
    else:
        click.echo("No IPv4 peers found.")
    click.echo("\nIPv6 BGP status\nNo IPv6 peers found.")


def load_status(path: Path) -> dict[str, Any] | None:
    """The status document, or None when there is none (agent never ran) or it is unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def process_running(doc: dict[str, Any], proc: Path = Path("/proc")) -> bool:
    """The agent wrote the file, has not stopped, and its PID is alive.

    An agent in a pod (the DaemonSet) has its own PID namespace: its PID is then
    looked up among the processes of that namespace, as seen from here.
    """
    if doc.get("stopped"):
        return False
    pid = doc.get("agentPid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    namespace = doc.get("pidNamespace")
    if isinstance(namespace, int) and namespace != _namespace_of(proc / "self"):
        return _runs_in_namespace(proc, namespace, pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _namespace_of(process: Path) -> int | None:
    try:
        return (process / "ns" / "pid").stat().st_ino
    except OSError:
        return None


def _runs_in_namespace(proc: Path, namespace: int, pid: int) -> bool:
    """Whether some process of PID namespace `namespace` has `pid` there (NSpid's last)."""
    for entry in proc.iterdir():
        if not entry.name.isdigit() or _namespace_of(entry) != namespace:
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == str(pid):
                return True
    return False


def status_rows(
    doc: dict[str, Any], now: float | None = None, md5: dict[str, int] | None = None
) -> list[list[str]]:
    """Table rows in calicoctl's column order, peers sorted by address."""
    peers = sorted(doc.get("peers") or [], key=_address_key)
    return [
        [
            str(p.get("address", "")),
            str(p.get("type", "")),
            str(p.get("state", "")),
            format_since(p.get("since"), now),
            peer_info(p, md5 or {}),
        ]
        for p in peers
    ]


MD5_COUNTERS = ("TCPMD5Failure", "TCPMD5NotFound", "TCPMD5Unexpected")


def peer_info(peer: dict[str, Any], md5: dict[str, int]) -> str:
    """INFO: BGP's own words, and for a session down with a password, the MD5 evidence."""
    info = str(peer.get("info", ""))
    key = peer.get("passwordKey")
    if not key or peer.get("state") == "up":
        return info
    failed = md5.get("TCPMD5Failure", 0) + md5.get("TCPMD5NotFound", 0)
    if failed:
        return (
            f"{info}, TCP MD5 password {key!r}: {failed} segments failed the MD5 check here"
            " (a wrong or missing password on one side)"
        )
    return f"{info}, TCP MD5 password {key!r}: no answer signed with it yet"


def md5_counters(path: Path = Path("/proc/net/netstat")) -> dict[str, int]:
    """The kernel's TCP MD5 counters of this network namespace ({} if unreadable)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return {name: int(table[name]) for name in MD5_COUNTERS if name in table}
    return {}


def format_since(timestamp: Any, now: float | None = None) -> str:
    """BIRD's style, as calicoctl shows it: a time today, a date before today."""
    if not isinstance(timestamp, int | float):
        return ""
    when = dt.datetime.fromtimestamp(timestamp)
    today = dt.datetime.fromtimestamp(now) if now is not None else dt.datetime.now()
    return when.strftime("%H:%M:%S") if when.date() == today.date() else when.strftime("%Y-%m-%d")


def status_data(doc: dict[str, Any] | None, path: Path) -> dict[str, Any]:
    """The -o json/yaml shape: running flags plus the document's peers, as written."""
    if doc is None:
        return {"running": False, "statusFile": str(path), "peers": []}
    return {
        "running": process_running(doc),
        "speakerRunning": bool(doc.get("speakerRunning")),
        "node": doc.get("node"),
        "routerId": doc.get("routerId"),
        "asNumber": doc.get("asNumber"),
        "statusFile": str(path),
        "tcpMd5": md5_counters(),
        "peers": sorted(doc.get("peers") or [], key=_address_key),
    }


def _address_key(peer: dict[str, Any]) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(peer.get("address", "")).split("."))
    except ValueError:
        return (1 << 16,)
